"""One model's lifecycle: ``ModelSupervisor``.

A supervisor leases its model's backend to requests, starts the backend when the first
request needs it (one start however many requests wait: single flight), backs off after a
failed start (``Timing.backoff``: the first wait, doubling up to the cap), settles how a
loaded backend's answers are read (its ``Formats``, kept in its info), unloads the model
when it has been idle for ``keep_alive``, and unloads it once idle after a reload replaced it
(retiring). Its state moves only as ``lifecycle.py`` draws it, and only in ``move``.

What a supervisor cannot decide alone it asks its ``Host`` (the registry): room for one more
model, a started backend, and telling others that a model went idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..access.claims import CLAIM
from ..backends.local import CHAT, EMBEDDINGS, RERANK, TOKENIZE, Backend, StartFailed
from ..base.errors import ApiError
from ..models import lifecycle, placement
from ..models.config import ModelSpec
from ..models.ggufmeta import ModelFileError, split_parts
from ..models.lifecycle import ModelState
from ..text.formats import FORMATS, Formats
from .adapters import ModelAdapters
from .slots import Door, FairSlots, Keys, Unkeyed, Waits, queue_full

log = logging.getLogger(__name__)

UNLOADED, LOADING, READY, FAILED = ModelState.UNLOADED, ModelState.LOADING, ModelState.READY, ModelState.FAILED


# A streamed request waiting for a load is told how it goes (``ready``'s ``on_progress``) once it
# has waited this long, so a quick load's failure is still an error status rather than a stream;
# then at each report and at least this often, which also keeps idle-timeout proxies patient.
PROGRESS_AFTER = 1.0
PROGRESS_EVERY = 5.0

Progress = Callable[[float], Awaitable[None]]
# asked by ``ready`` where the caller would begin a load (none under way): the refusal it raises,
# or None (``queues.refuser``: a key's may_load, read then, not only as the request came in)
Refuse = Callable[[], ApiError | None]

LOADED = "loaded"  # a backend's info: the ``Loaded`` of its start


@dataclass(frozen=True)
class Loaded:
    """A backend's start, as traces tell it: when it began and ended (``time.monotonic()``),
    the model's file bytes (all its split parts; 0: no local file) and where its spec came from
    (``ModelSpec.source``: models.yaml, discovered, demo, upstream)."""

    began: float
    ended: float
    bytes: int
    source: str


def file_bytes(spec: ModelSpec) -> int:
    """The bytes of a local model's files, every split part counted; 0 where there is none."""
    if spec.path is None:
        return 0
    try:
        return sum(p.stat().st_size for p in split_parts(spec.path))
    except (OSError, ModelFileError):
        return 0


@dataclass(frozen=True)
class Timing:
    """A supervisor's clocks, in seconds."""

    load_timeout: float = 600.0  # a request waits this long for a load, then gets 503 model_loading
    keep_alive: float = 300.0  # idle this long: unload (inf: never)
    backoff: tuple[float, float] = (5.0, 300.0)  # after a failed start: the first wait, and the cap


class Host(Protocol):
    """What a supervisor asks of the registry that owns it."""

    async def make_room(self, supervisor: ModelSupervisor) -> None:
        """Return once one more model may load beside the others (evicting an idle one if need be)."""

    async def start_backend(self, supervisor: ModelSupervisor) -> Backend:
        """A running backend for ``supervisor.spec``; raises ``StartFailed``."""

    def went_idle(self, supervisor: ModelSupervisor) -> None:
        """The model has nothing in flight now (a load waiting for room may go on)."""

    def load_finished(self, supervisor: ModelSupervisor, seconds: float | None) -> None:
        """A start succeeded after ``seconds``, or failed (None)."""


