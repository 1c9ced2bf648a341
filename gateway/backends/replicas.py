"""One model name answered by several backends (``replicas:`` in models.yaml): ``ReplicaSet``,
itself a ``Backend``, so the model's supervisor, the handlers and the metrics treat it as one
model.

Each request goes to the ready replica with the most free capacity (``placement.replica_order``).
A replica that fails before the answer's first event (an upstream that cannot be reached, a
worker that died) passes the request to the next one, so a dead replica loses no request that
had not started answering; once an answer has begun, a failure ends it in-band as for any
backend. A local replica whose worker died is started again, after a back-off, while the
others serve; the set is gone only when every replica is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import protocol
from ..base.errors import ApiError, from_event
from ..models import placement
from ..models.config import ModelSpec
from ..protocol import Event, GenerationRequest
from .local import Backend, StartFailed
from .upstream import RETRYABLE, RemoteBackend
from .upstream_health import Health
from .workerclient import Events, RequestFailed

log = logging.getLogger(__name__)

# starts one replica's backend; the callback is called when that backend exits (expected: asked to)
Starter = Callable[[ModelSpec, Callable[[Backend, bool], None]], Awaitable[Backend]]


@dataclass
class Member:
    spec: ModelSpec
    backend: Backend | None = None
    error: str | None = None
    failures: int = 0  # failed starts in a row
    retry_at: float = 0.0
    requests: int = 0  # requests handed to it
    failovers: int = 0  # requests it failed before answering (passed to another replica)
    starting: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        backend = self.backend
        if backend is None or not backend.alive:
            return False
        return not (isinstance(backend, RemoteBackend) and backend.health.wait)

    @property
    def up(self) -> bool:
        """Running and, for an upstream, not known to be down."""
        backend = self.backend
        if isinstance(backend, RemoteBackend):
            return backend.alive and backend.health.state is not Health.DOWN
        return backend is not None and backend.alive

    @property
    def why(self) -> str:
        """Why it cannot answer now."""
        health = self.backend.health.error if isinstance(self.backend, RemoteBackend) else None
        return self.error or health or "not running"


def _started(member: Member, _task: asyncio.Task[None]) -> None:
    member.starting = None


class ReplicaSet:
    def __init__(self, spec: ModelSpec, start: Starter, on_exit: Callable[[Backend, bool], None],
                 backoff: tuple[float, float] = (5.0, 300.0)):
        self.spec, self._start, self._on_exit, self.backoff = spec, start, on_exit, backoff
        self.members = [Member(m) for m in spec.replicas]
        self._stopping = False
        self.info: dict[str, Any] = {}

    @classmethod
    async def start(cls, spec: ModelSpec, start: Starter, on_exit: Callable[[Backend, bool], None],
                    backoff: tuple[float, float] = (5.0, 300.0)) -> ReplicaSet:
        """Start every replica; raises ``StartFailed`` when none starts."""
        replicas = cls(spec, start, on_exit, backoff)
        await asyncio.gather(*(replicas._start_member(m) for m in replicas.members))
        if not any(m.backend is not None for m in replicas.members):
            raise StartFailed("no replica started: " + "; ".join(f"{m.spec.name}: {m.error}" for m in replicas.members))
        replicas._settle_info()
        return replicas

    def _settle_info(self) -> None:
        """What the handlers read the answer by: a local replica's (its template and vocabulary
        settle the tool and thinking formats), else an upstream's."""
        running = [m.backend for m in self.members if m.backend is not None]
        local = [b for b in running if not isinstance(b, RemoteBackend)]
        if (local or running) and not self.info:
            self.info = (local or running)[0].info

    async def _start_member(self, member: Member) -> None:
        try:
            member.backend = await self._start(member.spec, lambda b, expected: self._member_exited(member, b,
                                                                                                    expected))
        except StartFailed as e:
            self._failed(member, str(e))
            log.error("replica %r failed to start: %s", member.spec.name, e)
            return
        member.error, member.failures = None, 0
        self._settle_info()

    def _failed(self, member: Member, why: str) -> None:
        """Not started again before its back-off (the first wait, doubling up to the cap) passes."""
        member.failures += 1
        member.error, member.retry_at = why, time.monotonic() + placement.backoff(member.failures, *self.backoff)

    def _member_exited(self, member: Member, backend: Backend, expected: bool) -> None:
        if member.backend is backend:
            member.backend = None
            if expected:
                member.error = None
            else:
                self._failed(member, "its backend exited")
        if not expected and not self._stopping and not self.alive:
            self._on_exit(self, False)

    def _restart_due(self) -> None:
        """Start again, in the background, the replicas whose back-off has passed."""
        now = time.monotonic()
        for m in self.members:
            if m.backend is None and m.starting is None and now >= m.retry_at and not self._stopping:
                m.starting = asyncio.ensure_future(self._start_member(m))
                m.starting.add_done_callback(functools.partial(_started, m))

    def order(self) -> list[Member]:
        """The replicas to try for a request, best first."""
        self._restart_due()
        by_name = {m.spec.name: m for m in self.members}
        views = [placement.Replica(m.spec.name, m.ready, m.backend.in_flight if m.backend else 0, m.spec.parallel)
                 for m in self.members]
        return [by_name[name] for name in placement.replica_order(views)]

    def _none_ready(self) -> protocol.Error:
        waits = [b.health.wait for m in self.members if isinstance(b := m.backend, RemoteBackend) and b.health.wait]
        errors = "; ".join(f"{m.spec.name}: {m.why}" for m in self.members)
        return protocol.Error(0, 503, f"no replica of {self.spec.name!r} is available ({errors})", "model",
                              "upstream_unavailable", max(1.0, min(waits, default=5.0)))

    # --- Backend -------------------------------------------------------------------------------
    @property
    def serves(self) -> frozenset[str]:
        kinds: set[str] = set()
        for m in self.members:
            if m.backend is not None:
                kinds |= m.backend.serves
        return frozenset(kinds)

    device = "replicas"
    pid = None

    @property
    def alive(self) -> bool:
        return not self._stopping and any(m.backend is not None and m.backend.alive for m in self.members)

    @property
    def busy(self) -> bool:
        return any(m.backend is not None and m.backend.busy for m in self.members)

    @property
    def in_flight(self) -> int:
        return sum(m.backend.in_flight for m in self.members if m.backend is not None)

    def set_threads(self, n: int) -> None:
        for m in self.members:
            if m.backend is not None:
                m.backend.set_threads(n)

    def abort_all(self, message: str) -> None:
        for m in self.members:
            if m.backend is not None:
                m.backend.abort_all(message)

    def generate(self, request: GenerationRequest) -> FailoverGeneration:
        return FailoverGeneration(self, request)

    async def _ask(self, call: Callable[[Backend], Awaitable[Any]], kind: str) -> Any:
        """A question with one answer (tokenize, embed, ...) to the best replica that serves
        ``kind``, the next one if it fails before answering."""
        last: ApiError | None = None
        for m in self.order():
            assert m.backend is not None
            if kind not in m.backend.serves:
                continue
            m.requests += 1
            try:
                try:
                    return await call(m.backend)
                except RequestFailed as failed:  # a local worker's refusal, as its caller would be told it
                    raise from_event(failed.event) from None
            except ApiError as e:
                if e.code not in RETRYABLE:
                    raise
                m.failovers += 1
                last = e
        raise last or from_event(self._none_ready())

    async def tokenize(self, request: dict[str, Any], with_pieces: bool = False) -> protocol.Tokens:
        return await self._ask(lambda b: b.tokenize(request, with_pieces), protocol.TOKENIZE)

    async def detokenize(self, tokens: list[int]) -> protocol.Detokenized:
        return await self._ask(lambda b: b.detokenize(tokens), protocol.TOKENIZE)

    async def apply_template(self, request: dict[str, Any]) -> protocol.Prompt:
        return await self._ask(lambda b: b.apply_template(request), protocol.TOKENIZE)

    async def embed(self, inputs: list[Any]) -> protocol.Embeddings:
        return await self._ask(lambda b: b.embed(inputs), protocol.EMBEDDINGS)

    async def rerank(self, query: str, documents: list[str]) -> protocol.Embeddings:
        return await self._ask(lambda b: b.rerank(query, documents), protocol.RERANK)

    async def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        for m in self.members:
            if m.starting is not None:
                m.starting.cancel()
        await asyncio.gather(*(m.backend.stop(timeout) for m in self.members if m.backend is not None),
                             return_exceptions=True)

    def rows(self) -> list[tuple[str, bool, int, int]]:
        """(replica, up, requests handed to it, requests it passed on) for the metrics."""
        return [(m.spec.name, m.up, m.requests, m.failovers) for m in self.members]

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for m in self.members:
            backend = m.backend
            row: dict[str, Any] = {"id": m.spec.name, "up": m.up, "in_flight": backend.in_flight if backend else 0,
                                   "requests": m.requests, "failovers": m.failovers, "error": m.error,
                                   "kind": "upstream" if m.spec.upstream is not None else "local"}
            if isinstance(backend, RemoteBackend):
                row["upstream"] = backend.health.describe()
            out.append(row)
        return out


