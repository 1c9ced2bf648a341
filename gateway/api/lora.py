"""The operator's routes over a model's LoRA adapters (admin-only), in the anchors' shapes:

- llama-server's ``GET /lora-adapters`` (its adapters: id, path, scale, with each one's name,
  the scale a request naming it gets, the model name that picks it and where it came from) and
  ``POST /lora-adapters`` (a body ``[{"id", "scale"}]`` sets every default scale: the ids listed
  theirs, the rest 0). llama-server serves one model; here ``?model=NAME`` says which, and may be
  left out where one local model is loaded.
- vLLM's ``POST /v1/load_lora_adapter`` (``{"lora_name", "lora_path"}``; the base is
  ``BASE:NAME``'s, or ``base_model_name``'s, or the only local text model's; ``scale``, the
  gateway's own, where naming it should not apply it at 1) and ``POST /v1/unload_lora_adapter``
  (``{"lora_name"}``: one loaded at run time; those models.yaml or discovery gave stay).

A run-time load loads the base model first and hands the file to its worker, so llama.cpp
checks it against the base and a mismatch is refused with llama.cpp's reason. What these routes
change is kept on the model's supervisor (``serving/adapters.py``) for its next loads and sent
to its running worker.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from ..access.scope import visible
from ..backends.workerclient import RequestFailed, WorkerProcess
from ..base.errors import ApiError, InvalidRequest, ModelNotFound
from ..models.config import AdapterSpec, ModelSpec
from ..protocol.bounds import MAX_ADAPTERS, MAX_SCALE, is_scale
from ..serving.registry import Registry
from ..wire.params import read_lora, shown
from .access import admin_only
from .appkeys import REGISTRY
from .body import read_json, read_json_object

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # an adapter's name: part of a model name, no ':'


def _worker(registry: Registry, spec: ModelSpec) -> WorkerProcess | None:
    """The model's running worker, where it has one (an upstream's or replicas' has none here)."""
    backend = registry.supervisor(spec).backend
    return backend if isinstance(backend, WorkerProcess) and backend.alive else None


async def _adapt(worker: WorkerProcess, action: str, **fields: Any) -> list[dict[str, Any]]:
    try:
        return await worker.adapt(action, **fields)
    except RequestFailed as e:
        raise ApiError(e.event.message, status=e.event.status, param=e.event.param, code=e.event.code) from None


def _takes_adapters(spec: ModelSpec) -> bool:
    """A text model this gateway's worker runs: the only kind adapters go on."""
    return spec.local and not spec.replicas and not spec.embeddings and not spec.reranker


def _local(spec: ModelSpec) -> ModelSpec:
    if not _takes_adapters(spec):
        raise InvalidRequest(f"{spec.name!r} takes no LoRA adapters here: only a text model this gateway runs "
                             "itself does", "model")
    return spec


async def _model(request: web.Request) -> ModelSpec:
    """``?model=NAME``'s model, or without it the only local model loaded (of those the key may
    use: a name is resolved within its scope, ``Registry.resolve``)."""
    registry = request.app[REGISTRY]
    name = request.query.get("model")
    if name is not None:
        return _local(await registry.lookup(name))
    running = registry.loaded()
    loaded = [m for m in visible(registry.specs()) if m.name in running and m.local]
    if len(loaded) != 1:
        raise InvalidRequest("say which model: ?model=NAME (this gateway serves several)", "model")
    return loaded[0]


@admin_only
async def list_adapters(request: web.Request) -> web.Response:
    spec = await _model(request)
    registry = request.app[REGISTRY]
    rows = registry.adapters.kept(spec).table(spec)
    if (worker := _worker(registry, spec)) is not None:  # loaded: what llama.cpp read of each (aLoRA's tokens)
        for row, live in zip(rows, await _adapt(worker, "list")):
            if "alora_invocation_tokens" in live:
                row["alora_invocation_tokens"] = live["alora_invocation_tokens"]
    return web.json_response(rows)


@admin_only
async def set_scales(request: web.Request) -> web.Response:
    spec = await _model(request)
    body = await read_json(request, array=True)
    if not isinstance(body, list):
        raise InvalidRequest("the body must be an array of {\"id\", \"scale\"} objects (llama-server's)", "body")
    registry = request.app[REGISTRY]
    kept = registry.adapters.kept(spec)
    n = len(kept.table(spec))
    pairs = read_lora(body) or []
    for i, (aid, _) in enumerate(pairs):
        if aid >= n:
            raise InvalidRequest(f"the model has no LoRA adapter of id {aid} (it has {n})", f"[{i}].id")
    if (worker := _worker(registry, spec)) is not None:
        await _adapt(worker, "scales", scales=pairs)
    kept.set_defaults(spec, dict(pairs))
    return web.json_response({"success": True})