class ModelSupervisor:
    def __init__(self, spec: ModelSpec, host: Host, timing: Timing, parallel: int, keys: Keys | None = None):
        self.spec, self.host, self.timing = spec, host, timing
        self.parallel = parallel  # requests the backend decodes at once; the rest wait in its queue
        self.state = UNLOADED
        self.backend: Backend | None = None
        self.load: asyncio.Task[Backend] | None = None
        self.error: str | None = None
        self.failures = 0  # failed starts in a row
        self.retry_at = 0.0  # time.monotonic() before which a failed model is not started again
        self.in_flight = 0  # requests holding a lease or waiting for a slot (``slots.queued`` of them)
        self.waits = Waits()  # requests waiting: for the door, the load, a slot
        self._stops: set[asyncio.Future[None]] = set()  # backend stops under way (held: the loop keeps weak references)
        self.last_used = 0.0
        self.retiring = False  # replaced by a reload: unload once idle
        self.keep_alive: float | None = None  # a request's own (Ollama's), over timing.keep_alive; 0: once idle
        self._timer: asyncio.TimerHandle | None = None
        self.progress = 0.0  # of the load under way, 0 to 1 (the backend's reports)
        self._progressed: asyncio.Future[None] | None = None  # done at the next report; waiters watch it
        self.adapters = ModelAdapters()  # its LoRA adapters loaded at run time, and the default scales set
        # who goes first into a free slot (``slots.py``, ``fairness.py``); another server's queue is its own
        self.slots = FairSlots(spec.name, parallel, keys or Unkeyed())
        self.door = Door()  # closed while a swap drains it: new requests wait, then load it again

    def move(self, new: ModelState) -> None:
        """The one place a model's state changes (``lifecycle.MOVES`` says where it may go)."""
        self.state = lifecycle.move(self.state, new)

    def loaded_part(self, fraction: float) -> None:
        """The backend's load has gone this far (0 to 1): reported in /models and the metrics,
        and told to the streamed requests that wait for it."""
        self.progress = max(0.0, min(1.0, fraction))
        if self._progressed is not None and not self._progressed.done():
            self._progressed.set_result(None)
        self._progressed = None

    def _next_progress(self) -> asyncio.Future[None]:
        if self._progressed is None:
            self._progressed = asyncio.get_running_loop().create_future()
        return self._progressed

    @property
    def holds(self) -> bool:
        """Whether the model holds (or is about to hold) memory or requests."""
        return self.state in (LOADING, READY) or self.in_flight > 0 or self.load is not None

    @property
    def stopping(self) -> bool:
        """Whether a backend's stop is under way (its worker not yet gone)."""
        return bool(self._stops)

    def resident(self, key: str) -> placement.Resident:
        return placement.Resident(key, self.state, self.in_flight, self.last_used, self.spec.pin)

    def running(self) -> int:  # requests holding a lease: in flight, less those waiting for a slot
        return self.in_flight - self.slots.queued

    def queued(self) -> int:
        """Requests waiting: for the door, the load, a slot, and behind the backend's busy sequences."""
        behind = max(0, self.backend.in_flight - self.parallel) if self.backend is not None else 0
        return len(self.waits) + self.slots.queued + behind

    # --- requests ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, kind: str, max_queue: int, on_progress: Progress | None = None,
                    refuse: Refuse | None = None) -> AsyncIterator[Backend]:
        """The running backend for one request of ``kind``; the model stays loaded meanwhile.
        429 past ``max_queue`` waiting requests; 501 when the backend does not serve ``kind``
        (``refusal``; the registry asks it of the spec before a load).
        ``on_progress``: told how a load the request waits for goes (``ready``); ``refuse``: as ``ready``'s.
        A local model's generations, embeddings and scores each take one of its slots, in the
        order ``fairness.py`` decides (the request's ``CLAIM``); tokenizing takes none."""
        if len(self.waits) + self.in_flight - self.parallel >= max_queue and not self.slots.make_way(
                CLAIM.get(), queue_full(self.spec.name, max_queue, pushed=True)):
            raise queue_full(self.spec.name, max_queue)
        with self.waits.one():
            await self.door.through(self.spec.name, self.timing.load_timeout)
            backend = await self.ready(on_progress, refuse)
            if (refused := refusal(self.spec, kind, backend.serves)) is not None:
                raise refused
        # in flight from here, a slot waited for included: a model with requests waiting for its
        # slots is busy (never idle, evicted or stopped while they wait)
        self.in_flight += 1
        self._cancel_timer()
        slot = None
        try:
            if kind != TOKENIZE and self.spec.local:
                slot = await self.slots.take(CLAIM.get())
                if not backend.alive:  # gone while it waited (a crash): the next start's, once
                    backend = await self.ready(on_progress, refuse)
            yield backend
        finally:
            self.in_flight -= 1
            self.last_used = time.monotonic()
            if slot is not None:
                self.slots.give(slot)
            if self.in_flight == 0:
                self._idle()

    async def ready(self, on_progress: Progress | None = None, refuse: Refuse | None = None) -> Backend:
        """The running backend, starting it if need be (one start for all who wait).
        ``on_progress(fraction)`` is awaited while the caller waits for a load: first once the
        wait has lasted ``PROGRESS_AFTER``, then at each new report and at least every
        ``PROGRESS_EVERY``; what it raises ends the caller's wait, not the load. ``refuse``: ``Refuse``."""
        if self.backend is not None and self.backend.alive:
            return self.backend
        now = time.monotonic()
        if self.state == FAILED and now < self.retry_at and self.load is None:
            raise load_failed(self.spec, self.error or "unknown error", self.retry_at - now)
        if self.load is None:
            if refuse is not None and (refused := refuse()) is not None:
                raise refused  # this request may not begin a load (its key's may_load: false)
            self.progress = 0.0  # a new load: what the last one reached says nothing
            self.load = asyncio.ensure_future(self._load())
            self.load.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved here, raised to waiters
        load = self.load
        # asyncio.wait: a caller that gives up does not cancel a load others may be waiting on,
        # and a load cancelled under it (an unload, shutdown) is told apart from the caller's own
        if not await self._wait(load, on_progress):
            raise ApiError(f"model {self.spec.name!r} is loading; retry shortly", status=503, param="model",
                           code="model_loading", headers={"Retry-After": "5"})
        if load.cancelled():
            raise ApiError(f"model {self.spec.name!r} was unloaded while it loaded; retry", status=503,
                           param="model", code="model_unloaded", headers={"Retry-After": "1"})
        return load.result()

    async def _wait(self, load: asyncio.Future[Backend], on_progress: Progress | None) -> bool:
        """Wait for ``load`` up to the load timeout, telling ``on_progress``; whether it ended."""
        now = time.monotonic()
        deadline = now + self.timing.load_timeout
        tell_at = now + PROGRESS_AFTER if on_progress is not None else math.inf
        telling = False
        while not load.done():
            now = time.monotonic()
            if now >= deadline:
                return False
            if on_progress is not None and now >= tell_at:
                await on_progress(self.progress)
                telling, tell_at = True, time.monotonic() + PROGRESS_EVERY
                continue
            report = self._next_progress() if telling else None
            watch: set[asyncio.Future] = {load} if report is None else {load, report}
            await asyncio.wait(watch, timeout=min(deadline, tell_at) - now, return_when=asyncio.FIRST_COMPLETED)
            if report is not None and report.done():
                tell_at = time.monotonic()  # a new report: tell it now
        return True

    async def _load(self) -> Backend:
        self.move(LOADING)
        began = time.monotonic()
        try:
            await self.host.make_room(self)
            backend = await self.host.start_backend(self)
        except StartFailed as e:
            self.failures += 1
            backoff = placement.backoff(self.failures, *self.timing.backoff)
            self.move(FAILED)
            self.error, self.retry_at = str(e), time.monotonic() + backoff
            self.host.load_finished(self, None)
            log.error("model %r failed to load: %s (next attempt in %.0f s)", self.spec.name, e, backoff)
            raise load_failed(self.spec, str(e), backoff) from None
        except BaseException:
            self.move(UNLOADED)
            raise
        finally:
            self.load = None
        # how its answers are read follows from its settings and what it reported, which hold
        # while it stays loaded: settled once here, kept with it (``text/formats.py``)
        backend.info[FORMATS] = Formats.settle(self.spec.reasoning, self.spec.tool_format, backend.info)
        backend.info[LOADED] = Loaded(began, time.monotonic(), file_bytes(self.spec), self.spec.source)
        self.move(READY)
        self.backend, self.error, self.failures = backend, None, 0
        self.host.load_finished(self, time.monotonic() - began)
        self.last_used = time.monotonic()
        if self.in_flight == 0:
            self._idle()  # loaded without a request (preload, admin): keep_alive starts now
        return backend

    # --- going idle, unloading ---------------------------------------------------------------
    def keep_for(self, seconds: float) -> None:
        """A request's keep_alive: how long the model stays loaded once idle, from now on. An
        idle model's clock starts again now (Ollama's empty prompt: load it, and keep it so long)."""
        self.keep_alive = seconds
        if self.in_flight == 0 and self.state == READY and not self.retiring:
            self._cancel_timer()
            self.last_used = time.monotonic()
            self._idle()

    def _idle(self) -> None:
        self.host.went_idle(self)
        if self.retiring:
            asyncio.ensure_future(self.unload())
            return
        keep = self.keep_alive if self.keep_alive is not None else self.timing.keep_alive
        if math.isinf(keep) or self.state != READY:
            return
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(
            keep, lambda: asyncio.ensure_future(self.unload(only_if_idle=True)))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def unload(self, only_if_idle: bool = False) -> None:
        """Stop the backend (requests in flight end with it; ``only_if_idle``: not if there are any)."""
        if only_if_idle and self.in_flight:
            return
        self._cancel_timer()
        self.door.open()  # what waited for a swap goes on: to a load of its own
        backend, self.backend = self.backend, None
        if self.state == READY:
            self.move(UNLOADED)
        if backend is not None:
            log.info("unloading model %r", self.spec.name)
            # The stop outlives whoever asked for it: a caller cancelled mid-stop (a client that
            # left) must not leave the backend running unseen, its kill skipped.
            stopping = asyncio.ensure_future(backend.stop())
            self._stops.add(stopping)
            stopping.add_done_callback(self._stops.discard)
            await asyncio.shield(stopping)
        elif self._stops:  # a stop under way (a retired model's): whoever unloads waits for it too
            await asyncio.shield(asyncio.gather(*self._stops, return_exceptions=True))

    async def stop(self) -> None:
        """Unload now, a load under way included (admin API, shutdown); 409 with requests in flight."""
        if self.in_flight:
            raise ApiError(f"model {self.spec.name!r} has {self.in_flight} request(s) in flight; try again when idle",
                           status=409, param="model", code="model_busy")
        await self.cancel_load()
        await self.unload()

    async def cancel_load(self) -> None:
        if self.load is not None:
            self.load.cancel()
            await asyncio.gather(self.load, return_exceptions=True)

    def retire(self) -> None:
        """A reload replaced this model's entry: finish the requests in flight, then unload."""
        self.retiring = True
        if self.in_flight == 0 and self.load is None and self.state == READY:
            asyncio.ensure_future(self.unload())

    def backend_exited(self, backend: Backend) -> None:
        """The backend went away by itself (a worker crashed): the next request starts it again."""
        if self.backend is backend:
            self.backend = None
            if self.state == READY:
                self.move(UNLOADED)


