"""Name -> ModelSpec -> a running backend, for every model the gateway serves.

The registry joins three parts, each with one job:
- the catalog (``catalog.py``): names -> specs. Resolution looks at models loaded or loading
  now (by name and alias) first, then the catalog (models.yaml, then discovery; a miss
  rescans the stores, at most every ``rescan_seconds``); a ``name:tag`` that matched nothing
  tries ``name``;
- one supervisor per model (``supervisor.py``): its lifecycle, single-flight load, back-off,
  keep-alive and retirement;
- the placement policy (``placement.py``): which idle model to unload when
  ``server.max_loaded_models`` is reached, and how busy models share the CPUs.

The registry gathers the state placement decides on and carries its decisions out, starts
backends through its ``BackendFactory`` (``backend.LocalWorkers`` unless told otherwise), and
reports loads and crashes to the metrics. A reload (SIGHUP) swaps the tables; a loaded model
whose entry changed or vanished finishes its requests and is unloaded when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import devices, discovery, memory, placement, sysmem
from .backend import CHAT, EMBEDDINGS, RERANK, TOKENIZE, Backend, BackendFactory, LocalWorkers
from .catalog import DEMO_NAME, ModelCatalog, ensure_demo_model  # noqa: F401 (DEMO_NAME, ensure_demo_model: re-exported)
from .config import Config, ConfigError, ModelSpec, load_config, normalize_name
from .engine import protocol
from .errors import ApiError, ModelNotFound
from .ggufmeta import GGUFInfo
from .lifecycle import ModelState
from .metrics import Metrics
from .replicas import ReplicaSet
from .supervisor import ModelSupervisor, Progress, Timing
from .upstream import Upstreams

log = logging.getLogger(__name__)

_LIVE = (ModelState.LOADING, ModelState.READY)


def _parallel(spec: ModelSpec) -> int:
    """Requests a model's backend decodes at once; the rest wait in its queue."""
    return 1 if spec.embeddings or spec.reranker else spec.parallel


