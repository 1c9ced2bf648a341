"""OpenAI's Responses API: POST /v1/responses (whole or streamed), GET and DELETE
/v1/responses/{id}. A stored response's conversation continues with ``previous_response_id``.

Tools left out of the prompt (hosted tools this server cannot run) are named, by type, in the
``X-Gateway-Dropped-Tools`` header (when the headers are still to be sent) and in the inference
event's ``dropped_tools``."""

from __future__ import annotations

import logging

from aiohttp import web

from .. import answer
from ..appkeys import CONFIG, REGISTRY, RESPONSES
from ..errors import ApiError
from ..events import PRINCIPAL, observation
from ..protocol import responses as wire
from ..protocol.params import apply_defaults, apply_effort
from ..response_store import ResponseStore, Stored
from .body import read_json_object
from .common import apply_limits, dropped_tools, event_stream, ignore_gone, load_progress

log = logging.getLogger(__name__)


def owner(request: web.Request) -> str | None:
    """Whose stored responses a request sees: its API key's (None where the server has no keys)."""
    return request.get(PRINCIPAL)


def _unknown(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(f"Response with id {response_id!r} not found.", status=404, param=param, code="not_found")


async def create(request: web.Request) -> web.StreamResponse:
    parsed = wire.parse(await read_json_object(request))
    store = request.app[RESPONSES]
    history: list[dict] = []
    if parsed.previous_response_id is not None:
        previous = store.get(parsed.previous_response_id, owner(request))
        if previous is None:
            raise _unknown(parsed.previous_response_id, "previous_response_id")
        history = previous.messages
        parsed.input_messages = wire.input_messages(parsed.raw_input, history)
    req = parsed.request
    req.messages = wire.conversation(parsed.instructions, history, parsed.input_messages)
    headers = dropped_tools(request, parsed.dropped)
    apply_limits(request, parsed)
    builder = wire.ResponseBuilder(parsed.model, parsed, wire.new_id("resp"))
    # failing before the answer began, in a stream a load's progress opened: the response's
    # first events, as OpenAI's clients expect, then its failure
    progress = load_progress(request, parsed.stream,
                             lambda err: [(e, e["type"]) for e in builder.start() + builder.fail(err)])
    async with request.app[REGISTRY].lease(parsed.model, on_progress=progress) as (spec, backend):
        obs = observation(request)
        obs.model = spec.name
        apply_defaults(parsed, spec.defaults)
        answer.prepare(req, spec.name, spec.reasoning, spec.tool_format, backend.info)
        apply_effort(req, parsed.reasoning_effort, spec.reasoning_budgets, req.reasoning)
        async with backend.generate(req) as gen:
            _, parser = await answer.start(gen, req, stream=parsed.stream)
            items = answer.pieces(gen, parser, obs)
            if parsed.stream:
                return await _stream(request, builder, gen, items, history, parsed, headers)
            async for item in items:
                if isinstance(item, answer.Finish):
                    _, body = builder.finish(item)
                    _keep(request, builder, body, history, parsed)
                    return web.json_response(body, headers=headers)
                builder.feed(item)
    raise ApiError("the model worker ended the answer without finishing it", status=500)


def _keep(request: web.Request, builder: wire.ResponseBuilder, body: dict, history: list[dict],
          parsed: wire.ResponsesParsed) -> None:
    if parsed.store:
        request.app[RESPONSES].put(builder.id, Stored(body, history + parsed.input_messages + builder.messages()),
                                   owner(request))


async def _stream(request: web.Request, builder: wire.ResponseBuilder, gen, items, history: list[dict],
                  parsed: wire.ResponsesParsed, headers: dict[str, str]) -> web.StreamResponse:
    sse = event_stream(request)
    if not sse.opened:  # a load's progress may have opened it already
        sse.response.headers.update(headers)
    await sse.open()
    gen.on_idle = sse.flush

    async def send(events: list[dict], hold: bool = False) -> None:
        for event in events:
            await sse.send(event, event=event["type"], hold=hold)

    try:
        await send(builder.start())
        async for item in items:
            if isinstance(item, answer.Finish):
                events, body = builder.finish(item)
                _keep(request, builder, body, history, parsed)
                await send(events)
            else:
                await send(builder.feed(item), hold=True)
    except ApiError as err:  # the model failed mid-answer: OpenAI's error event, then the failed response
        log.warning("stream %s ended by an error: %s", builder.id, err.message)
        await ignore_gone(send(builder.fail(err)))
    except ConnectionResetError:
        observation(request).disconnected = True
        return sse.response
    await ignore_gone(sse.close())
    return sse.response


async def retrieve(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = request.app[RESPONSES].get(response_id, owner(request))
    if stored is None:
        raise _unknown(response_id)
    return web.json_response(stored.body)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not request.app[RESPONSES].delete(response_id, owner(request)):
        raise _unknown(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


def setup(app: web.Application) -> None:
    app[RESPONSES] = ResponseStore(app[CONFIG].server.responses_store)
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
