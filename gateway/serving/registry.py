"""Name -> ModelSpec -> a running backend, for every model the gateway serves.

The registry joins these parts, each with one job:
- the catalog (``catalog.py``): names -> specs. Resolution looks at models loaded or loading
  now (by name and alias) first, then the catalog (models.yaml, then discovery; a miss
  rescans the stores, at most every ``rescan_seconds``); a ``name:tag`` that matched nothing
  tries ``name``. This is where a request's name becomes a model, so it is where the key's
  scope holds (``access.scope``): each model outside it is passed over at every step, as if it
  were not there, so a name resolves within the scope to what it would on a gateway without the
  others, and a name outside it to nothing (``lookup``: the same ``ModelNotFound`` as a name
  nothing has);
- one supervisor per model (``supervisor.py``): its lifecycle, single-flight load, back-off,
  keep-alive and retirement; the registry's table of them (``supervisors.py``, its
  ``supervisors``);
- every model's LoRA adapters and the names that pick them (``adapters.py``, its ``adapters``);
- placement (``placer.py``, carrying out ``placement.py``'s pure policies): which idle model
  to unload when ``server.max_loaded_models`` or a device's memory is reached, and how busy
  models share the CPUs;
- the launcher (``launcher.py``): starts a model's backend by its spec, through the
  ``BackendFactory`` (``backend.LocalWorkers`` unless told otherwise) for a local one.

The registry is its supervisors' ``Host``: it hands their requests for room and for a backend
to the placer and the launcher, and reports loads and crashes to the metrics. A reload
(SIGHUP) swaps the tables; a loaded model whose entry changed or vanished finishes its
requests and is unloaded when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..access import scope
from ..access.claims import CLAIM
from ..backends.local import CHAT, EMBEDDINGS, RERANK, TOKENIZE, Backend, BackendFactory, LocalWorkers
from ..backends.upstream_table import Upstreams
from ..base.errors import MAX_MODEL_NAME, ApiError, ModelNotFound
from ..hardware.devices import Inventory
from ..hub import pulls as hub
from ..models import discovery, memory
from ..models.catalog import DEMO_NAME, ModelCatalog, ensure_demo_model  # noqa: F401 (DEMO_NAME, ensure_demo_model: re-exported)
from ..models.config import Config, ConfigError, ModelSpec, load_config, normalize_name
from ..models.ggufmeta import GGUFInfo
from ..models.lifecycle import ModelState
from ..protocol.settings import embed_seqs
from ..server.metrics import Metrics
from . import queues
from .adapters import Adapters
from .launcher import Launcher
from .placer import Placer
from .supervisor import ModelSupervisor, Progress, Timing, refusal
from .supervisors import Supervisors

log = logging.getLogger(__name__)

_LIVE = (ModelState.LOADING, ModelState.READY)


def _parallel(spec: ModelSpec) -> int:
    """Requests a model's backend decodes at once; the rest wait in its queue (an embedding
    model's decode takes an input of each waiting request, up to its sequences)."""
    return embed_seqs(spec.parallel) if spec.embeddings or spec.reranker else spec.parallel


def _anything(spec: ModelSpec) -> bool:
    return True


def metrics_row(model: ModelSupervisor, need: int) -> tuple[str, str, int, int, float, int, int]:
    """One model's row in ``Registry.metrics_rows``, from its supervisor and its estimate
    (``need``, bytes): what llama.cpp allocated counts only while it is ready."""
    state = model.state
    loaded = 1.0 if state is ModelState.READY else model.progress if state is ModelState.LOADING else 0.0
    backend = model.backend if state is ModelState.READY else None
    allocated = memory.allocated(backend.info.get("buffers")) if backend is not None else None
    held = allocated["total"] if allocated else 0
    return model.spec.name, state.value, model.running(), model.queued(), loaded, need, held


def _findable(name: object) -> object:
    """``name``; a name longer than any model's (``MAX_MODEL_NAME``) is not looked for: it is
    not found, and the 404 quotes it cut."""
    if isinstance(name, str) and len(name) > MAX_MODEL_NAME:
        raise ModelNotFound(name)
    return name


