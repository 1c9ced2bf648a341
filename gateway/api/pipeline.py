"""The path of a generating request, whatever its wire shape (ARCHITECTURE.md, "A request's
path", from step 3's limits to step 6), written once: the server's limits, the lease, the
model's defaults, each request prepared by the model's formats (settled at its load, read by
``answer.prepare``) and reasoning budget, the generation, its first event (``answer.start``)
and its pieces (``answer.pieces``).

Whole and streamed answers take the same path up to the pieces: ``collect`` folds them into a
whole answer, ``stream`` writes them as they come and is the one place where a stream ends,
after an error once it began included. A wire passes in only what is its own: how a failure
is told in its stream (``Failure``), what it writes, how it folds a whole answer."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..backends.local import Backend, GenerationEvents
from ..base.errors import ApiError
from ..models.config import ModelSpec
from ..protocol import GenerationRequest, Start
from ..server.events import Tally, observation
from ..server.sse import EventStream
from ..serving.registry import picked_adapter
from ..serving.supervisor import Progress
from ..wire import answer, fim
from ..wire import media as wire_media
from ..wire.params import Parsed, apply_defaults, apply_effort
from . import common, media
from .appkeys import REGISTRY
from .common import apply_limits, event_stream

log = logging.getLogger(__name__)

# how a wire tells a failure in a stream already open: its messages, each with its SSE event
# name (None: a plain ``data:`` frame), as ``EventStream.failure`` holds it
Failure = Callable[[ApiError], list[tuple[dict[str, Any], str | None]]]


@dataclass
class Run:
    """One generation the backend accepted: its events, its start event (prompt tokens, the
    prompt's text for echo, ...), and its pieces and calls, then its finish, as ``answer.pieces``
    reads them; ``tally``, its tokens as its request's observation counts them."""

    gen: GenerationEvents
    begun: Start
    items: AsyncGenerator[answer.Item | answer.Finish, None]
    tally: Tally


def load_progress(request: web.Request, stream: bool, failure: Failure) -> Progress | None:
    """For a streamed request: what tells its client how the load it waits for goes, as SSE
    comment lines (``: loading 43%``, which OpenAI's and Anthropic's clients skip). That opens
    the stream with status 200, so from then on a failure is told in-band, as ``failure`` says
    (``app.errors_middleware``)."""
    if not stream:
        return None

    async def tell(fraction: float) -> None:
        sse = event_stream(request)
        if not sse.opened:
            sse.failure = failure
            await sse.open()
        await sse.comment(f"loading {int(fraction * 100)}%")

    return tell


@asynccontextmanager
async def lease(request: web.Request, parsed: Parsed, *, thinking: bool = True, failure: Failure | None = None,
                on_lease: Callable[[ModelSpec, Backend], None] | None = None
                ) -> AsyncIterator[tuple[ModelSpec, Backend]]:
    """The model ``parsed`` names, held for the ``async with``, each of its requests prepared.

    In order: the server's limits (``apply_limits``, before any wait); the request's pictures and
    sounds made ready (``media.ready``: fetched, decoded, checked); the lease, which tells a
    streamed request's client how a load goes where its wire gives the ``failure`` to tell in
    that stream (``load_progress``; without one, the client waits in silence); ``on_lease``, a
    wire's own note on the model; a suffix (fill in the middle) refused on a model that cannot
    fill; media of a kind the model does not take refused, or a tool's picture told as its note
    (``wire.media.require``); the model's defaults; each request's formats (``answer.prepare``,
    by those the model's load settled: thinking split out where ``thinking``, else not) and
    reasoning budget."""
    apply_limits(request, parsed)
    await media.ready(request, parsed)
    progress = load_progress(request, parsed.stream, failure) if failure is not None else None
    observation(request).request = parsed.request
    name = parsed.model
    if (picked := picked_adapter(request.app[REGISTRY], name)) is not None:  # BASE:ADAPTER: the base, that adapter on
        name = picked[0].name
        for req in parsed.requests:
            req.adapter = picked[1]
    async with common.lease(request, name, on_progress=progress) as (spec, backend):
        if on_lease is not None:
            on_lease(spec, backend)
        if parsed.request.suffix is not None:
            fim.require_fim(backend.info, spec.name, parsed.request.suffix_param)
        for req in parsed.requests:
            wire_media.require(req, backend.info, spec.name)
        apply_defaults(parsed, spec.defaults)
        for req in parsed.requests:
            answer.prepare(req, spec.name, backend.info, thinking=thinking)
            apply_effort(req, parsed.reasoning_effort, spec.reasoning_budgets, req.reasoning)
        yield spec, backend


async def start(request: web.Request, gen: GenerationEvents, req: GenerationRequest, *, stream: bool,
                refused: Callable[[ApiError], ApiError] | None = None) -> Run:
    """``gen`` (the generation of ``req``) once the backend accepted it. A refusal raises its
    error, before anything of the answer is written, so it is still a plain error response;
    ``refused`` puts it in the wire's own words. ``stream=False``: each call is given whole,
    once its arguments parse (``answer.start``)."""
    try:
        begun, parser = await answer.start(gen, req, stream=stream)
    except ApiError as err:
        if refused is None:
            raise
        raise refused(err) from None
    tally = observation(request).began(begun)  # its prompt counted from here
    return Run(gen, begun, answer.pieces(gen, parser, tally), tally)


def left(request: web.Request, gen: GenerationEvents, run: Run | None) -> None:
    """``gen`` (``run``'s, or one never started) is left, at its end or before it: what it
    generated that was not read is counted in the request's observation too (``answer.left``),
    so the access middleware charges it however the request ended."""
    answer.left(gen, observation(request), run.tally if run is not None else None)


@asynccontextmanager
async def generate(request: web.Request, backend: Backend, req: GenerationRequest, *, stream: bool,
                   refused: Callable[[ApiError], ApiError] | None = None) -> AsyncIterator[Run]:
    """``req`` generated and started (``start``) for the ``async with``; leaving it before the
    answer's end (an error, a client gone) cancels the rest, and what it generated is counted
    (``left``)."""
    async with backend.generate(req) as gen:
        run = None
        try:
            run = await start(request, gen, req, stream=stream, refused=refused)
            yield run
        finally:
            left(request, gen, run)


@asynccontextmanager
async def run(request: web.Request, parsed: Parsed, *, thinking: bool = True, failure: Failure | None = None,
              on_lease: Callable[[ModelSpec, Backend], None] | None = None, whole_calls: bool = False,
              refused: Callable[[ApiError], ApiError] | None = None) -> AsyncIterator[tuple[ModelSpec, Run]]:
    """``lease`` then ``generate`` for a request of one prompt (every wire's but OpenAI's,
    whose batches of prompts use the two steps). ``whole_calls``: calls given whole even in a
    stream (Ollama's way)."""
    async with lease(request, parsed, thinking=thinking, failure=failure, on_lease=on_lease) as (spec, backend):
        async with generate(request, backend, parsed.request, stream=parsed.stream and not whole_calls,
                            refused=refused) as started:
            yield spec, started


async def collect(started: Run, feed: Callable[[answer.Item], object]) -> answer.Finish:
    """A whole answer: each piece and call given to the wire's ``feed`` in order; returns the
    finish. An answer that ends without one is the worker's fault (500)."""
    items = started.items
    try:
        async for item in items:
            if isinstance(item, answer.Finish):
                return item
            feed(item)
    finally:
        # closed here, not when it is collected: a suspended generator left to the garbage
        # collector is closed by asyncio's finalizer hook, a wake-up of the loop and a task
        await items.aclose()
    raise ApiError("the model worker ended the answer without finishing it", status=500)


@dataclass
class Whole:
    """A whole answer's pieces and calls gathered: its text of each kind, its calls (each
    ``{"id", "name", "arguments"}``, the arguments as JSON text) and, where ``logprobs`` starts
    as a list, the log-probabilities its pieces carried. ``feed`` is ``collect``'s."""

    text: dict[str, list[str]] = field(default_factory=lambda: {"content": [], "thinking": []})
    calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None

    def feed(self, item: answer.Item) -> None:
        if isinstance(item, answer.Piece):
            self.text[item.kind].append(item.text)
            if self.logprobs is not None and item.logprobs:
                self.logprobs += item.logprobs
        elif isinstance(item, answer.Call):
            self.calls.append({"id": item.id, "name": item.name, "arguments": ""})
        else:  # the open call's arguments go on
            self.calls[-1]["arguments"] += item.text

    @property
    def content(self) -> str:
        return "".join(self.text["content"])

    @property
    def thinking(self) -> str:
        return "".join(self.text["thinking"])


async def stream(request: web.Request, out: EventStream, gens: Sequence[GenerationEvents],
                 write: Callable[[EventStream], Awaitable[None]], failure: Failure, *, name: str,
                 headers: dict[str, str] | None = None, done: str | None = None) -> web.StreamResponse:
    """A streamed answer, from ``out``'s opening (with ``headers``, unless a load's progress
    opened it already) through the wire's ``write(out)`` to the stream's end: ``done``, a last
    data frame every stream ends with where the wire has one (OpenAI's ``[DONE]``), then the
    close. ``gens``: the generations ``write`` reads, whose events that arrive together go out
    in one write.

    The one place where a stream's failure is written: an error once the stream began can no
    longer be a status, so it is told in-band as the wire's ``failure`` says and the stream
    ends. A client that went away is noted, and nothing more is written; the caller's leaving
    its generations cancels the work. ``name``: the stream, in the log."""
    if not out.opened:
        out.response.headers.update(headers or {})
    common.tapped(request, out)
    await out.open()
    for gen in gens:
        gen.on_idle = out.flush
    try:
        await write(out)
    except ApiError as err:
        log.warning("stream %s ended by an error: %s", name, err.message)
        for data, event in failure(err):
            await ignore_gone(out.send(data, event=event))
    except ConnectionResetError:
        log.info("client disconnected from stream %s", name)
        observation(request).disconnected = True
        return out.response
    if done is not None:
        await ignore_gone(out.send(done))
    await ignore_gone(out.close())
    return out.response


async def ignore_gone(write: Awaitable[object]) -> None:
    """A last write to a client that has just gone away: nothing left to tell it."""
    try:
        await write
    except ConnectionResetError:
        pass
