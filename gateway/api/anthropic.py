"""Anthropic wire shape: /v1/messages and /v1/messages/count_tokens. A context overflow is told
in Anthropic's words on both (``protocol.anthropic.context_error``)."""

from __future__ import annotations

import json
import logging

from aiohttp import web

from .. import answer
from ..appkeys import CONFIG, REGISTRY
from ..errors import ApiError
from ..events import observation
from ..protocol import anthropic as anth
from ..protocol.params import Parsed, apply_defaults, apply_effort
from ..protocol.tools import anthropic_left_out
from .body import read_json_object
from .common import apply_limits, dropped_tools, event_stream, ignore_gone, load_progress

log = logging.getLogger(__name__)


async def _parse(request: web.Request, counting: bool = False) -> tuple[Parsed, dict[str, str]]:
    """The request, and the headers naming the tools left out of its prompt (Anthropic's own),
    which its inference event names too."""
    body = await read_json_object(request)
    parsed = anth.parse(body, counting=counting, keep_billing_header=request.app[CONFIG].server.keep_billing_header)
    return parsed, dropped_tools(request, anthropic_left_out(body))


async def messages(request: web.Request) -> web.StreamResponse:
    parsed, headers = await _parse(request)
    apply_limits(request, parsed)
    obs = observation(request)
    progress = load_progress(request, parsed.stream, lambda err: [(err.anthropic_body(), "error")])
    async with request.app[REGISTRY].lease(parsed.model, on_progress=progress) as (spec, backend):
        obs.model = spec.name
        apply_defaults(parsed, spec.defaults)
        render = anth.Renderer(spec.name, id=f"msg_{obs.request_id}")
        answer.prepare(parsed.request, spec.name, spec.reasoning, spec.tool_format, backend.info)
        apply_effort(parsed.request, parsed.reasoning_effort, spec.reasoning_budgets, parsed.request.reasoning)
        async with backend.generate(parsed.request) as gen:
            try:
                begun, parser = await answer.start(gen, parsed.request, stream=parsed.stream)
            except ApiError as err:
                raise anth.context_error(err) from None
            items = answer.pieces(gen, parser, obs)
            if parsed.stream:
                return await _stream(request, render, gen, items, begun.prompt_tokens, begun.cached_tokens, headers)
            blocks: list[dict] = []
            arguments: list[str] = []  # of the open tool_use block
            async for item in items:
                if isinstance(item, answer.Piece):
                    if not blocks or blocks[-1]["type"] != ("thinking" if item.kind == "thinking" else "text"):
                        blocks.append(render.block(item.kind))
                    blocks[-1]["thinking" if item.kind == "thinking" else "text"] += item.text
                elif isinstance(item, answer.Call):
                    _fill(blocks, arguments)
                    blocks.append(render.tool_block(item))
                elif isinstance(item, answer.CallArgs):
                    arguments.append(item.text)
                else:
                    _fill(blocks, arguments)
                    if not any(b["type"] in ("text", "tool_use") for b in blocks):
                        blocks.append(render.block("content"))
                    return web.json_response(render.message(blocks, item, item.prompt_tokens, item.cached_tokens),
                                             headers=headers)
    raise ApiError("the model worker ended the answer without finishing it", status=500)


def _fill(blocks: list[dict], arguments: list[str]) -> None:
    """Give the last tool_use block the input its arguments spell (a whole answer's calls come
    from ``answer.start(stream=False)``: their arguments parse as one JSON object)."""
    if arguments and blocks and blocks[-1]["type"] == "tool_use":
        blocks[-1]["input"] = json.loads("".join(arguments))
    arguments.clear()


async def _stream(request: web.Request, render: anth.Renderer, gen, items, prompt_tokens: int,
                  cached_tokens: int, headers: dict[str, str]) -> web.StreamResponse:
    sse = event_stream(request)
    if not sse.opened:  # a load's progress may have opened it already
        sse.response.headers.update(headers)
    await sse.open()
    gen.on_idle = sse.flush  # the deltas of events that arrived together go out in one write
    index, kind = -1, None  # the open content block

    async def close_block() -> None:
        if kind is not None:
            await sse.send({"type": "content_block_stop", "index": index}, event="content_block_stop")

    async def open_block(new_kind: str, block: dict | None = None) -> None:
        nonlocal index, kind
        await close_block()
        index, kind = index + 1, new_kind
        await sse.send({"type": "content_block_start", "index": index,
                        "content_block": block or render.block(new_kind)}, event="content_block_start")

    try:
        await sse.send({"type": "message_start", "message": render.message([], None, prompt_tokens, cached_tokens)},
                       event="message_start")
        await sse.send({"type": "ping"}, event="ping")
        async for item in items:
            if isinstance(item, answer.Piece):
                if kind != item.kind:
                    await open_block(item.kind)
                await sse.send({"type": "content_block_delta", "index": index, "delta": render.delta(item)},
                               event="content_block_delta", hold=True)
                continue
            if isinstance(item, answer.Call):
                await open_block("tool_use", render.tool_block(item))
                continue
            if isinstance(item, answer.CallArgs):
                await sse.send({"type": "content_block_delta", "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": item.text}},
                               event="content_block_delta", hold=True)
                continue
            if kind not in ("content", "tool_use"):
                await open_block("content")  # every answer ends in a text block, if empty, or a call
            await close_block()
            reason, seq = anth.stop_reason(item)
            await sse.send({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                            "usage": {"output_tokens": item.completion_tokens}}, event="message_delta")
            await sse.send({"type": "message_stop"}, event="message_stop")
    except ApiError as err:  # the worker failed mid-answer: Anthropic's in-band error event
        log.warning("stream %s ended by an error: %s", render.id, err.message)
        await ignore_gone(sse.send(err.anthropic_body(), event="error"))
    except ConnectionResetError:
        log.info("client disconnected from stream %s", render.id)
        observation(request).disconnected = True
        return sse.response
    await ignore_gone(sse.close())
    return sse.response


async def count_tokens(request: web.Request) -> web.Response:
    parsed, headers = await _parse(request, counting=True)
    async with request.app[REGISTRY].lease(parsed.model) as (spec, backend):
        observation(request).model = spec.name
        answer.prepare(parsed.request, spec.name, spec.reasoning, spec.tool_format, backend.info)
        try:
            reply = await backend.tokenize(parsed.request.to_dict())
        except ApiError as err:
            raise anth.context_error(err) from None
    return web.json_response({"input_tokens": len(reply.tokens)}, headers=headers)


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
