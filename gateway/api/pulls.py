"""Pulling and removing models by name (``hub/``): the gateway's own routes and Ollama's.

- ``POST /models/pull`` ``{"model", "insecure"?, "stream"?}``: starts the pull of a name, or joins
  the one running, and streams its progress as newline-delimited JSON in Ollama's shape
  (``status``, ``digest``, ``total``, ``completed``; then ``{"status": "success"}``, or an
  ``{"error": ...}`` line), with the gateway's own fields beside them (``model``,
  ``bytes_per_second``, ``eta_seconds``). ``"stream": false`` waits and answers once, an error
  with its status (404 unknown name, 400 a bad or ambiguous one, 507 too little disk, 502 the
  hub failed or sent bad bytes). A caller who leaves does not stop the pull.
- ``POST /models/pull/cancel`` ``{"model"}``: stops it; its partial files stay for the next pull.
- ``POST /models/delete`` ``{"model"}``: unloads and deletes a pulled model (``hub/removal``).
- Ollama's ``POST /api/pull`` and ``DELETE /api/delete``, as Ollama answers them.

Who may: with API keys set, an admin's key (every handler here is ``admin_only``: a user key
gets 403); without keys the gateway listens only on loopback unless told otherwise, and then
anyone who can reach it may.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..base.errors import ApiError
from ..hub.pulls import Pull, PullState
from ..hub.removal import remove
from ..hub.transfer import NotFound
from ..server.sse import LineStream
from ..wire.ollama import flag
from ..wire.params import require_model
from .access import admin_only
from .appkeys import CONFIG, REGISTRY
from .body import read_json_object


class Narration:
    """What a caller is told of a pull as it goes: Ollama's progress lines (``own``: with the
    gateway's ``model``, ``bytes_per_second`` and ``eta_seconds`` too). A caller wakes to the
    pull's latest state, so each call says what changed since the last: a line for each file
    whose bytes grew (its last one too, whatever came after it), then each step it has passed not
    said yet (``Pull.steps``), then the end."""

    def __init__(self, own: bool):
        self.own = own
        self.sent: dict[str, int] = {}  # digest -> bytes last told
        self.said: set[str] = set()  # steps told

    def next(self, pull: Pull) -> list[dict[str, Any]]:
        own, out = self.own, list[dict[str, Any]]()
        rate = pull.rate()
        extra = {"model": pull.name or pull.asked, "bytes_per_second": round(rate)} if own else {}
        if "pulling manifest" not in self.said:
            self.said.add("pulling manifest")
            out.append({"status": "pulling manifest", **extra})
        for f in pull.files.values():
            if f.completed != self.sent.get(f.digest, 0) or (f.digest == pull.current and f.digest not in self.sent):
                self.sent[f.digest] = f.completed
                line = {"status": f"pulling {f.digest.removeprefix('sha256:')[:12]}", "digest": f.digest,
                        "total": f.total, "completed": f.completed, **extra}
                if own:
                    line["eta_seconds"] = pull.eta(rate)
                out.append(line)
        for step in pull.steps:
            if step not in self.said:
                self.said.add(step)
                out.append({"status": step, **extra})
        if pull.state is PullState.FAILED or pull.state is PullState.CANCELLED:
            out.append({"error": str(pull.error) if pull.error else pull.state.value})
        elif pull.state is PullState.DONE:
            out.append({"status": "success", **({"model": pull.name} if own else {})})
        return out


def _model(body: dict[str, Any]) -> str:
    """Ollama's ``model``, or its older ``name``."""
    if "model" not in body and isinstance(body.get("name"), str):
        body = {**body, "model": body["name"]}
    return require_model(body)


async def _pull(request: web.Request, *, own: bool) -> web.StreamResponse:
    body = await read_json_object(request)
    name = _model(body)
    insecure, stream = flag(body, "insecure", False), flag(body, "stream", True)
    pulls = request.app[REGISTRY].pulls
    pull = pulls.start(name, insecure=insecure)
    if not stream:
        await pulls.wait(pull)
        if pull.error is not None:
            raise pull.error
        return web.json_response(Narration(own).next(pull)[-1])
    async for now in pulls.watch(pull):  # a name no hub has is a 404, not a stream: wait for its plan
        if now.state is not PullState.PLANNING:
            break
    if pull.state is PullState.FAILED and pull.error is not None:
        raise pull.error
    out = LineStream(request, write_timeout=request.app[CONFIG].server.write_timeout)
    await out.open()
    told = Narration(own)
    # a caller who leaves ends this loop only: the pull goes on for whoever else waits
    async for now in pulls.watch(pull):
        for line in told.next(now):
            await out.send(line, hold=True)
        await out.flush()
    return await out.close()


@admin_only
async def pull(request: web.Request) -> web.StreamResponse:
    return await _pull(request, own=True)


@admin_only
async def ollama_pull(request: web.Request) -> web.StreamResponse:
    return await _pull(request, own=False)


@admin_only
async def cancel(request: web.Request) -> web.Response:
    name = _model(await read_json_object(request))
    pull = request.app[REGISTRY].pulls.cancel(name)
    if pull is None:
        raise ApiError(f"no pull of {name!r} is running", status=404, param="model", code="pull_not_found")
    return web.json_response({"model": pull.name or pull.asked, "cancelled": True})


async def _delete(request: web.Request) -> list[str]:
    name = _model(await read_json_object(request))
    registry = request.app[REGISTRY]
    spec = registry.resolve(name, tag_fallback=False)  # this name's own model, never one a tag falls back to
    if spec is None:  # a model put there since the last scan: the stores read again, whenever they last were
        await asyncio.to_thread(registry.catalog.refresh)
        spec = registry.resolve(name, tag_fallback=False)
    if spec is None and registry.resolve(name, tag_fallback=False, scoped=False) is not None:
        raise NotFound(f"no pulled model {name!r}")  # outside the key's models: as ``remove`` tells a name nothing has
    found = registry.found.get(spec.name) if spec is not None else None
    if spec is not None and registry.supervisor(spec).holds:
        await registry.unload(spec.name)  # 409 while it answers
    removed = await asyncio.to_thread(remove, name, found, registry.pulls.stores(),
                                      configured=spec is not None and found is None)
    await asyncio.to_thread(registry.catalog.refresh)
    return [str(p) for p in removed]


@admin_only
async def delete(request: web.Request) -> web.Response:
    return web.json_response({"deleted": await _delete(request)})


@admin_only
async def ollama_delete(request: web.Request) -> web.Response:
    await _delete(request)
    return web.Response(status=200)


def setup(app: web.Application) -> None:
    app.router.add_post("/models/pull", pull)
    app.router.add_post("/models/pull/cancel", cancel)
    app.router.add_post("/models/delete", delete)
    app.router.add_post("/api/pull", ollama_pull)
    app.router.add_delete("/api/delete", ollama_delete)
