"""What every route's handler shares beyond reading its body (``body.py``): ``hold``
(``Registry.lease`` with its wait and the load it waited for noted in the observation),
``embedded`` (an embedding's reply, charged however the request ends), ``vectors_response``
(its JSON written off the event loop), the request's event stream and its capture's tap, and
``dropped_tools`` (the hosted tools a request gave that its prompt left out: told in the
inference event and the ``X-Gateway-Dropped-Tools`` header). The server's limits on a
generating request are ``wire.prepare.admit``'s."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from ..backends.local import Backend
from ..models.config import ModelSpec
from ..protocol import Embeddings
from ..server.captures import CAPTURE
from ..server.events import STREAM, Observation, observation
from ..server.sse import EventStream
from ..serving.registry import Registry
from ..serving.supervisor import LOADED
from .appkeys import CONFIG


@asynccontextmanager
async def hold(registry: Registry, obs: Observation, model: object,
               **kinds: Any) -> AsyncIterator[tuple[ModelSpec, Backend]]:
    """The model held for a request: ``Registry.lease`` (``kinds``: its ``embeddings``,
    ``rerank``, ``on_progress``), its wait noted in the request's observation ``obs`` for traces
    and captures: when it was asked for, when it was held, and the load it waited for. ``model``:
    a name, or the model ``Registry.find`` gave (its caller then noted the name and the time it
    asked)."""
    if obs.asked_model is None and isinstance(model, str):
        obs.asked_model = model
    if obs.queued is None:
        obs.queued = time.monotonic()
    async with registry.lease(model, **kinds) as (spec, backend):
        obs.model = spec.name
        obs.leased = time.monotonic()
        loaded = backend.info.get(LOADED)
        if loaded is not None and loaded.ended >= obs.queued:
            obs.load = loaded
        yield spec, backend


# How long a request whose client left waits for its embeddings to be made, to charge them
FINISH_SECONDS = 30.0


async def embedded(request: web.Request, work: Awaitable[Embeddings]) -> Embeddings:
    """An embedding's or a rerank's reply, its prompt tokens counted in the request's
    observation. Its worker reads the inputs in decodes that a cancel does not undo, and tells
    the tokens only in the reply; so a client that leaves does not stop the work: it is finished
    (within ``FINISH_SECONDS``, else cancelled) and charged, as a generation is charged what it
    made however its request ends. A worker that dies first is charged nothing: it told nothing."""
    task = asyncio.ensure_future(work)
    try:
        reply = await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), FINISH_SECONDS)
        if task.done() and not task.cancelled() and task.exception() is None:
            observation(request).prompt_tokens = task.result().prompt_tokens
        else:
            task.cancel()  # the worker is told to drop it
        raise
    observation(request).prompt_tokens = reply.prompt_tokens
    return reply


async def vectors_response(body: dict[str, Any]) -> web.Response:
    """``web.json_response(body)`` made off the event loop: an embedding reply's vectors are
    thousands of numbers, whose JSON takes milliseconds to write (the loop meanwhile serves the
    other requests)."""
    return web.Response(text=await asyncio.to_thread(json.dumps, body), content_type="application/json")


def event_stream(request: web.Request) -> EventStream:
    """This request's server-sent event stream, its writes bounded by server.write_timeout: one
    per request, so an answer goes on in the stream its load's progress opened."""
    sse = request.get(STREAM)
    if sse is None:
        write_timeout = request.app[CONFIG].server.write_timeout
        sse = request[STREAM] = tapped(request, EventStream(request, write_timeout=write_timeout))
    return sse


def tapped(request: web.Request, out: EventStream) -> EventStream:
    """``out``, each of its writes told to the request's capture where it has one."""
    capture = request.get(CAPTURE)
    if capture is not None and out.tap is None:
        out.tap = capture.frame
    return out


DROPPED_TOOLS = "X-Gateway-Dropped-Tools"  # the tools a request gave that its prompt left out


def dropped_tools(obs: Observation, dropped: list[str]) -> dict[str, str]:
    """Tell the tools a request gave that the gateway cannot run (hosted ones: web search, code
    execution, ...) and so left out of the prompt: in the inference event, and as the headers an
    answer sends (where its stream is not open yet)."""
    obs.dropped_tools = dropped
    return {DROPPED_TOOLS: ",".join(dropped)} if dropped else {}