class Registry:
    def __init__(self, config: Config, *, demo_dir: Path | None = None, allow_demo: bool = False,
                 rescan_seconds: float = 5.0, backoff: tuple[float, float] = (5.0, 300.0),
                 backends: BackendFactory | None = None, upstream_backoff: tuple[float, float] = (2.0, 60.0)):
        self.config = config
        self.catalog = ModelCatalog(config, demo_dir=demo_dir, allow_demo=allow_demo, rescan_seconds=rescan_seconds)
        self.backoff = backoff  # a failed load's first wait before the next attempt, and its cap
        # other machines' servers: their health, probes and listed models
        self.upstreams = Upstreams(upstream_backoff, config.server.upstream_check_seconds)
        self.upstreams.sync(self.catalog.specs())
        # what placement decides on (memory by pool, the GPUs), and its decisions carried out
        self.placer = Placer(self.catalog.info, self.catalog.projector, self.catalog.adapters)
        # starts backends: a local model's through the factory (a worker process, from a spare
        # where configured), an upstream's, a replica set's
        self.launcher = Launcher(backends if backends is not None else LocalWorkers(config.server.spare_worker),
                                 self.upstreams, backoff, lambda: self.config.server,
                                 on_busy=lambda: self.placer.share_cpus(self.supervisors.all()),
                                 on_crash=self._count_failure)
        # the keys' terms and the metrics, as models' slots ask them (the app sets ``key_terms``)
        self.queues = queues.KeyQueues(lambda: self.config.server, lambda: self.metrics)
        self.supervisors = Supervisors(lambda spec: ModelSupervisor(spec, self, self._timing(spec), _parallel(spec),
                                                                    self.queues))
        # every model's LoRA adapters (each kept on its supervisor), and the names that pick them
        self.adapters = Adapters(lambda spec: self.supervisors.of(spec).adapters,
                                 lambda spec: self.supervisors.kept(spec).adapters, self.resolve, self.specs)
        self.worker_failures = 0  # backends that exited without being asked to
        self.metrics: Metrics | None = None  # when an app serves this registry
        self.placer.on_swap = lambda reason: self.metrics.swaps.labels(reason).inc() if self.metrics else None
        # models pulled by name from the hubs, into the stores discovery reads
        self.pulls = hub.Pulls(lambda: hub.stores_for(self.config.server),
                               refresh=lambda: asyncio.to_thread(self.catalog.refresh))

    @property
    def devices(self) -> Inventory:
        """The GPUs llama.cpp sees (the placer's)."""
        return self.placer.devices

    @devices.setter
    def devices(self, inventory: Inventory) -> None:
        self.placer.devices = inventory

    # --- names (the catalog's, loaded models first) ------------------------------------------
    def refresh(self) -> None:
        """Re-read the stores (blocking I/O: call it off the event loop when serving)."""
        self.catalog.refresh()

    @property
    def found(self) -> dict[str, discovery.Found]:
        return self.catalog.found

    def resolve(self, name: object, *, loaded_first: bool = True, tag_fallback: bool = True,
                scoped: bool = True) -> ModelSpec | None:
        """A loaded (or loading) model by any of its names first, then the catalog's answer; a
        ``name:tag`` that matched nothing tries ``name`` (unless not ``tag_fallback``); then glob
        aliases. Every step passes over the models outside the request's scope (``scoped``: see above)."""
        within = scope.allowed if scoped else _anything
        keys = self.catalog.keys(name)[: None if tag_fallback else 1]
        for key in keys:
            for model in self.supervisors.by_name.values() if loaded_first else ():
                if model.state in _LIVE and key in map(normalize_name, model.spec.names) and within(model.spec):
                    return model.spec
            for spec in (self.catalog.get(key), self.upstreams.resolve(key)):
                if spec is not None and within(spec):
                    return spec
        for key in keys:  # models.yaml's glob aliases, once no model has the name itself
            if (spec := self.catalog.match(key, within)) is not None:
                return spec
        return None

    async def lookup(self, name: object, on_progress: Progress | None = None) -> ModelSpec:
        """``resolve``, rescanning the stores once on a miss (at most every ``rescan_seconds``); a
        name ``server.pull_on_demand`` allows that no model has exactly is pulled first
        (``on_progress`` told its share done), where the key's globs take it (``scope.may_pull``) and
        it may have models loaded (``may_load``: a pulled model is loaded next)."""
        spec, shown = self.resolve(_findable(name)), name if isinstance(name, str) else repr(name)
        if spec is None and self.catalog.stale():
            await asyncio.to_thread(self.catalog.refresh)
            await self.upstreams.refresh(discover_only=True)
            spec = self.resolve(name)
        if isinstance(name, str) and self.resolve(name, tag_fallback=False) is None and scope.may_pull(name) \
                and self.queues.may_load(CLAIM.get()):  # a key that may not load a model may not pull one
            await self.pulls.on_demand(name, self.config.server, on_progress)  # where the server allows it
            spec = self.resolve(name)
        if spec is None:  # nothing has it, or nothing the key may use: the same answer
            raise ModelNotFound(shown)
        return spec

    async def find(self, name: object, on_progress: Progress | None = None) -> tuple[ModelSpec, str | None]:
        """The model a request's name reaches, and the LoRA adapter it picks (``BASE:ADAPTER``, or
        an adapter's own name: ``Adapters.picked``; None where the name is a model's own), the
        name resolved once for the whole request: ``lease`` then takes the model itself."""
        if (picked := self.adapters.picked(name)) is not None:
            return picked
        return await self.lookup(name, on_progress), None

    def specs(self) -> list[ModelSpec]:
        specs = self.catalog.specs()
        taken = {normalize_name(n) for s in specs for n in s.names}
        return specs + [s for s in self.upstreams.discovered() if normalize_name(s.name) not in taken]

    def names_of(self, spec: ModelSpec) -> list[str]:
        return self.catalog.names_of(spec)

    def conflicts_won(self, spec: ModelSpec) -> dict[str, list[Path]]:
        return self.catalog.conflicts_won(spec)

    def info(self, spec: ModelSpec) -> GGUFInfo | None:
        return self.catalog.info(spec)

    def media(self, spec: ModelSpec) -> list[str]:
        """What the model takes beside text ("image", "audio"): what its loaded backend reported,
        else what its projector's header says."""
        model = self.supervisor(spec)
        if model.backend is not None and model.backend.alive and "vision" in model.backend.info:
            info = model.backend.info
            return [kind for kind, key in (("image", "vision"), ("audio", "audio")) if info.get(key)]
        return self.catalog.media(spec)

    # --- supervisors ---------------------------------------------------------------------------
    def _timing(self, spec: ModelSpec) -> Timing:
        server = self.config.server
        keep = math.inf if spec.pin else spec.keep_alive if spec.keep_alive is not None else server.keep_alive
        return Timing(load_timeout=server.load_timeout, keep_alive=keep, backoff=self.backoff)

    def supervisor(self, spec: ModelSpec) -> ModelSupervisor:
        """The model's supervisor, to read its state (``Supervisors.of``: nothing is kept for it)."""
        return self.supervisors.of(spec)

    def estimate(self, spec: ModelSpec) -> dict[str, Any] | None:
        """What a local model should take once loaded (``Placer.estimate``)."""
        return self.placer.estimate(spec)

    def metrics_rows(self) -> list[tuple[str, str, int, int, float, int, int]]:
        """(model, state, requests in flight, requests queued, how much of it is loaded: 0 to 1,
        its memory estimate, what llama.cpp allocated for it) for every resolvable model."""
        return [metrics_row(self.supervisor(spec), sum(self.placer.need(spec).values())) for spec in self.specs()]

    def in_flight(self) -> int:
        return sum(m.in_flight for m in self.supervisors.all())

    def abort_all(self, message: str) -> None:
        """End every request in flight now with an error (the drain time ran out)."""
        for model in self.supervisors.all():
            if model.backend is not None:
                model.backend.abort_all(message)

    def loaded(self) -> dict[str, Backend]:
        return {m.spec.name: m.backend for m in self.supervisors.by_name.values()
                if m.backend is not None and m.backend.alive}

    @contextlib.asynccontextmanager
    async def lease(self, name: object | ModelSpec, *, embeddings: bool | None = False, rerank: bool = False,
                    on_progress: Progress | None = None) -> AsyncIterator[tuple[ModelSpec, Backend]]:
        """The model's running backend for one request; the model stays loaded meanwhile.
        ``on_progress``: told how a load the request waits for goes (``ModelSupervisor.ready``).
        ``embeddings``: the request wants vectors (True) or text (False); ``rerank``: scores. A
        model serves one of these, the wrong one is a 501 (``supervisor.refusal``: known from a
        local model's spec before any load, and checked against what the backend says it serves).
        ``embeddings=None``: any (tokenize). ``name``: a request's name, or the model ``find`` gave
        for it."""
        spec = name if isinstance(name, ModelSpec) else await self.lookup(name, on_progress)
        kind = RERANK if rerank else {True: EMBEDDINGS, False: CHAT, None: TOKENIZE}[embeddings]
        if (refused := refusal(spec, kind)) is not None:  # before a supervisor is made for it
            raise refused
        refuse = queues.refuser(spec, self.queues, self.supervisors.by_name.values)  # may_load, asked at a load
        try:
            async with self.supervisors.kept(spec).lease(kind, self.config.server.max_queue, on_progress, refuse) \
                    as backend:
                yield spec, backend
        except ApiError as err:
            err.model = err.model or spec.name
            raise

    async def load(self, name: object) -> ModelSupervisor:
        """Load a model without a request (admin API, preload)."""
        model = self.supervisors.kept(await self.lookup(name))
        await model.ready(refuse=queues.refuser(model.spec, self.queues, self.supervisors.by_name.values))
        return model

    async def unload(self, name: object) -> ModelSupervisor:
        """Unload now (admin API); 409 while requests are in flight."""
        model = self.supervisor(await self.lookup(name))
        await model.stop()
        return model

    # --- what supervisors ask of the registry (supervisor.Host) --------------------------------
    async def start_backend(self, model: ModelSupervisor) -> Backend:
        return await self.launcher.start(model)

    async def make_room(self, model: ModelSupervisor) -> None:
        """Room for one more model, evicting or waiting (``Placer.make_room``)."""
        await self.placer.make_room(model, self.config.server, self.supervisors.all)

    def went_idle(self, model: ModelSupervisor) -> None:
        self.placer.went_idle()

    def load_finished(self, model: ModelSupervisor, seconds: float | None) -> None:
        if seconds is not None:
            self.placer.loaded(model, self.supervisors.all)
        if self.metrics is None:
            return
        if seconds is None:
            self.metrics.load_failures.labels(model.spec.name).inc()
        else:
            self.metrics.load_duration.labels(model.spec.name).observe(seconds)

    def _count_failure(self, model: ModelSupervisor) -> None:
        self.worker_failures += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.labels(model.spec.name).inc()

    async def reload(self, path: Path | None) -> Config | None:
        """Re-read models.yaml and rescan: the configuration read, or None (broken: told, old one kept)."""
        try:
            config = await asyncio.to_thread(load_config, path)
        except ConfigError as e:
            for line in e.problems:
                log.error("reload refused, keeping the running configuration: %s", line)
            return None
        for line in config.warnings:
            log.warning("%s", line)
        self.config = self.catalog.config = config
        await asyncio.to_thread(self.catalog.refresh)
        self.upstreams.check_seconds = config.server.upstream_check_seconds
        self.upstreams.sync(self.catalog.specs())
        for name, model in list(self.supervisors.by_name.items()):
            if self.resolve(name, loaded_first=False, scoped=False) != model.spec:
                self.supervisors.drop(name)
            else:
                model.timing = self._timing(model.spec)
        log.info("configuration reloaded: %d models", len(self.specs()))
        return config

    async def preload(self) -> None:
        async def one(spec: ModelSpec) -> None:
            try:
                await self.load(spec.name)
            except ApiError as e:
                log.error("preload of %r failed: %s", spec.name, e.message)
        await asyncio.gather(*(one(s) for s in self.specs() if s.preload or s.pin))

    async def close(self) -> None:
        """Stop every backend and pull (at shutdown)."""
        await self.pulls.close()
        models = self.supervisors.all()
        await asyncio.gather(*(m.cancel_load() for m in models), return_exceptions=True)
        await asyncio.gather(*(m.unload() for m in models), return_exceptions=True)
        await self.launcher.close()


def upstream_rows(registry: Registry) -> list[tuple[str, str]]:
    """(upstream, health state) for every upstream the configuration names."""
    return [(h.name, h.state.value) for h in registry.upstreams.known()]