class Registry:
    def __init__(self, config: Config, *, demo_dir: Path | None = None, allow_demo: bool = False,
                 rescan_seconds: float = 5.0, backoff: tuple[float, float] = (5.0, 300.0),
                 backends: BackendFactory | None = None, upstream_backoff: tuple[float, float] = (2.0, 60.0)):
        self.config = config
        self.catalog = ModelCatalog(config, demo_dir=demo_dir, allow_demo=allow_demo, rescan_seconds=rescan_seconds)
        self.backoff = backoff  # a failed load's first wait before the next attempt, and its cap
        # starts a local model's backend (a worker process, from a spare where configured)
        self.backends = backends if backends is not None else LocalWorkers(config.server.spare_worker)
        # other machines' servers: their health, probes and listed models
        self.upstreams = Upstreams(upstream_backoff, config.server.upstream_check_seconds)
        self.upstreams.sync(self.catalog.specs())
        self.devices = devices.Inventory()  # the GPUs llama.cpp sees, for placement by memory
        self._models: dict[str, ModelSupervisor] = {}
        self._retired: list[ModelSupervisor] = []  # replaced by a reload, still holding something
        self._released: asyncio.Event | None = None
        self.worker_failures = 0  # backends that exited without being asked to
        self.metrics: Metrics | None = None  # when an app serves this registry

    # --- names (the catalog's, loaded models first) ------------------------------------------
    def refresh(self) -> None:
        """Re-read the stores (blocking I/O: call it off the event loop when serving)."""
        self.catalog.refresh()

    @property
    def found(self) -> dict[str, discovery.Found]:
        return self.catalog.found

    def resolve(self, name: object, *, loaded_first: bool = True) -> ModelSpec | None:
        """A loaded (or loading) model by any of its names first, then the catalog's answer; a
        ``name:tag`` that matched nothing tries ``name``; then models.yaml's glob aliases."""
        keys = self.catalog.keys(name)
        for key in keys:
            for model in self._models.values() if loaded_first else ():
                if model.state in _LIVE and key in map(normalize_name, model.spec.names):
                    return model.spec
            if (spec := self.catalog.get(key) or self.upstreams.resolve(key)) is not None:
                return spec
        for key in keys:  # models.yaml's glob aliases, once no model has the name itself
            if (spec := self.catalog.match(key)) is not None:
                return spec
        return None

    async def lookup(self, name: object) -> ModelSpec:
        """``resolve``, rescanning the stores once on a miss (at most every ``rescan_seconds``)."""
        spec = self.resolve(name)
        if spec is None and self.catalog.stale():
            await asyncio.to_thread(self.catalog.refresh)
            await self.upstreams.refresh(discover_only=True)
            spec = self.resolve(name)
        if spec is None:
            raise ModelNotFound(name if isinstance(name, str) else repr(name))
        return spec

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

    # --- supervisors ---------------------------------------------------------------------------
    def _timing(self, spec: ModelSpec) -> Timing:
        server = self.config.server
        keep = math.inf if spec.pin else spec.keep_alive if spec.keep_alive is not None else server.keep_alive
        return Timing(load_timeout=server.load_timeout, keep_alive=keep, backoff=self.backoff)

    def supervisor(self, spec: ModelSpec) -> ModelSupervisor:
        """The model's supervisor, made on first use; a spec that changed retires the old one."""
        model = self._models.get(spec.name)
        if model is None or model.spec != spec:
            if model is not None:
                self._retire(model)
            model = self._models[spec.name] = ModelSupervisor(spec, self, self._timing(spec), _parallel(spec))
        return model

    def state(self, spec: ModelSpec) -> ModelSupervisor:
        """The model's supervisor, or a fresh (unloaded) one that is not kept."""
        return self._models.get(spec.name) or ModelSupervisor(spec, self, self._timing(spec), _parallel(spec))

    def _all(self) -> list[ModelSupervisor]:
        self._retired = [m for m in self._retired if m.holds]
        return [*self._models.values(), *self._retired]

    def estimate(self, spec: ModelSpec) -> dict[str, Any] | None:
        """What a local model should take once loaded (``memory.estimate``), from its header, on
        the GPUs as last read (none before the first load)."""
        info = self.info(spec) if spec.path is not None else None
        if info is None:
            return None
        found = memory.estimate(info, spec, self.devices.gpus)
        return found.describe() if found is not None else None

    def metrics_rows(self) -> list[tuple[str, str, int, int, float, int, int]]:
        """(model, state, requests in flight, requests queued, how much of it is loaded: 0 to 1,
        its memory estimate, what llama.cpp allocated for it) for every resolvable model."""
        rows = []
        for spec in self.specs():
            model = self.state(spec)
            loaded = 1.0 if model.state is ModelState.READY else model.progress if model.state is ModelState.LOADING \
                else 0.0
            backend = model.backend if model.state is ModelState.READY else None
            allocated = memory.allocated(backend.info.get("buffers")) if backend is not None else None
            held = allocated["total"] if allocated else 0
            need = sum(self._need(spec).values())
            rows.append((spec.name, model.state.value, model.in_flight, model.queued(), loaded, need, held))
        return rows

    def in_flight(self) -> int:
        return sum(m.in_flight for m in self._all())

    def abort_all(self, message: str) -> None:
        """End every request in flight now with an error (the drain time ran out)."""
        for model in self._all():
            if model.backend is not None:
                model.backend.abort_all(message)

    def loaded(self) -> dict[str, Backend]:
        return {m.spec.name: m.backend for m in self._models.values() if m.backend is not None and m.backend.alive}

    @contextlib.asynccontextmanager
    async def lease(self, name: object, *, embeddings: bool | None = False, rerank: bool = False,
                    on_progress: Progress | None = None) -> AsyncIterator[tuple[ModelSpec, Backend]]:
        """The model's running backend for one request; the model stays loaded meanwhile.
        ``on_progress``: told how a load the request waits for goes (``ModelSupervisor.ready``).
        ``embeddings``: the request wants vectors (True) or text (False); ``rerank``: scores. A
        model serves one of these, the wrong one is a 501 (known from the spec before any load,
        and checked against what the backend says it serves). ``embeddings=None``: any (tokenize)."""
        spec = await self.lookup(name)
        want = RERANK if rerank else {True: EMBEDDINGS, False: CHAT, None: TOKENIZE}[embeddings]
        has = RERANK if spec.reranker else EMBEDDINGS if spec.embeddings else CHAT
        if want != TOKENIZE and spec.local and want != has:
            what = {RERANK: "is not a reranker: give it `reranker: true` in models.yaml",
                    EMBEDDINGS: "cannot embed: give it `embeddings: true` in models.yaml",
                    CHAT: "is a reranker: use /v1/rerank" if has == RERANK else
                    "is an embedding model: use /v1/embeddings"}[want]
            raise ApiError(f"model {spec.name!r} {what}", status=501, param="model", code="unsupported_model")
        kind = want
        try:
            async with self.supervisor(spec).lease(kind, self.config.server.max_queue, on_progress) as backend:
                yield spec, backend
        except ApiError as err:
            err.model = err.model or spec.name
            raise

    async def load(self, name: object) -> ModelSupervisor:
        """Load a model without a request (admin API, preload)."""
        model = self.supervisor(await self.lookup(name))
        await model.ready()
        return model

    def keep_alive(self, spec: ModelSpec, seconds: float | None) -> None:
        """A request's keep_alive (Ollama's): the model stays loaded this long once idle, from
        now on (None: leave it as it is)."""
        if seconds is not None and not spec.pin:  # a pinned model stays loaded whatever a request asks
            self.supervisor(spec).keep_alive = seconds

    async def unload(self, name: object) -> ModelSupervisor:
        """Unload now (admin API); 409 while requests are in flight."""
        model = self.state(await self.lookup(name))
        await model.stop()
        return model

    # --- what supervisors ask of the registry (supervisor.Host) --------------------------------
    async def start_backend(self, model: ModelSupervisor) -> Backend:
        def on_exit(backend: Backend, expected: bool) -> None:
            self._backend_exited(model, backend, expected)

        if model.spec.replicas:
            return await ReplicaSet.start(model.spec, lambda spec, exited: self._start(spec, exited, model),
                                          on_exit, self.backoff)
        return await self._start(model.spec, on_exit, model)

    async def _start(self, spec: ModelSpec, on_exit, model: ModelSupervisor) -> Backend:
        """One backend: an upstream's, or a local worker through the factory."""
        if spec.upstream is not None:
            return self.upstreams.backend(spec)
        if model.spec.replicas:  # a replica's crash is counted as the model's
            def exited(backend: Backend, expected: bool) -> None:
                if not expected:
                    self._count_failure(model)
                on_exit(backend, expected)
            return await self.backends(spec, self.config.server, on_exit=exited, on_busy=self._share_cpus,
                                       on_progress=model.loaded_part)
        return await self.backends(spec, self.config.server, on_exit=on_exit, on_busy=self._share_cpus,
                                   on_progress=model.loaded_part)

    async def make_room(self, model: ModelSupervisor) -> None:
        """Carry out ``placement.make_room`` until the model fits (in number and in the memory of
        each device), waiting while every loaded model is busy (503 ``model_capacity`` after the
        load timeout, and at least a minute); 503 ``model_too_large`` at once for one that
        cannot fit at all. The GPUs are read once, before the first decision."""
        limit = self.config.server.max_loaded_models
        if not any(m.local for m in model.spec.members):  # another machine's memory
            return
        deadline = time.monotonic() + max(self.config.server.load_timeout, 60.0)
        reading: devices.Reading | None = None
        while True:
            others = {str(id(m)): m for m in self._all()
                      if m is not model and any(s.local for s in m.spec.members)}
            if reading is None:  # recent where the model puts layers on a GPU; the first reading tells
                on_gpu = model.spec.n_gpu_layers != 0 and not model.spec.rpc and model.spec.devices != ()
                reading = await self.devices.read(functools.partial(self._held_by_pool, list(others.values())),
                                                  devices.GPU_READING_MAX_AGE if on_gpu else None)
            gpus = reading.gpus
            need = devices.with_unified(self._need(model.spec), gpus)
            residents = [replace(m.resident(key), memory=devices.with_unified(self._held(m), gpus))
                         for key, m in others.items()]
            capacity = await self._capacity(sum(r.memory.get(sysmem.RAM, 0) for r in residents), reading)
            room, name = placement.make_room(residents, limit, need, {pool: n for pool, (n, _) in capacity.items()})
            if room is placement.Room.FITS:
                return
            if room is placement.Room.TOO_LARGE:
                pool = next((p for p, n in need.items() if p in capacity and n > capacity[p][0]),
                            next((p for p in need if p in capacity), sysmem.RAM))
                where = "" if pool == sysmem.RAM else f" on {pool}"
                room_there, why = capacity.get(pool, (0, "memory is not known"))
                raise ApiError(f"model {model.spec.name!r} needs about {devices.gib(need.get(pool, 0))}{where} "
                               f"(weights, KV cache and compute: see memory_estimate in /models), more than the "
                               f"{devices.gib(room_there)} its models may hold there ({why}); give it a smaller "
                               "n_ctx or parallel, a smaller quantization, fewer n_gpu_layers, or more memory",
                               status=503, param="model", code="model_too_large")
            if room is placement.Room.NEVER:
                raise ApiError(f"pinned models fill all {limit} places (server.max_loaded_models); {model.spec.name!r} "
                               "cannot load beside them: raise the limit or unpin one", status=503, param="model",
                               code="model_capacity")
            if room is placement.Room.EVICT and name is not None:
                victim = others[name]
                log.info("unloading %r (least recently used) to make room for %r", victim.spec.name, model.spec.name)
                await victim.unload()
                continue
            if self._released is None:
                self._released = asyncio.Event()
            self._released.clear()
            try:
                await asyncio.wait_for(self._released.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                raise ApiError(f"all loaded models are busy and {model.spec.name!r} does not fit beside them "
                               f"(server.max_loaded_models: {limit}, memory); retry shortly",
                               status=503, param="model", code="model_capacity",
                               headers={"Retry-After": "5"}) from None

    def _need(self, spec: ModelSpec) -> dict[str, int]:
        """What a model should take, by pool."""
        found = self.estimate(spec)
        return dict(found["devices"]) if found else {}

    def _held(self, model: ModelSupervisor) -> dict[str, int]:
        """What a model holds by pool: what llama.cpp allocated for it (and, on each GPU, its
        runtime's context, which no buffer shows), else (loading) its estimate."""
        if model.state not in (ModelState.LOADING, ModelState.READY) or model.spec.path is None:
            return {}
        backend = model.backend
        held = memory.allocated(backend.info.get("buffers")) if backend is not None and backend.alive else None
        if not held:
            return self._need(model.spec)
        return {pool: n + memory.gpu_context(pool) for pool, n in held["devices"].items()}

    def _held_by_pool(self, models: Iterable[ModelSupervisor]) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in models:
            for pool, n in self._held(m).items():
                out[pool] = out.get(pool, 0) + n
        return out

    async def _capacity(self, held_ram: int, reading: devices.Reading) -> dict[str, tuple[int, str]]:
        """The bytes the models may hold in each pool, and why that much (``devices.capacities``)."""
        server = self.config.server
        ram = await asyncio.to_thread(sysmem.read)
        return devices.capacities(ram, held_ram, reading, server.memory_budget, server.memory_reserve)

    def went_idle(self, model: ModelSupervisor) -> None:
        if self._released is not None:
            self._released.set()

    def load_finished(self, model: ModelSupervisor, seconds: float | None) -> None:
        found = model.backend.info.get("devices") if seconds is not None and model.backend is not None else None
        if isinstance(found, list) and found:  # the worker's reading, with its model loaded (of its own
            # devices only, where models.yaml names them)
            self.devices.take(found, lambda: self._held_by_pool(self._all()), partial=model.spec.devices is not None)
        if self.metrics is None:
            return
        if seconds is None:
            self.metrics.load_failures.labels(model.spec.name).inc()
        else:
            self.metrics.load_duration.labels(model.spec.name).observe(seconds)

    def _share_cpus(self) -> None:
        """Split the CPUs among the backends busy right now (``placement.cpu_shares``)."""
        busy = {str(id(m)): m for m in self._all() if m.backend is not None and m.backend.busy and m.backend.alive}
        shares = placement.cpu_shares([(key, m.spec.n_threads) for key, m in busy.items()],
                                      protocol.default_threads())
        for key, threads in shares.items():
            backend = busy[key].backend
            if backend is not None:
                backend.set_threads(threads)

    def _backend_exited(self, model: ModelSupervisor, backend: Backend, expected: bool) -> None:
        if not expected and not model.spec.replicas:
            self._count_failure(model)
        model.backend_exited(backend)

    def _count_failure(self, model: ModelSupervisor) -> None:
        self.worker_failures += 1
        if self.metrics is not None:
            self.metrics.worker_restarts.labels(model.spec.name).inc()

    def upstream_rows(self) -> list[tuple[str, str]]:
        """(upstream, health state) for every upstream the configuration names."""
        return [(h.name, h.state.value) for h in self.upstreams.known()]

    def replica_rows(self) -> list[tuple[str, str, bool, int, int]]:
        """(model, replica, up, requests, failovers) for every running model with replicas."""
        return [(m.spec.name, *row) for m in self._all() if isinstance(m.backend, ReplicaSet)
                for row in m.backend.rows()]

    def _retire(self, model: ModelSupervisor) -> None:
        model.retire()
        if model.holds:
            self._retired.append(model)

    async def reload(self, path: Path | None) -> bool:
        """Re-read models.yaml and rescan; a broken file is reported and the old configuration stays."""
        try:
            config = await asyncio.to_thread(load_config, path)
        except ConfigError as e:
            for line in e.problems:
                log.error("reload refused, keeping the running configuration: %s", line)
            return False
        for line in config.warnings:
            log.warning("%s", line)
        self.config = self.catalog.config = config
        await asyncio.to_thread(self.catalog.refresh)
        self.upstreams.check_seconds = config.server.upstream_check_seconds
        self.upstreams.sync(self.catalog.specs())
        for name, model in list(self._models.items()):
            if self.resolve(name, loaded_first=False) != model.spec:
                del self._models[name]
                self._retire(model)
            else:
                model.timing = self._timing(model.spec)
        log.info("configuration reloaded: %d models", len(self.specs()))
        return True

    async def preload(self) -> None:
        async def one(spec: ModelSpec) -> None:
            try:
                await self.load(spec.name)
            except ApiError as e:
                log.error("preload of %r failed: %s", spec.name, e.message)
        await asyncio.gather(*(one(s) for s in self.specs() if s.preload or s.pin))

    async def close(self) -> None:
        """Stop every backend (at shutdown)."""
        models = self._all()
        await asyncio.gather(*(m.cancel_load() for m in models), return_exceptions=True)
        await asyncio.gather(*(m.unload() for m in models), return_exceptions=True)
        if isinstance(self.backends, LocalWorkers):
            await self.backends.close()
