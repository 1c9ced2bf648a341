"""Operator routes: ``/health`` (open to all), ``/metrics`` (an admin's; open with
``server.metrics_public``), the model list (``/models``, any key) and the admin API
(``admin_only``): ``/models/load``, ``/models/unload``, ``/config/reload``
(``reload_configuration``, SIGHUP's too), ``/admin/queues`` (every model's queue, by key and
priority: ``serving.queues.rows``); and the keys file's watch (``watch_keys``)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..access.scope import visible
from ..backends.replicas import ReplicaSet
from ..base.addresses import is_loopback
from ..base.errors import ApiError
from ..models import memory
from ..models.config import ConfigError, KeySpec, load_config
from ..models.config.keys import keys_path
from ..models.lifecycle import ModelState
from ..server.events import PRINCIPAL
from ..serving import queues
from ..serving.registry import Registry, upstream_rows
from ..wire.params import require_model
from .access import admin_only, is_admin
from .appkeys import CONFIG, GATE, LIFECYCLE, METRICS, REGISTRY
from .body import read_json_object

log = logging.getLogger(__name__)


async def health(request: web.Request) -> web.Response:
    """Open to all, for liveness checks; with API keys set, whether usage is being recorded only
    to a request that gives a key, and the details (workers' PIDs, upstreams, GPUs) only to an
    admin's key."""
    registry = request.app[REGISTRY]
    draining = request.app[LIFECYCLE]["draining"]
    usage = request.app[GATE].usage.status
    told = {"usage": {"recording": usage.recording, "reason": usage.reason}}  # in memory only: say so, and why
    if request.app[GATE].keys and (request.get(PRINCIPAL) is None or not is_admin(request)):
        told = told if request.get(PRINCIPAL) is not None else {}  # nothing more without a key
        return web.json_response({"status": "draining" if draining else "ok", "version": __version__, **told},
                                 status=503 if draining else 200)
    return web.json_response({"status": "draining" if draining else "ok", "version": __version__,
                              "models": len(registry.specs()), "in_flight": registry.in_flight(),
                              "workers": {name: w.pid for name, w in sorted(registry.loaded().items())
                                          if w.pid is not None},
                              "worker_failures": registry.worker_failures,
                              "upstreams": {name: state for name, state in upstream_rows(registry)},
                              "gpus": registry.devices.describe(), **told},
                             status=503 if draining else 200)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def describe(registry: Registry, spec) -> dict[str, Any]:
    model = registry.supervisor(spec)
    info = registry.info(spec)
    found = registry.found.get(spec.name)
    backend = model.backend if model.backend is not None and model.backend.alive else None
    retry = model.retry_at - time.monotonic()
    return {
        "id": spec.name, "aliases": list(spec.aliases), "source": spec.source,
        "path": str(spec.path) if spec.path is not None else None,
        "kind": "rerank" if spec.reranker else "embeddings" if spec.embeddings else "chat", "pinned": spec.pin,
        "media": registry.media(spec), "mmproj": str(spec.mmproj) if spec.mmproj is not None else None,
        "state": model.state, "progress": round(model.progress, 4) if model.state is ModelState.LOADING else None,
        "error": model.error if model.state == "failed" else (found.error if found else None),
        "retry_after": max(1, math.ceil(retry)) if model.state == "failed" and retry > 0 else None,
        "in_flight": model.running(), "queued": model.queued(),
        "slots": {"busy": min(backend.in_flight, model.parallel), "total": model.parallel} if backend else None,
        "device": backend.device if backend else None, "pid": backend.pid if backend else None,
        "memory_bytes": rss_bytes(backend.pid) if backend and backend.pid else None,
        # before a load, what it should take (memory.estimate); once loaded, what llama.cpp allocated
        "memory_estimate": registry.estimate(spec),
        "memory_allocated": memory.allocated(backend.info.get("buffers")) if backend else None,
        "file_size": info.file_size if info else None,
        "architecture": info.architecture if info else None,
        "quantization": info.quantization if info else None,
        "context_length": info.context_length if info else None,
        "n_ctx": backend.info.get("n_ctx") if backend else None,
        "loras": model.adapters.table(spec),  # its LoRA adapters, in the ids of /lora-adapters
        **served_by(registry, spec, backend),
    }


def served_by(registry: Registry, spec, backend) -> dict[str, Any]:
    """Where a model that is not one local file runs, and how that is going: an upstream's
    URL and health (never its key), or each replica's."""
    if spec.upstream is not None:
        return {"upstream": {"url": spec.upstream.url, "model": spec.upstream.model or spec.name,
                             **registry.upstreams.health(spec).describe()}}
    if spec.replicas:
        if isinstance(backend, ReplicaSet):
            return {"replicas": backend.describe()}
        return {"replicas": [{"id": m.name, "up": None, "kind": "upstream" if m.upstream else "local"}
                             for m in spec.replicas]}
    return {"rpc": list(spec.rpc)} if spec.rpc else {}


def downloading_row(pull: dict[str, Any]) -> dict[str, Any]:
    """A model being pulled, as a row of ``/models`` (llama-server's router lists its downloads
    among its models): the fields a loaded model's row has, empty, and ``download`` (the pull's
    bytes done and total, speed and files)."""
    total = pull["total"]
    return {"id": pull["name"], "aliases": [], "source": pull["source"] or None, "path": None, "kind": None,
            "pinned": False, "media": [], "mmproj": None, "state": "downloading",
            "progress": round(pull["completed"] / total, 4) if total else 0.0, "error": None, "retry_after": None,
            "in_flight": 0, "queued": 0, "slots": None, "device": None, "pid": None, "memory_bytes": None,
            "memory_estimate": None, "memory_allocated": None, "file_size": total or None, "architecture": None,
            "quantization": None, "context_length": None, "n_ctx": None, "loras": [], "download": pull}


async def list_models(request: web.Request) -> web.Response:
    """The models the key may use, and to an admin the pulls too."""
    registry = request.app[REGISTRY]
    pulls = registry.pulls.rows() if is_admin(request) else []
    downloading = [downloading_row(p) for p in pulls if p["state"] in ("planning", "downloading")]
    return web.json_response({"object": "list", "data": [describe(registry, s) for s in visible(registry.specs())]
                              + downloading, "pulls": pulls})


async def _model_field(request: web.Request) -> str:
    return require_model(await read_json_object(request))


@admin_only
async def load_model(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    model = await registry.load(await _model_field(request))
    return web.json_response(describe(registry, model.spec))


@admin_only
async def unload_model(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    model = await registry.unload(await _model_field(request))
    return web.json_response(describe(registry, model.spec))


@admin_only  # every key's names and spending
async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].scrape(), headers={"Content-Type": CONTENT_TYPE_LATEST})


@admin_only  # every key's name and what it waits for
async def queues_route(request: web.Request) -> web.Response:
    """``GET /admin/queues``: ``{"queues": rows}``, each model with requests running or waiting:
    its slots, running, waiting, whether its door is closed (a swap drains it), and who waits
    by key and priority with the longest wait (``serving.queues.rows``)."""
    return web.json_response({"queues": queues.rows(request.app[REGISTRY].supervisors.all())})


async def reload_configuration(app: web.Application) -> bool:
    """models.yaml and the keys read again (SIGHUP, ``POST /config/reload``): the models as
    ``Registry.reload`` swaps them, the keys for the next request; a broken file changes nothing."""
    config = await app[REGISTRY].reload(app[CONFIG].path)
    if config is None:
        return False
    _set_keys(app, config.server.api_keys)
    return True


def _set_keys(app: web.Application, keys: tuple[KeySpec, ...]) -> None:
    """The keys read put in force; but never none in place of some while the gateway listens
    beyond loopback, which would open it to the network (it would not have started so)."""
    host = app[CONFIG].server.host
    if not keys and app[GATE].keys and not is_loopback(host):
        log.error("keys not reloaded: the configuration now has no API key, and the gateway listens on %s, "
                  "beyond this machine; the keys in force stay (restart it to serve without keys)", host)
        return
    app[GATE].set_keys(keys)


async def reload_keys(app: web.Application) -> None:
    """The keys alone read again (the keys file changed): a broken file is logged, the keys stay."""
    try:
        config = await asyncio.to_thread(load_config, app[CONFIG].path)
    except ConfigError as e:
        for line in e.problems:
            log.error("keys not reloaded, keeping those in force: %s", line)
        return
    _set_keys(app, config.server.api_keys)


KEYS_EVERY = 2.0  # seconds between looks at the keys file


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


async def watch_keys(app: web.Application) -> None:
    """Read the keys again whenever the keys file changes (appears, is written, is removed)."""
    path = keys_path(app[CONFIG].server)
    seen = await asyncio.to_thread(_stamp, path)
    while True:
        await asyncio.sleep(KEYS_EVERY)
        now = await asyncio.to_thread(_stamp, path)
        if now != seen:
            seen = now
            try:
                await reload_keys(app)
            except Exception:  # the watch goes on whatever one reading met
                log.exception("keys not reloaded, keeping those in force")


@admin_only
async def reload_route(request: web.Request) -> web.Response:
    if not await reload_configuration(request.app):
        raise ApiError("The configuration did not reload: it has a problem (the gateway's log says which); "
                       "the running one stays", status=409, code="config_invalid")
    return web.json_response({"status": "reloaded", "models": len(request.app[REGISTRY].specs()),
                              "keys": len(request.app[GATE].keys.specs)})


def setup(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/models", list_models)
    app.router.add_post("/models/load", load_model)
    app.router.add_post("/models/unload", unload_model)
    app.router.add_post("/config/reload", reload_route)
    app.router.add_get("/admin/queues", queues_route)
