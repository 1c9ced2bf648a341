"""Name -> ModelSpec -> a running worker, and the lifecycle of every loaded model.

Resolution: models loaded or loading now (by name and alias), then the catalog
(``catalog.py``: models.yaml, then discovery; a miss rescans the stores, at most every
``rescan_seconds``); a ``name:tag`` that matched nothing tries ``name``.

Each model has a record (``ModelRecord``) whose state moves as ``lifecycle.py`` draws it.
One load runs per model however many requests wait for it (single flight). A request
waits up to ``server.load_timeout`` for a load, then gets 503 ``model_loading``; a failed
model answers 503 ``model_load_failed`` with ``Retry-After`` until its back-off (5 s,
doubling to 5 min) has passed. With ``server.max_loaded_models`` reached, the least
recently used idle model is unloaded first; a model with requests in flight never is.
A reload (SIGHUP) swaps the tables; a loaded model whose entry changed or vanished
finishes its requests and is unloaded when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from . import discovery, lifecycle, placement
from .backend import CHAT, EMBEDDINGS, TOKENIZE, Backend
from .catalog import DEMO_NAME, ModelCatalog, ensure_demo_model  # noqa: F401 (DEMO_NAME, ensure_demo_model: re-exported)
from .config import Config, ConfigError, ModelSpec, load_config, normalize_name
from .engine import protocol
from .engine.client import LoadFailed, WorkerProcess
from .engine.protocol import LoadParams
from .errors import ApiError, ModelNotFound
from .ggufmeta import GGUFInfo, ModelFileError
from .lifecycle import ModelState
from .metrics import Metrics

log = logging.getLogger(__name__)

UNLOADED, LOADING, READY, FAILED = ModelState.UNLOADED, ModelState.LOADING, ModelState.READY, ModelState.FAILED


def _parallel(spec: ModelSpec) -> int:
    """Requests a model's worker decodes at once; the rest wait in its queue."""
    return 1 if spec.embeddings else spec.parallel


@dataclass
class ModelRecord:
    """What the registry keeps of one model: its state, its worker, its load and its requests."""

    spec: ModelSpec
    state: ModelState = UNLOADED
    worker: WorkerProcess | None = None
    load: asyncio.Task | None = None
    error: str | None = None
    failures: int = 0
    retry_at: float = 0.0
    in_flight: int = 0
    last_used: float = 0.0
    timer: asyncio.TimerHandle | None = None
    retiring: bool = False  # replaced by a reload: unload once idle
    waiting: int = 0  # requests waiting for this model to load

    def move(self, new: ModelState) -> None:
        """The one place a model's state changes (``lifecycle.MOVES`` says where it may go)."""
        self.state = lifecycle.move(self.state, new)


