"""The path of a generating request, whatever its wire shape (ARCHITECTURE.md, "A request's
path", from step 4's limits to step 6), written once: ``answer`` takes a parsed request and
the wire's writer (``wire.writer.Writer``) and does the rest.

In order: the request's context for the wire (``context``); the model held and the request
made ready for it (``prepared``: the server's limits, its media, the lease, one preparation
step); each generation started (a refusal is still a plain error response, in the wire's own
words where the handler gives ``refused``) and read (``wire.answer.Reader``), its tokens counted
into the request's observation here, and its pieces handed to the writer; then the writer's
whole body, or its frames streamed as they come (``stream``: the one place where a stream ends,
after an error once it began included). However a generation is left (the answer's end, an
error, a client gone), what it generated is counted (``generation.left``). A request that asked for
tools the gateway runs itself is answered in rounds (``toolloop``)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aiohttp import web

from .. import protocol
from ..backends.local import Backend, GenerationEvents
from ..base.errors import ApiError, InvalidRequest
from ..models.config import ModelSpec
from ..server.events import OWNER, observation
from ..server.sse import EventStream, LineStream
from ..tools.toolbox import Toolbox
from ..wire.context import Context
from ..wire.params import Parsed
from ..wire.prepare import admit, prepare
from ..wire.writer import Writer
from . import common, media, toolloop
from .access import KEY, is_admin
from .appkeys import CONFIG, REGISTRY, TOOLS
from .common import event_stream
from .generation import Run, left, read, send, start

log = logging.getLogger(__name__)
R = TypeVar("R")


def context(request: web.Request) -> Context:
    """What the wire layer may know of ``request`` (``wire.context.Context``)."""
    obs = observation(request)
    return Context(obs.request_id, request.get(OWNER), is_admin(request), request.app[CONFIG].server, obs)


def _progress(request: web.Request, out: Writer) -> Callable[[float], Awaitable[None]]:
    """What tells a streamed request's client how the load it waits for goes, as SSE comment
    lines (``: loading 43%``, which OpenAI's and Anthropic's clients skip). That opens the
    stream with status 200, so from then on a failure is told in-band, in the writer's words
    (``app.failed_response``)."""

    async def tell(fraction: float) -> None:
        sse = event_stream(request)
        if not sse.opened:
            sse.failure = out.fail
            await sse.open()
        await sse.comment(f"loading {int(fraction * 100)}%")

    return tell


@asynccontextmanager
async def prepared(request: web.Request, ctx: Context, parsed: Parsed, *, thinking: bool = True,
                   out: Writer | None = None, **kinds: bool | None) -> AsyncIterator[tuple[ModelSpec, Backend]]:
    """The model ``parsed`` names, held for the ``async with``, its requests made ready for it.

    In order: the server's limits (``wire.prepare.admit``, before any wait); the request's pictures and
    sounds made ready (``media.ready``: fetched, decoded, checked); the model's name resolved
    once (``Registry.find``; ``BASE:ADAPTER``: the base, with that adapter on each request); the lease, which tells a
    streamed request's client how a load goes where its writer allows (``Writer.progress``;
    otherwise the client waits in silence); then ``wire.prepare.prepare``, the one step that
    readies each request for the model it got (``thinking``: whether thinking is split out).
    ``kinds``: ``Registry.lease``'s (``embeddings=None``: a model of any kind)."""
    admit(parsed, ctx)
    await media.ready(ctx, parsed)
    progress = _progress(request, out) if out is not None and out.progress and parsed.stream else None
    obs = ctx.observation
    obs.request = parsed.request
    registry = request.app[REGISTRY]
    obs.queued = time.monotonic()  # asked for: its wait counts a lookup's pull on demand too
    obs.asked_model = obs.asked_model or parsed.model  # the name, told in a refusal's trace too
    model, adapter = await registry.find(parsed.model, progress)  # BASE:ADAPTER: the base, that adapter on
    if adapter is not None:
        for req in parsed.requests:
            req.adapter = adapter
    async with common.hold(registry, obs, model, on_progress=progress, **kinds) as (spec, backend):
        prepare(parsed, spec, backend.info, thinking=thinking)
        yield spec, backend


async def unrun(request: web.Request, parsed: Parsed, job: Callable[[Backend, dict[str, Any]], Awaitable[R]],
                embeddings: bool | None = False) -> tuple[R, dict[str, str]]:
    """``job`` on the prompt ``parsed`` makes for its model, prepared as a generation's would be
    but not run (counting its tokens, showing it), and the headers its answer sends.
    ``embeddings``: ``Registry.lease``'s (None: a model of any kind)."""
    headers = common.dropped_tools(observation(request), parsed.dropped)
    async with prepared(request, context(request), parsed, embeddings=embeddings) as (_spec, backend):
        return await job(backend, parsed.request.to_dict()), headers