def _text(body: dict[str, Any], key: str, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise InvalidRequest(f"`{key}` must be a non-empty string", key)
    return value


def _base(registry: Registry, body: dict[str, Any]) -> tuple[ModelSpec, str]:
    """The base model and the adapter's name a load or an unload is about."""
    name = _text(body, "lora_name")
    assert name is not None
    base = _text(body, "base_model_name", required=False)
    if base is None and ":" in name:
        base, name = name.rsplit(":", 1)
    if not NAME.fullmatch(name):
        raise InvalidRequest(f"`lora_name` must be NAME or BASE:NAME, NAME of letters, digits, '.', '_' and '-' "
                             f"(at most 64), got {shown(name)}", "lora_name")
    if base is not None:
        spec = registry.resolve(base, tag_fallback=False)
        if spec is None:
            raise ModelNotFound(base)
        return _local(spec), name
    texts = [s for s in visible(registry.specs()) if _takes_adapters(s)]
    if len(texts) != 1:
        raise InvalidRequest("say which model the adapter is for: `lora_name` as BASE:NAME, or `base_model_name`",
                             "base_model_name")
    return texts[0], name


@admin_only
async def load_adapter(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    body = await read_json_object(request)
    spec, name = _base(registry, body)
    path = _text(body, "lora_path")
    assert path is not None
    scale = body.get("scale", 1.0)
    if not is_scale(scale):
        raise InvalidRequest(f"`scale` must be a number from -{MAX_SCALE:g} to {MAX_SCALE:g}", "scale")
    if not await asyncio.to_thread(os.path.isfile, path):
        raise InvalidRequest(f"no adapter file at {shown(path, 200)} on the gateway's machine", "lora_path")
    if any(a.name == name for a in registry.adapters.named(spec)):
        raise InvalidRequest(f"{spec.name!r} has a LoRA adapter named {name!r} already; unload it first",
                             "lora_name", "adapter_exists")
    if len(registry.adapters.kept(spec).table(spec)) >= MAX_ADAPTERS:
        raise InvalidRequest(f"{spec.name!r} has {MAX_ADAPTERS} LoRA adapters already; unload one first", "lora_name")
    async with registry.lease(spec.name) as (_, backend):  # loaded (and kept so) for the worker to check the file
        if not isinstance(backend, WorkerProcess):
            raise InvalidRequest(f"{spec.name!r} takes no LoRA adapters here", "lora_name")
        await _adapt(backend, "load", name=name, path=path, scale=float(scale))
        registry.adapters.kept(spec).runtime.append(AdapterSpec(name=name, path=Path(path), scale=float(scale),
                                                           source="runtime"))
    return web.Response(text=f"Success: LoRA adapter '{spec.name}:{name}' added successfully.")


@admin_only
async def unload_adapter(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    spec, name = _base(registry, await read_json_object(request))
    kept = registry.adapters.kept(spec)
    gone = next((a for a in kept.runtime if a.name == name), None)
    if gone is None:
        if any(a.name == name for a in spec.loras):
            given = "models.yaml" if spec.source == "models.yaml" else "discovery"
            raise InvalidRequest(f"{spec.name}:{name} is {given}'s, not loaded at run time: take it out there",
                                 "lora_name")
        raise ApiError(f"{spec.name!r} has no LoRA adapter {name!r} loaded at run time", status=404,
                       param="lora_name", code="adapter_not_found")
    if (worker := _worker(registry, spec)) is not None:
        try:
            await _adapt(worker, "unload", name=name)
        except ApiError as err:
            if err.status != 404:  # (a worker that has it not: gone already)
                raise
    kept.runtime.remove(gone)
    return web.Response(text=f"Success: LoRA adapter '{spec.name}:{name}' removed successfully.")


def setup(app: web.Application) -> None:
    app.router.add_get("/lora-adapters", list_adapters)
    app.router.add_post("/lora-adapters", set_scales)
    app.router.add_post("/v1/load_lora_adapter", load_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_adapter)
