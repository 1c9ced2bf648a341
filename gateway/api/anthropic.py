"""Anthropic wire shape: /v1/messages and /v1/messages/count_tokens. A context overflow is told
in Anthropic's words on both (``protocol.anthropic.context_error``)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..base.errors import ApiError
from ..server.events import observation
from ..server.sse import EventStream
from ..wire import answer
from ..wire import anthropic as anth
from ..wire import media as wire_media
from ..wire.params import Parsed
from ..wire.tools import anthropic_left_out
from . import media, pipeline
from .access import spends
from .appkeys import CONFIG, REGISTRY
from .body import read_json_object
from .common import dropped_tools, event_stream


async def _parse(request: web.Request, counting: bool = False) -> tuple[Parsed, dict[str, str]]:
    """The request, and the headers naming the tools left out of its prompt (Anthropic's own),
    which its inference event names too."""
    body = await read_json_object(request)
    parsed = anth.parse(body, counting=counting, keep_billing_header=request.app[CONFIG].server.keep_billing_header)
    return parsed, dropped_tools(request, anthropic_left_out(body))


def _told(err: ApiError) -> list[tuple[dict[str, Any], str | None]]:
    """A failure in an Anthropic stream: its ``error`` event."""
    return [(err.anthropic_body(), "error")]


@spends("messages")
async def messages(request: web.Request) -> web.StreamResponse:
    parsed, headers = await _parse(request)
    async with pipeline.run(request, parsed, failure=_told, refused=anth.context_error) as (spec, run):
        render = anth.Renderer(spec.name, id=f"msg_{observation(request).request_id}")
        if parsed.stream:
            return await _stream(request, render, run, headers)
        blocks: list[dict] = []
        arguments: list[str] = []  # of the open tool_use block

        def feed(item: answer.Item) -> None:
            if isinstance(item, answer.Piece):
                if not blocks or blocks[-1]["type"] != ("thinking" if item.kind == "thinking" else "text"):
                    _fill(blocks, arguments)  # a call's input before the text that follows it
                    blocks.append(render.block(item.kind))
                blocks[-1]["thinking" if item.kind == "thinking" else "text"] += item.text
            elif isinstance(item, answer.Call):
                _fill(blocks, arguments)
                blocks.append(render.tool_block(item))
            else:
                arguments.append(item.text)

        finish = await pipeline.collect(run, feed)
        _fill(blocks, arguments)
        if not any(b["type"] in ("text", "tool_use") for b in blocks):
            blocks.append(render.block("content"))
        return web.json_response(render.message(blocks, finish, finish.prompt_tokens, finish.cached_tokens),
                                 headers=headers)


def _fill(blocks: list[dict], arguments: list[str]) -> None:
    """Give the last tool_use block the input its arguments spell (a whole answer's calls come
    from ``answer.start(stream=False)``: their arguments parse as one JSON object)."""
    if arguments and blocks and blocks[-1]["type"] == "tool_use":
        blocks[-1]["input"] = json.loads("".join(arguments))
    arguments.clear()


async def _stream(request: web.Request, render: anth.Renderer, run: pipeline.Run,
                  headers: dict[str, str]) -> web.StreamResponse:
    async def write(sse: EventStream) -> None:
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

        begun = run.begun
        await sse.send({"type": "message_start",
                        "message": render.message([], None, begun.prompt_tokens, begun.cached_tokens)},
                       event="message_start")
        await sse.send({"type": "ping"}, event="ping")
        async for item in run.items:
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

    return await pipeline.stream(request, event_stream(request), [run.gen], write, _told, name=render.id,
                                 headers=headers)


async def count_tokens(request: web.Request) -> web.Response:
    parsed, headers = await _parse(request, counting=True)
    await media.ready(request, parsed)
    async with request.app[REGISTRY].lease(parsed.model) as (spec, backend):
        observation(request).model = spec.name
        wire_media.require(parsed.request, backend.info, spec.name)
        answer.prepare(parsed.request, spec.name, backend.info)
        try:
            reply = await backend.tokenize(parsed.request.to_dict())
        except ApiError as err:
            raise anth.context_error(err) from None
    return web.json_response({"input_tokens": len(reply.tokens)}, headers=headers)


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