def load_failed(spec: ModelSpec, reason: str, retry_after: float) -> ApiError:
    return ApiError(f"model {spec.name!r} failed to load: {reason}", status=503, param="model",
                    code="model_load_failed", headers={"Retry-After": str(max(1, math.ceil(retry_after)))})


def refusal(spec: ModelSpec, kind: str, serves: frozenset[str] | None = None) -> ApiError | None:
    """The 501 for a request of ``kind`` the model does not serve, or None. A local model serves
    one of chat, embeddings and rerank, which its spec tells before any load (``serves`` None),
    with what to set in models.yaml; once the backend runs, what it says it ``serves`` decides
    (an upstream's kinds, or a replica set's, are known only then). Any model tokenizes."""
    if serves is not None:
        if kind in serves:
            return None
        return ApiError(f"model {spec.name!r} does not serve {kind} requests", status=501, param="model",
                        code="unsupported_model")
    has = RERANK if spec.reranker else EMBEDDINGS if spec.embeddings else CHAT
    if kind not in (CHAT, EMBEDDINGS, RERANK) or not spec.local or kind == has:
        return None
    what = {RERANK: "is not a reranker: give it `reranker: true` in models.yaml",
            EMBEDDINGS: "cannot embed: give it `embeddings: true` in models.yaml",
            CHAT: "is a reranker: use /v1/rerank" if has == RERANK else
            "is an embedding model: use /v1/embeddings"}[kind]
    return ApiError(f"model {spec.name!r} {what}", status=501, param="model", code="unsupported_model")