class Registry:
    def __init__(self, config: Config, *, demo_dir: Path | None = None, allow_demo: bool = False,
                 rescan_seconds: float = 5.0, backoff: tuple[float, float] = (5.0, 300.0)):
        self.config = config
        self.catalog = ModelCatalog(config, demo_dir=demo_dir, allow_demo=allow_demo, rescan_seconds=rescan_seconds)
        self.backoff = backoff  # a failed load's first wait before the next attempt, and its cap
        self._records: dict[str, ModelRecord] = {}
        self._retired: list[ModelRecord] = []
        self._released: asyncio.Event | None = None
        self.worker_failures = 0  # workers that exited without being asked to
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
        ``name:tag`` that matched nothing tries ``name``."""
        for key in self.catalog.keys(name):
            for record in self._records.values() if loaded_first else ():
                if record.state in (LOADING, READY) and key in map(normalize_name, record.spec.names):
                    return record.spec
            if (spec := self.catalog.get(key)) is not None:
                return spec
        return None

    async def lookup(self, name: object) -> ModelSpec:
        """``resolve``, rescanning the stores once on a miss (at most every ``rescan_seconds``)."""
        spec = self.resolve(name)
        if spec is None and self.catalog.stale():
            await asyncio.to_thread(self.catalog.refresh)
            spec = self.resolve(name)
        if spec is None:
            raise ModelNotFound(name if isinstance(name, str) else repr(name))
        return spec

    def specs(self) -> list[ModelSpec]:
        return self.catalog.specs()

    def names_of(self, spec: ModelSpec) -> list[str]:
        return self.catalog.names_of(spec)

    def conflicts_won(self, spec: ModelSpec) -> dict[str, list[Path]]:
        return self.catalog.conflicts_won(spec)

    def info(self, spec: ModelSpec) -> GGUFInfo | None:
        return self.catalog.info(spec)

    # --- lifecycle -------------------------------------------------------------------------
    def record(self, spec: ModelSpec) -> ModelRecord:
        record = self._records.get(spec.name)
        if record is None or record.spec != spec:
            if record is not None:
                self._retire(record)
            record = self._records[spec.name] = ModelRecord(spec)
        return record

    def metrics_rows(self) -> list[tuple[str, str, int, int]]:
        """(model, state, requests in flight, requests queued) for every resolvable model."""
        rows = []
        for spec in self.specs():
            record = self.state(spec)
            behind = max(0, record.worker.in_flight - _parallel(spec)) if record.worker is not None else 0
            rows.append((spec.name, record.state.value, record.in_flight, record.waiting + behind))
        return rows

    def in_flight(self) -> int:
        return sum(s.in_flight for s in [*self._records.values(), *self._retired])

    def abort_all(self, message: str) -> None:
        """End every request in flight now with an error (the drain time ran out)."""
        for record in [*self._records.values(), *self._retired]:
            if record.worker is not None:
                record.worker.abort_all(message)

    def loaded(self) -> dict[str, WorkerProcess]:
        return {s.spec.name: s.worker for s in self._records.values() if s.worker is not None and s.worker.alive}

    def state(self, spec: ModelSpec) -> ModelRecord:
        return self._records.get(spec.name) or ModelRecord(spec)

    @contextlib.asynccontextmanager
    async def lease(self, name: object, *,
                    embeddings: bool | None = False) -> AsyncIterator[tuple[ModelSpec, Backend]]:
        """The model's running backend for one request; the model stays loaded meanwhile.
        ``embeddings``: the request wants vectors (True) or text (False); a model serves one or
        the other, the wrong one is a 501 (known from the spec before any load, and checked
        against what the backend says it serves). None: either (tokenize)."""
        spec = await self.lookup(name)
        if embeddings is not None and spec.embeddings != embeddings:
            what = ("cannot embed: give it `embeddings: true` in models.yaml" if embeddings else
                    "is an embedding model: use /v1/embeddings")
            raise ApiError(f"model {spec.name!r} {what}", status=501, param="model", code="unsupported_model")
        record = self.record(spec)
        limit = self.config.server.max_queue
        if record.waiting + record.in_flight - _parallel(spec) >= limit:  # every sequence busy and `limit` waiting
            raise ApiError(f"model {spec.name!r} already has {limit} request(s) waiting (server.max_queue); "
                           "retry shortly", status=429, param="model", code="queue_full", headers={"Retry-After": "2"})
        record.waiting += 1
        try:
            worker = await self._ready(record)
        finally:
            record.waiting -= 1
        wanted = {True: EMBEDDINGS, False: CHAT, None: TOKENIZE}[embeddings]
        if wanted not in worker.serves:
            raise ApiError(f"model {spec.name!r} does not serve {wanted} requests", status=501, param="model",
                           code="unsupported_model")
        record.in_flight += 1
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        try:
            yield spec, worker
        finally:
            record.in_flight -= 1
            record.last_used = time.monotonic()
            if record.in_flight == 0:
                self._idle(record)

    async def load(self, name: object) -> ModelRecord:
        """Load a model without a request (admin API, preload)."""
        spec = await self.lookup(name)
        record = self.record(spec)
        await self._ready(record)
        return record

    async def _ready(self, record: ModelRecord) -> Backend:
        if record.worker is not None and record.worker.alive:
            return record.worker
        now = time.monotonic()
        if record.state == FAILED and now < record.retry_at and record.load is None:
            raise _load_failed(record.spec, record.error or "unknown error", record.retry_at - now)
        if record.load is None:
            record.load = asyncio.ensure_future(self._load(record))
            record.load.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved here, raised to waiters
        load = record.load
        # asyncio.wait: a caller that gives up does not cancel a load others may be waiting on,
        # and a load cancelled under it (an unload, shutdown) is told apart from the caller's own
        done, _ = await asyncio.wait({load}, timeout=self.config.server.load_timeout)
        if not done:
            raise ApiError(f"model {record.spec.name!r} is loading; retry shortly", status=503, param="model",
                           code="model_loading", headers={"Retry-After": "5"})
        if load.cancelled():
            raise ApiError(f"model {record.spec.name!r} was unloaded while it loaded; retry", status=503,
                           param="model", code="model_unloaded", headers={"Retry-After": "1"})
        return load.result()

    async def _load(self, record: ModelRecord) -> WorkerProcess:
        spec = record.spec
        record.move(LOADING)
        began = time.monotonic()
        try:
            await self._make_room(record)
            await asyncio.to_thread(discovery.INFO_CACHE.get, spec.path)  # a bad file fails here, before a spawn
            worker = WorkerProcess(LoadParams(
                name=spec.name, path=str(spec.path), n_ctx=spec.n_ctx, n_gpu_layers=spec.n_gpu_layers,
                n_threads=spec.n_threads, n_batch=spec.n_batch, parallel=spec.parallel, flash_attn=spec.flash_attn,
                repack=spec.repack, swa_full=spec.swa_full, use_mmap=spec.use_mmap,
                chat_template=spec.chat_template, embeddings=spec.embeddings,
                stream_interval=self.config.server.stream_interval_ms / 1000,
            ), on_exit=self._worker_exited, on_busy=self._share_cpus)
            await worker.start()
        except (ModelFileError, LoadFailed) as e:
            record.failures += 1
            first, most = self.backoff
            backoff = min(first * 2 ** (record.failures - 1), most)
            record.move(FAILED)
            record.error, record.retry_at = str(e), time.monotonic() + backoff
            if self.metrics is not None:
                self.metrics.load_failures.labels(spec.name).inc()
            log.error("model %r failed to load: %s (next attempt in %.0f s)", spec.name, e, backoff)
            raise _load_failed(spec, str(e), backoff) from None
        except BaseException:
            record.move(UNLOADED)
            raise
        finally:
            record.load = None
        record.move(READY)
        record.worker, record.error, record.failures = worker, None, 0
        if self.metrics is not None:
            self.metrics.load_duration.labels(spec.name).observe(time.monotonic() - began)
        record.last_used = time.monotonic()
        if record.in_flight == 0:
            self._idle(record)  # loaded without a request (preload, admin): keep_alive starts now
        return worker

    async def _make_room(self, record: ModelRecord) -> None:
        limit = self.config.server.max_loaded_models
        if not limit:
            return
        deadline = time.monotonic() + max(self.config.server.load_timeout, 60.0)
        while True:
            others = [s for s in [*self._records.values(), *self._retired] if s is not record]
            room, name = placement.make_room(
                [placement.Resident(str(id(s)), s.state, s.in_flight, s.last_used) for s in others], limit)
            if room is placement.Room.FITS:
                return
            if room is placement.Room.EVICT:
                victim = next(s for s in others if str(id(s)) == name)
                log.info("unloading %r (least recently used) to make room for %r", victim.spec.name, record.spec.name)
                await self._unload(victim)
                continue
            if self._released is None:
                self._released = asyncio.Event()
            self._released.clear()
            try:
                await asyncio.wait_for(self._released.wait(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                raise ApiError(f"all {limit} loaded models are busy (server.max_loaded_models); retry shortly",
                               status=503, param="model", code="model_capacity",
                               headers={"Retry-After": "5"}) from None

    def _idle(self, record: ModelRecord) -> None:
        if self._released is not None:
            self._released.set()
        if record.retiring:
            asyncio.ensure_future(self._unload(record))
            return
        keep = record.spec.keep_alive if record.spec.keep_alive is not None else self.config.server.keep_alive
        if math.isinf(keep) or record.state != READY:
            return
        if record.timer is not None:
            record.timer.cancel()
        record.timer = asyncio.get_running_loop().call_later(
            keep, lambda: asyncio.ensure_future(self._unload(record, only_if_idle=True)))

    async def _unload(self, record: ModelRecord, only_if_idle: bool = False) -> None:
        if only_if_idle and record.in_flight:
            return
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None
        worker, record.worker = record.worker, None
        if record.state == READY:
            record.move(UNLOADED)
        if worker is not None:
            log.info("unloading model %r", record.spec.name)
            await worker.stop()
        if record in self._retired:
            self._retired.remove(record)

    async def unload(self, name: object) -> ModelRecord:
        """Unload now (admin API); 409 while requests are in flight."""
        spec = await self.lookup(name)
        record = self.state(spec)
        if record.in_flight:
            raise ApiError(f"model {spec.name!r} has {record.in_flight} request(s) in flight; try again when idle",
                           status=409, param="model", code="model_busy")
        if record.load is not None:
            record.load.cancel()
            await asyncio.gather(record.load, return_exceptions=True)
        await self._unload(record)
        return record

    def _share_cpus(self, _changed: WorkerProcess | None = None) -> None:
        """Split the CPUs among the workers busy right now (``placement.cpu_shares``)."""
        workers = [s.worker for s in [*self._records.values(), *self._retired] if s.worker is not None]
        busy = {str(id(w)): w for w in workers if w.busy and w.alive}
        shares = placement.cpu_shares([(key, w.params.n_threads) for key, w in busy.items()],
                                      protocol.default_threads())
        for key, threads in shares.items():
            busy[key].set_threads(threads)

    def _worker_exited(self, worker: WorkerProcess, expected: bool) -> None:
        if not expected:
            self.worker_failures += 1
            if self.metrics is not None:
                self.metrics.worker_restarts.labels(worker.params.name).inc()
        for record in [*self._records.values(), *self._retired]:
            if record.worker is worker:
                record.worker = None
                if record.state == READY:
                    record.move(UNLOADED)

    def _retire(self, record: ModelRecord) -> None:
        record.retiring = True
        if record.state in (READY, LOADING) or record.in_flight:
            self._retired.append(record)
            if record.in_flight == 0 and record.load is None:
                asyncio.ensure_future(self._unload(record))

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
        for name, record in list(self._records.items()):
            if self.resolve(name, loaded_first=False) != record.spec:
                del self._records[name]
                self._retire(record)
        log.info("configuration reloaded: %d models", len(self.specs()))
        return True

    async def preload(self) -> None:
        async def one(spec: ModelSpec) -> None:
            try:
                await self.load(spec.name)
            except ApiError as e:
                log.error("preload of %r failed: %s", spec.name, e.message)
        await asyncio.gather(*(one(s) for s in self.specs() if s.preload))

    async def close(self) -> None:
        """Stop every worker (at shutdown)."""
        records = [*self._records.values(), *self._retired]
        for record in records:
            if record.load is not None:
                record.load.cancel()
        await asyncio.gather(*(s.load for s in records if s.load is not None), return_exceptions=True)
        await asyncio.gather(*(self._unload(s) for s in records), return_exceptions=True)


def _load_failed(spec: ModelSpec, reason: str, retry_after: float) -> ApiError:
    return ApiError(f"model {spec.name!r} failed to load: {reason}", status=503, param="model",
                    code="model_load_failed", headers={"Retry-After": str(max(1, math.ceil(retry_after)))})
