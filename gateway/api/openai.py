"""OpenAI wire shape: /v1/models, /v1/chat/completions, /v1/completions."""

from __future__ import annotations

import json
import logging
from typing import Any, AsyncIterator

from aiohttp import web

from ..app import REGISTRY
from ..engine.client import Generation
from ..errors import ApiError, InvalidRequest
from ..protocol import openai as oai
from ..sse import EventStream

log = logging.getLogger(__name__)


async def list_models(request: web.Request) -> web.Response:
    data = []
    for spec in request.app[REGISTRY].specs():
        try:
            created = int(spec.path.stat().st_mtime)
        except OSError:
            created = 0
        data.append({"id": spec.name, "object": "model", "created": created, "owned_by": "local"})
    return web.json_response({"object": "list", "data": data})


async def read_json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"The request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object", code="invalid_json")
    return body


def _error_from(event: dict[str, Any]) -> ApiError:
    return ApiError(event["message"], status=event.get("status", 500), param=event.get("param"),
                    code=event.get("code"))


async def answer_events(gen: Generation) -> AsyncIterator[dict[str, Any]]:
    """The worker's text and done events after ``start``; an error event raises ``ApiError``."""
    async for event in gen:
        if event["ev"] == "error":
            raise _error_from(event)
        yield event


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, oai.parse_chat(await read_json_object(request)), "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, oai.parse_completion(await read_json_object(request)), "completion")


async def _complete(request: web.Request, parsed: oai.Parsed, kind: str) -> web.StreamResponse:
    async with request.app[REGISTRY].lease(parsed.model) as (spec, worker):
        oai.apply_defaults(parsed, spec.defaults)
        return await _run(request, parsed, kind, spec.name, worker)


async def _run(request: web.Request, parsed: oai.Parsed, kind: str, model: str, worker) -> web.StreamResponse:
    render = oai.Renderer(kind, model)
    async with worker.generate(parsed.request) as gen:
        start = await gen.next()
        if start["ev"] == "error":  # refused before any token: a plain error response
            raise _error_from(start)
        if parsed.stream:
            return await _stream(request, render, gen, parsed.include_usage)
        text: list[str] = []
        async for event in answer_events(gen):
            if event["ev"] == "text":
                text.append(event["text"])
            else:
                return web.json_response(render.whole("".join(text), event["finish_reason"],
                                                      event["prompt_tokens"], event["completion_tokens"]))
    raise ApiError("the model worker ended the answer without finishing it", status=500)


async def _stream(request: web.Request, render: oai.Renderer, gen: Generation, include_usage: bool):
    sse = EventStream(request)
    await sse.open()
    try:
        if (first := render.first_chunk()) is not None:
            await sse.send(first)
        async for event in answer_events(gen):
            if event["ev"] == "text":
                await sse.send(render.delta_chunk(event["text"]))
            else:
                await sse.send(render.final_chunk(event["finish_reason"]))
                if include_usage:
                    await sse.send(render.usage_chunk(event["prompt_tokens"], event["completion_tokens"]))
    except ApiError as err:  # the worker failed mid-answer: say so in-band, then end the stream
        log.warning("stream %s ended by an error: %s", render.id, err.message)
        await sse.send(render.final_chunk("error"))
        await sse.send(err.openai_body())
    except ConnectionResetError:  # the client went away; leaving the `async with` cancels the work
        log.info("client disconnected from stream %s", render.id)
        return sse.response
    await sse.send("[DONE]")
    return await sse.close()


def setup(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