async def answer(request: web.Request, parsed: Parsed, make: Callable[[Context], Writer], *,
                 thinking: bool = True, whole_calls: bool = False,
                 on_lease: Callable[[ModelSpec], None] | None = None,
                 refused: Callable[[ApiError], ApiError] | None = None,
                 kept: Callable[[], None] | None = None) -> web.StreamResponse:
    """``parsed`` answered, in the shape of the writer ``make`` makes for it.

    ``thinking``: whether thinking is split out of the answer. ``whole_calls``: calls are given
    whole even in a stream (Ollama's way). ``on_lease``: a wire's own note on the model it got.
    ``refused``: a refusal put in the wire's own words. ``kept``: called once the answer is whole
    (before a stream's last frames), to keep it (a stored response). Where the request asked
    for tools the gateway runs itself, its answer is ``toolloop.rounds``'."""
    ctx = context(request)
    out = make(ctx)
    async with tools(request, ctx, parsed) as toolbox:
        headers = common.dropped_tools(ctx.observation, parsed.dropped)
        async with prepared(request, ctx, parsed, thinking=thinking, out=out) as (spec, backend):
            out.leased(spec.name)
            if on_lease is not None:
                on_lease(spec)
            for listing in toolbox.listings if toolbox is not None else ():
                out.listed(listing.server, listing.tools, listing.error)
            if toolbox:
                return await _with_tools(request, ctx, parsed, out, backend, toolbox, headers, refused, kept)
            return await _answer(request, ctx, parsed, out, backend, headers, whole_calls, refused, kept)


@asynccontextmanager
async def tools(request: web.Request, ctx: Context, parsed: Parsed) -> AsyncIterator[Toolbox | None]:
    """The hosted tools ``parsed`` asked for (``Toolbox.open``, before the model is held: an MCP
    server's tools are listed first), offered to the model as functions; those this server
    cannot run are added to ``parsed.dropped``. None where it asked for none."""
    if not parsed.hosted:
        yield None
        return
    key = request.get(KEY)
    toolbox = await Toolbox.open(parsed.hosted, request.app.get(TOOLS), key.mcp if key is not None else None)
    try:
        parsed.dropped.extend(t for t in toolbox.dropped if t not in parsed.dropped)
        offer(parsed.request, toolbox.functions())
        yield toolbox
    finally:
        await toolbox.aclose()


def offer(req: protocol.GenerationRequest, functions: list[dict[str, Any]]) -> None:
    """The hosted tools' ``functions`` added to ``req``'s tools; a function of the caller's under
    the same name is a 400 (the model could not tell them apart, nor the gateway whose call it
    is). A choice of some tools (OpenAI's ``allowed_tools`` in auto) allows the hosted ones too;
    a choice that named a tool the gateway does not offer after all (a hosted tool with no
    backend here) names those it does, or none."""
    own = {t["function"]["name"] for t in req.tools or ()}
    for f in functions:
        if f["function"]["name"] in own:
            raise InvalidRequest(f"`tools` has a function named {f['function']['name']!r}, the name this server "
                                 "offers one of the request's hosted tools under", "tools")
    req.tools = [*(req.tools or ()), *functions] or None
    names = req.tool_names
    if names is not None and req.tool_choice == "auto":
        names = (*names, *(f["function"]["name"] for f in functions))
    if names is not None:
        offered = {t["function"]["name"] for t in req.tools or ()}
        names = tuple(n for n in names if n in offered) or None
        if names is None and req.tool_choice == "required" and len(req.tool_names or ()) == 1:
            req.tool_choice = "auto"  # the one tool it named is not here
    req.tool_names = names
    if not req.tools:
        req.tool_choice, req.tool_names = "auto", None


