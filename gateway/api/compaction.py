"""OpenAI's Responses API's two calls that answer about a conversation rather than continue it:
``POST /v1/responses/compact`` (``client.responses.compact``) and ``POST
/v1/responses/input_tokens`` (``client.responses.input_tokens.count``). Both read a request as
``/v1/responses`` does (``wire.responses.parse``: ``input`` or ``previous_response_id``,
``instructions``, tools), a stored conversation under the caller's key alone.

``input_tokens`` is the twin of Anthropic's ``count_tokens``: the prompt prepared for its model
as a generation's would be, tokenized in the model's worker (``pipeline.unrun``), nothing
generated; so it equals a response's ``usage.input_tokens`` for the same request.

``compact`` is a request like any other (``spends("responses")``: keys, limits, captures,
events; the model held through ``pipeline.prepared``): the model writes the summary. The
conversation (``wire.responses.compaction.transcript``) is cut into parts that fit the model's
context with room for the summary, each summarised, then their summaries summarised, at most
``MAX_ROUNDS`` rounds (the last reads the latest summaries that fit, should more be left) and
``MAX_PARTS`` summaries in all (a history that needs more is a 400 naming ``input``). The bytes
a token holds are measured on the start of the conversation; a part the model refuses as too
long after all (a history denser in tokens further on: prose, then code or another script) is
measured on itself and cut again by that, at most ``RECUTS`` times (its refusals, which write
nothing, are not summaries), and past that is a 400 naming ``input``.

Every summary is written in full or the compact fails: one cut short by ``server.request_timeout``
(the lease's deadline, shared by all its summaries) is a 504, and an empty one a 500, never a
``compaction`` item that silently holds less than the conversation (the caller drops the history
it replaces)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..backends.local import Backend
from ..base.errors import ApiError, InvalidRequest
from ..models.config import ModelSpec
from ..protocol import GenerationRequest
from ..server.response_store import Stored
from ..wire import responses as wire
from ..wire.context import Context
from ..wire.media import unmarked
from ..wire.params import Parsed
from ..wire.prepare import prepare
from ..wire.responses import compaction
from . import pipeline
from .access import spends
from .appkeys import RESPONSES, SEAL_KEY
from .body import read_json_object
from .generation import left, read, start
from .responses import owner, unknown

MAX_ROUNDS = 3  # summaries of summaries: a part's summary is at most a quarter of the context
MAX_PARTS = 32  # summaries written for one compact, all rounds together
MAX_SUMMARY_TOKENS = 1024
MARGIN = 16  # tokens left over for a part whose estimate was low
RECUTS = 2  # a refused part measured on itself and cut again, at most this deep


async def _conversation(request: web.Request, key: bytes) -> tuple[wire.ResponsesParsed, list[dict[str, Any]]]:
    """The request read as ``/v1/responses`` reads it, and the stored conversation its
    ``previous_response_id`` continues (its key's own: another key's is a 404); with one,
    ``input`` may be left out."""
    body = await read_json_object(request)
    parsed = wire.parse(body, key)
    history: list[dict[str, Any]] = []
    if parsed.previous_response_id is not None:
        previous: Stored | None = request.app[RESPONSES].get(parsed.previous_response_id, owner(request))
        if previous is None:
            raise unknown(parsed.previous_response_id, "previous_response_id")
        history = previous.messages
        if parsed.raw_input is not None:
            parsed.input_messages = wire.input_messages(parsed.raw_input, history, parsed.request.media, key)
    parsed.request.messages = wire.conversation(parsed.instructions, history, parsed.input_messages)
    return parsed, history


async def input_tokens(request: web.Request) -> web.Response:
    parsed, _ = await _conversation(request, request.app[SEAL_KEY].get())
    reply, headers = await pipeline.unrun(request, parsed, lambda backend, req: backend.tokenize(req))
    return web.json_response({"object": "response.input_tokens", "input_tokens": len(reply.tokens)}, headers=headers)


@dataclass
class _Summariser:
    """The summaries of one compact, on the model ``pipeline.prepared`` holds for it."""

    ctx: Context
    spec: ModelSpec
    backend: Backend
    first: GenerationRequest  # the lease's: its deadline and cache scope go to each summary's
    written: int = 0
    room_tokens: int = 0  # a part's room, once ``summary`` measured it
    usage: dict[str, int] = field(default_factory=lambda: {"input": 0, "cached": 0, "output": 0})

    def _ready(self, text: str, max_tokens: int) -> Parsed:
        parsed = Parsed(self.spec.name, compaction.summary_request(text, max_tokens))
        parsed.request.deadline, parsed.request.cache_scope = self.first.deadline, self.first.cache_scope
        prepare(parsed, self.spec, self.backend.info)
        return parsed

    async def room(self, max_tokens: int) -> int:
        """The tokens a part may take: the context less the summary and the summariser's prompt."""
        empty = self._ready("", max_tokens)
        overhead = len((await self.backend.tokenize(empty.request.to_dict())).tokens)
        return int(self.backend.info.get("n_ctx") or 0) - max_tokens - overhead - MARGIN

    async def bytes_per_token(self, text: str, room: int) -> float:
        """How many bytes of ``text`` a token holds, measured on its start (a sample no longer
        than the context in bytes, which the worker tokenizes without a scan)."""
        sample = text.encode()[:max(room, 1)].decode("utf-8", "ignore")
        reply = await self.backend.tokenize({**self._ready("", 1).request.to_dict(), "messages": None,
                                             "prompt": sample})
        return max(0.25, len(sample.encode()) / max(1, len(reply.tokens)))

    def _too_many(self, more: int) -> InvalidRequest:
        return InvalidRequest(f"this history needs at least {self.written + more} summaries to compact on this "
                              f"model, more than {MAX_PARTS}; compact it in steps, or with a model of a longer "
                              "context", "input", "context_length_exceeded")

    def _in_time(self) -> None:
        """A 504 once the lease's deadline (``server.request_timeout``) has passed: a summary the
        deadline cut short is not a summary of its part."""
        deadline = self.first.deadline
        if deadline is not None and time.time() >= deadline:
            raise ApiError(f"compacting on model {self.spec.name!r} ran past server.request_timeout before every "
                           "summary was written: nothing was compacted; compact in steps, or on a faster model",
                           status=504, code="timeout")

    async def one(self, text: str, max_tokens: int, recuts: int = RECUTS) -> str:
        """``text``'s summary; a part the model refuses as past its context, measured on itself
        and cut again (``recuts`` deep). A summary cut short by the deadline is a 504, an empty
        one a 500 (``summary``'s contract)."""
        if self.written >= MAX_PARTS:
            raise self._too_many(1)
        self._in_time()
        self.written += 1
        req = self._ready(text, max_tokens).request
        obs = self.ctx.observation
        out = compaction.Collector(self.spec.name)
        async with self.backend.generate(req) as gen:
            run = None
            try:
                run = await start(obs, gen, req, stream=False)
                finish = await read(obs, run, out, None)
            except ApiError as err:
                if err.code != "context_length_exceeded":
                    raise
                refused = True
            else:
                refused = False
            finally:
                left(obs, gen, run)
        if refused:  # refused before a token was written: not a summary
            self.written -= 1
            return await self._recut(text, max_tokens, recuts)
        self.usage["input"] += finish.prompt_tokens
        self.usage["cached"] += finish.cached_tokens
        self.usage["output"] += finish.completion_tokens
        if finish.reason == "length":
            self._in_time()
        written = out.text()
        if not written:
            raise ApiError(f"model {self.spec.name!r} wrote an empty summary: nothing was compacted", status=500,
                           code="empty_summary")
        return written

    async def _recut(self, text: str, max_tokens: int, recuts: int) -> str:
        """The summary of a part the model refused as too long: cut by its own bytes per token
        (at least in two), each piece summarised; a 400 naming ``input`` once ``recuts`` is spent."""
        if not recuts:
            raise InvalidRequest("a part of this history holds far more tokens than its bytes suggest and would not "
                                 f"fit model {self.spec.name!r}'s context, even measured and cut {RECUTS} times; "
                                 "compact it in steps, or with a model of a longer context", "input",
                                 "context_length_exceeded")
        size = int(self.room_tokens * await self.bytes_per_token(text, self.room_tokens) * 0.9)
        pieces = compaction.parts(text, max(1, min(size, len(text.encode()) // 2 + 1)), compaction.CONTINUED)
        if len(pieces) > MAX_PARTS - self.written:
            raise self._too_many(len(pieces))
        return "\n".join([await self.one(p, max_tokens, recuts - 1) for p in pieces])

    async def summary(self, text: str) -> str:
        n_ctx = int(self.backend.info.get("n_ctx") or 0)
        max_tokens = max(16, min(MAX_SUMMARY_TOKENS, n_ctx // 4))
        room = await self.room(max_tokens)
        if room < 32:
            raise InvalidRequest(f"model {self.spec.name!r}'s context ({n_ctx} tokens) leaves no room to summarise "
                                 "a conversation", "model")
        self.room_tokens = room
        size = int(room * await self.bytes_per_token(text, room) * 0.9)
        for round_ in range(MAX_ROUNDS):
            last = round_ == MAX_ROUNDS - 1
            # a body's worth of history may cut into a million parts: off the event loop
            pieces = await asyncio.to_thread(compaction.parts, text, size, compaction.CONTINUED)
            if last and len(pieces) > 1:
                pieces = pieces[-1:]  # the last round: the latest summaries, which fit
            if len(pieces) > MAX_PARTS - self.written:
                raise self._too_many(len(pieces))
            summaries = [await self.one(p, max_tokens) for p in pieces]
            if len(summaries) == 1:
                return summaries[0]
            text = "\n\n".join(f"Part {i + 1}:\n{s}" for i, s in enumerate(summaries))
        raise AssertionError("unreachable: the last round summarises one part")


@spends("responses")
async def compact(request: web.Request) -> web.Response:
    key = request.app[SEAL_KEY].get()
    parsed, history = await _conversation(request, key)
    messages = unmarked(history + parsed.input_messages)
    ctx = pipeline.context(request)
    server = ctx.server
    if not messages:
        raise compaction.nothing()
    if len(messages) > server.max_messages:
        raise InvalidRequest(f"`input` holds {len(messages)} messages; this server takes at most "
                             f"{server.max_messages} (server.max_messages)", "input")
    text = await asyncio.to_thread(compaction.transcript, messages)
    if not text.strip():
        raise compaction.nothing()
    # the lease's request: the summariser's, without the conversation's media (nothing is fetched)
    lease = Parsed(parsed.model, compaction.summary_request("", 1))
    async with pipeline.prepared(request, ctx, lease) as (spec, backend):
        summariser = _Summariser(ctx, spec, backend, lease.request)
        summary = await summariser.summary(text)
    return web.json_response(compaction.compacted(compaction.kept(messages), summary, key, summariser.usage))


def setup(app: web.Application) -> None:
    """The two routes, beside ``responses.setup``'s (they take no ``{response_id}``)."""
    app.router.add_post("/v1/responses/compact", compact)
    app.router.add_post("/v1/responses/input_tokens", input_tokens)
