"""Open connections: how many there may be, and how long one may hold a socket without a
request in progress.

aiohttp bounds neither (its keep-alive default is an hour, and a connection still sending
its headers has no deadline at all), so a few hundred idle or slow sockets would take every
file descriptor. ``ConnectionGuard`` wraps the server's protocol factory:

- past ``server.max_connections`` a new connection gets a 503 and is closed at once;
- each connection is in one ``ConnState``; ``expiry`` (a pure function) says when one that is
  not running a handler must go: ``header_timeout`` after it opened or after the first byte of
  its next request, ``keepalive_timeout`` after its last response;
- a connection running a handler has no deadline here: the handler's own limits apply
  (``server.body_timeout``, ``write_timeout``, ``request_timeout``).
A sweep closes expired connections once a second. The middleware in ``app.py`` marks when a
handler begins and ends (``begin`` / ``end``); it is marked ``per_connection``, so a request
made inside a running handler (a WebSocket's event as a request, ``api/responses_socket``)
runs every middleware but that one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

SWEEP_SECONDS = 1.0
REFUSAL_LOG_SECONDS = 60.0  # refusals are logged once per this interval, with their count


_PER_CONNECTION = "_gateway_per_connection"


def per_connection(middleware: Any) -> Any:
    """Mark a middleware as the connection's own, not each request's (``is_per_connection``)."""
    setattr(middleware, _PER_CONNECTION, True)
    return middleware


def is_per_connection(middleware: Any) -> bool:
    return getattr(middleware, _PER_CONNECTION, False)


class ConnState(Enum):
    IDLE = "idle"  # no request begun: a new connection, or a kept-alive one between requests
    READING = "reading"  # bytes of a request arrived; its handler has not begun (headers still coming)
    HANDLING = "handling"  # a handler runs


@dataclass
class Conn:
    state: ConnState
    since: float  # when it entered its state (monotonic seconds)
    served: int = 0  # handlers it has run


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 10.0  # 0: none
    keepalive_timeout: float = 30.0  # 0: none
    max_connections: int = 512


def expiry(conn: Conn, limits: Limits) -> tuple[float, str] | None:
    """When ``conn`` must be closed (monotonic time) and why, or None while it may stay."""
    if conn.state is ConnState.HANDLING:
        return None
    if conn.state is ConnState.IDLE and conn.served:
        timeout, reason = limits.keepalive_timeout, "keepalive_timeout"
    else:
        timeout, reason = limits.header_timeout, "header_timeout"
    return (conn.since + timeout, reason) if timeout else None


def _refusal() -> bytes:
    body = json.dumps({"error": {"message": "This gateway has too many open connections "
                                            "(server.max_connections); retry shortly",
                                 "type": "service_unavailable_error", "param": None,
                                 "code": "too_many_connections"}}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head + body


@dataclass
class ConnectionGuard:
    limits: Limits
    # called with (reason) for every connection closed or refused here: metrics
    on_close: Callable[[str], None] | None = None
    conns: dict[Any, Conn] = field(default_factory=dict)  # transport -> its connection
    refused: int = 0
    _unlogged_refusals: int = 0
    _refusal_logged_at: float = float("-inf")
    _sweeper: asyncio.Task | None = None

    # --- the one place a connection's state changes ---
    def _set(self, transport: Any, state: ConnState) -> None:
        conn = self.conns.get(transport)
        if conn is None or conn.state is state:
            return
        if conn.state is ConnState.HANDLING:
            conn.served += 1
        conn.state, conn.since = state, time.monotonic()

    def begin(self, transport: Any) -> None:
        """A handler begins on this connection."""
        self._set(transport, ConnState.HANDLING)

    def end(self, transport: Any) -> None:
        """Its handler has returned: the connection waits for its next request."""
        self._set(transport, ConnState.IDLE)

    def received(self, transport: Any) -> None:
        conn = self.conns.get(transport)
        if conn is not None and conn.state is ConnState.IDLE:
            self._set(transport, ConnState.READING)

    def opened(self, transport: Any) -> bool:
        """Track a new connection; False (and a 503 written) when it is over the limit."""
        if len(self.conns) >= self.limits.max_connections:
            self.refused += 1
            self._unlogged_refusals += 1
            now = time.monotonic()
            if now - self._refusal_logged_at >= REFUSAL_LOG_SECONDS:
                log.warning("refused %d connection(s): %d open, server.max_connections is %d",
                            self._unlogged_refusals, len(self.conns), self.limits.max_connections)
                self._refusal_logged_at, self._unlogged_refusals = now, 0
            if self.on_close is not None:
                self.on_close("max_connections")
            try:
                transport.write(_refusal())
            finally:
                transport.close()
            return False
        self.conns[transport] = Conn(ConnState.IDLE, time.monotonic())
        return True

    def closed(self, transport: Any) -> None:
        self.conns.pop(transport, None)

    # --- wiring ---
    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server`` around aiohttp's."""
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep())
        return lambda: _Guarded(self, factory())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def sweep_once(self, now: float | None = None) -> int:
        """Close every expired connection; how many were closed."""
        now = time.monotonic() if now is None else now
        closing = []
        for transport, conn in self.conns.items():
            due = expiry(conn, self.limits)
            if due is not None and now >= due[0]:
                closing.append((transport, due[1]))
        for transport, reason in closing:
            self.conns.pop(transport, None)
            if self.on_close is not None:
                self.on_close(reason)
            transport.close()
        return len(closing)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                self.sweep_once()
            except Exception:  # never let the sweeper die
                log.exception("connection sweep failed")


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the guard told what happens to it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport: Any = None
        self.refused = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if not self.guard.opened(transport):
            self.refused = True
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self.guard.received(self.transport)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.closed(self.transport)
        if not self.refused:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()


def raise_fd_limit() -> int | None:
    """Raise this process's soft limit on open files to its hard limit (at most 65536); the
    soft limit now, or None where there is no such limit (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft


class QuietConnectionLogs(logging.Filter):
    """What clients can make the server log about connections, bounded: a malformed HTTP
    request becomes one line naming only the error's kind (aiohttp logs a traceback whose
    message quotes the offending bytes, a header's or a key's), and both it and asyncio's
    ``accept() out of system resource`` (a traceback per attempt while descriptors run out)
    are logged at most once per ``interval`` seconds, with a count of those left out."""

    def __init__(self, interval: float = 10.0):
        super().__init__()
        self.interval = interval
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.name == "aiohttp.server" and isinstance(exc, HttpProcessingError):
            kind = "malformed"
            record.msg, record.args = "malformed HTTP request (%s, status %s)", (type(exc).__name__, exc.code)
        elif record.name == "asyncio" and "out of system resource" in str(record.msg):
            kind = "accept"
            record.msg, record.args = "cannot accept connections: out of file descriptors (%s)", (exc,)
        else:
            return True
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"  # the client's fault, or the host's
        now = time.monotonic()
        if now - self._last.get(kind, float("-inf")) < self.interval:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return False
        skipped = self._skipped.pop(kind, 0)
        if skipped:
            record.msg += f" [and {skipped} more like it in the last {self.interval:g} s or more]"
        self._last[kind] = now
        return True

    def install(self) -> None:
        for name in ("aiohttp.server", "asyncio"):
            logging.getLogger(name).addFilter(self)