async def _with_tools(request: web.Request, ctx: Context, parsed: Parsed, out: Writer, backend: Backend,
                      toolbox: Toolbox, headers: dict[str, str], refused: Callable[[ApiError], ApiError] | None,
                      kept: Callable[[], None] | None) -> web.StreamResponse:
    """One prompt's answer through ``toolloop.rounds``; its calls given whole, streamed or not
    (a hosted call is known by its name before anything of it is written)."""
    req = parsed.request
    first = await toolloop.approved(ctx, backend, toolbox, parsed.approvals, req)
    gen = backend.generate(req)
    run = None
    try:
        run = await start(ctx.observation, gen, req, stream=False, refused=refused)
        if not parsed.stream:
            out.close(await toolloop.rounds(ctx, backend, req, out, None, toolbox, run, first))
            if kept is not None:
                kept()
            return web.json_response(out.body(), headers=headers)
        started = run

        async def write(sse: EventStream) -> None:
            frames = out.close(await toolloop.rounds(ctx, backend, req, out, sse, toolbox, started, first))
            if kept is not None:
                kept()
            await send(sse, frames)
            await send(sse, out.end())

        return await stream(request, _stream_of(request, ctx, out), [gen], write, out, headers=headers)
    finally:
        left(ctx.observation, gen, run)
        gen.close()


async def _answer(request: web.Request, ctx: Context, parsed: Parsed, out: Writer, backend: Backend,
                  headers: dict[str, str], whole_calls: bool, refused: Callable[[ApiError], ApiError] | None,
                  kept: Callable[[], None] | None) -> web.StreamResponse:
    """``parsed``'s prompts answered one generation each (a batch: one choice each)."""
    streamed = parsed.stream and not whole_calls
    if not parsed.stream:
        for req in parsed.requests:  # a batch of prompts runs one after another
            async with backend.generate(req) as gen:
                run = None
                try:
                    run = await start(ctx.observation, gen, req, stream=False, refused=refused)
                    await send(None, out.open(run.begun))
                    out.close(await read(ctx.observation, run, out, None))
                finally:
                    left(ctx.observation, gen, run)
        if kept is not None:
            kept()
        return web.json_response(out.body(), headers=headers)
    gens = [backend.generate(req) for req in parsed.requests]  # queued in order in the worker
    runs: list[Run] = []
    try:
        # a refusal is still a plain error response
        runs.append(await start(ctx.observation, gens[0], parsed.requests[0], stream=streamed, refused=refused))

        async def write(sse: EventStream) -> None:
            for index, gen in enumerate(gens):
                if index == len(runs):
                    runs.append(await start(ctx.observation, gen, parsed.requests[index], stream=streamed,
                                            refused=refused))
                await send(sse, out.open(runs[index].begun))
                frames = out.close(await read(ctx.observation, runs[index], out, sse))
                if index == len(gens) - 1 and kept is not None:
                    kept()
                await send(sse, frames)
            await send(sse, out.end())

        return await stream(request, _stream_of(request, ctx, out), gens, write, out, headers=headers)
    finally:
        for index, gen in enumerate(gens):  # each one's tokens counted, those of a prompt not reached yet too
            left(ctx.observation, gen, runs[index] if index < len(runs) else None)
            gen.close()


def _stream_of(request: web.Request, ctx: Context, out: Writer) -> EventStream:
    """The stream ``out``'s frames go down: JSON lines (Ollama's) or server-sent events."""
    return LineStream(request, write_timeout=ctx.server.write_timeout) if out.lines else event_stream(request)


async def stream(request: web.Request, out: EventStream, gens: Sequence[GenerationEvents],
                 write: Callable[[EventStream], Awaitable[None]], writer: Writer, *,
                 headers: dict[str, str] | None = None) -> web.StreamResponse:
    """A streamed answer, from ``out``'s opening (with ``headers``, unless a load's progress
    opened it already) through ``write(out)`` to the stream's end: the writer's ``done``, a last
    data frame every stream ends with where the wire has one (OpenAI's ``[DONE]``), then the
    close. ``gens``: the generations ``write`` reads, whose events that arrive together go out
    in one write.

    The one place where a stream's failure is written: an error once the stream began can no
    longer be a status, so it is told in-band as the writer's ``fail`` says and the stream
    ends. A client that went away is noted, and nothing more is written; the caller's leaving
    its generations cancels the work."""
    if not out.opened:
        out.response.headers.update(headers or {})
    common.tapped(request, out)
    await out.open()
    for gen in gens:
        gen.on_idle = out.flush
    try:
        await write(out)
    except ApiError as err:
        log.warning("stream %s ended by an error: %s", writer.id, err.message)
        for data, event in writer.fail(err):
            await ignore_gone(out.send(data, event=event))
    except ConnectionResetError:
        log.info("client disconnected from stream %s", writer.id)
        observation(request).disconnected = True
        return out.response
    if writer.done is not None:
        await ignore_gone(out.send(writer.done))
    await ignore_gone(out.close())
    return out.response


async def ignore_gone(write: Awaitable[object]) -> None:
    """A last write to a client that has just gone away: nothing left to tell it."""
    try:
        await write
    except ConnectionResetError:
        pass
