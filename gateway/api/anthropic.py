"""Anthropic wire shape: /v1/messages and /v1/messages/count_tokens. A context overflow is told
in Anthropic's words on both (``wire.anthropic.context_error``); the answer is
``wire.anthropic_answer.Writer``'s."""

from __future__ import annotations

from functools import partial

from aiohttp import web

from ..base.errors import ApiError
from ..wire import anthropic as anth
from ..wire import anthropic_answer
from . import pipeline
from .access import spends
from .appkeys import CONFIG
from .body import read_json_object


async def _parse(request: web.Request, counting: bool = False) -> anth.Parsed:
    body = await read_json_object(request)
    return anth.parse(body, counting=counting, keep_billing_header=request.app[CONFIG].server.keep_billing_header)


@spends("messages")
async def messages(request: web.Request) -> web.StreamResponse:
    parsed = await _parse(request)
    return await pipeline.answer(request, parsed, partial(anthropic_answer.Writer, parsed), refused=anth.context_error)


async def count_tokens(request: web.Request) -> web.Response:
    parsed = await _parse(request, counting=True)
    try:
        reply, headers = await pipeline.unrun(request, parsed, lambda backend, req: backend.tokenize(req))
    except ApiError as err:
        raise anth.context_error(err) from None
    return web.json_response({"input_tokens": len(reply.tokens)}, headers=headers)


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
