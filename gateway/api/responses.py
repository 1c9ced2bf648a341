"""OpenAI's Responses API: POST /v1/responses (whole or streamed), GET and DELETE
/v1/responses/{id}; the Responses WebSocket on GET /v1/responses is ``responses_socket``'s.
A stored response's conversation continues with ``previous_response_id``.

Tools left out of the prompt (hosted tools this server cannot run) are named, by type, in the
``X-Gateway-Dropped-Tools`` header (when the headers are still to be sent) and in the inference
event's ``dropped_tools``."""

from __future__ import annotations

from aiohttp import web

from ..base.errors import ApiError, shown
from ..server.events import OWNER
from ..server.response_store import ResponseStore, Stored
from ..wire import responses as wire
from ..wire.media import unmarked
from . import pipeline, responses_socket
from .access import spends
from .appkeys import CONFIG, RESPONSES, SEAL_KEY
from .body import read_json_object


def owner(request: web.Request) -> str | None:
    """Whose stored responses a request sees: its API key's, by the key itself (``events.OWNER``),
    not by its name or place in the list; None where the server has no keys."""
    return request.get(OWNER)


def unknown(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(f"Response with id {shown(response_id, 100)} not found.", status=404, param=param,
                    code="not_found")


@spends("responses")
async def create(request: web.Request) -> web.StreamResponse:
    key = request.app[SEAL_KEY].get()  # encrypted_content's: made in the state folder on first use
    parsed = wire.parse(await read_json_object(request), key)
    store = request.app[RESPONSES]
    history: list[dict] = []
    if parsed.previous_response_id is not None:
        previous = store.get(parsed.previous_response_id, owner(request))
        if previous is None:
            raise unknown(parsed.previous_response_id, "previous_response_id")
        history = previous.messages
        parsed.input_messages = wire.input_messages(parsed.raw_input, history, parsed.request.media, key)
        # an approval answers a request the previous response made: its server, tool and arguments
        parsed.approvals = wire.approvals(parsed.raw_input, previous.body.get("output"))
    parsed.request.messages = wire.conversation(parsed.instructions, history, parsed.input_messages)

    builder = wire.ResponseBuilder(parsed.model, parsed)

    def kept() -> None:
        if parsed.store:
            # a picture is not kept: a later turn reads its place as a note (``media.unmarked``)
            store.put(builder.id, Stored(builder.body(), unmarked(history + parsed.input_messages)
                                         + builder.messages()), owner(request))

    return await pipeline.answer(request, parsed, lambda _ctx: builder,
                                 kept=kept)


async def retrieve(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = request.app[RESPONSES].get(response_id, owner(request))
    if stored is None:
        raise unknown(response_id)
    return web.json_response(stored.body)


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not request.app[RESPONSES].delete(response_id, owner(request)):
        raise unknown(response_id)
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


def setup(app: web.Application) -> None:
    app[RESPONSES] = ResponseStore(app[CONFIG].server.responses_store)
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses", responses_socket.connect)  # the Responses WebSocket: create's, per event
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