class FailoverGeneration(Events):
    """A generation on the best replica, moved to the next one while none has begun to answer
    (``backend.GenerationEvents``)."""

    def __init__(self, replicas: ReplicaSet, request: GenerationRequest):
        self.replicas, self.request = replicas, request
        self._gen: Any = None
        self._on_idle: Callable[[], Awaitable[None]] | None = None
        self.finished = False

    @property
    def on_idle(self) -> Callable[[], Awaitable[None]] | None:
        return self._on_idle

    @on_idle.setter
    def on_idle(self, value: Callable[[], Awaitable[None]] | None) -> None:
        self._on_idle = value
        if self._gen is not None:
            self._gen.on_idle = value

    async def next(self) -> Event:
        event = await (self._gen.next() if self._gen is not None else self._open())
        if isinstance(event, protocol.TERMINAL):
            self.finished = True
        return event

    async def _open(self) -> Event:
        last: protocol.Error | None = None
        for m in self.replicas.order():
            assert m.backend is not None
            gen = m.backend.generate(self.request)
            m.requests += 1
            try:
                event = await gen.next()
            except BaseException:  # the client left (cancelled) while this replica was asked: it stops too
                gen.close()
                raise
            if isinstance(event, protocol.Error) and event.code in RETRYABLE:
                gen.close()
                m.failovers += 1
                last = event
                log.warning("replica %r failed before answering (%s); trying the next", m.spec.name, event.message)
                continue
            self._gen = gen
            gen.on_idle = self._on_idle
            return event
        return last or self.replicas._none_ready()

    def unread(self) -> Sequence[Event]:
        return self._gen.unread() if self._gen is not None else ()

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()
