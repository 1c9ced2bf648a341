"""A pull's cancel, which ends the reads the pull is blocked in, and the deadlines of its steps.

``Stop`` is the pull's cancel (an ``Event``): ``set`` shuts down every socket a read of the pull
is blocked on at that moment (``holding``), so a cancel takes effect at once rather than at the
next byte, and ``deadline`` bounds a step overall in the same way (past it, ``check`` raises
``TimedOut``). A thread serves one pull at a time: ``stopping`` makes a ``Stop`` the thread's, and
the reads of ``huggingface_hub``'s shared client see it through ``_Watched``, the network stream
``watch_client`` gives its connection pools: each read waits no longer than the step's deadline
leaves, and a cancel or the deadline shuts its socket down. The file transfer's own connections
(``transfer._get``) hold their sockets the same way.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from .errors import Cancelled, TimedOut

log = logging.getLogger(__name__)


class Stop(threading.Event):
    """A pull's cancel (an ``Event``) that also ends the reads the pull is blocked in: ``set``
    shuts down every socket held through ``holding`` at that moment. ``deadline`` bounds a step
    overall the same way: past it, the held sockets are shut down and ``error`` is a ``TimedOut``."""

    def __init__(self, what: str = "the pull", linked: threading.Event | None = None) -> None:
        super().__init__()
        self.what = what
        self.linked = linked  # a plain Event that cancels too (checked between reads only)
        self._guard = threading.Lock()
        self._held: dict[int, Callable[[], None]] = {}
        self._next = 0
        self._step: tuple[float, str] | None = None  # the step's deadline (monotonic) and its failure

    def set(self) -> None:
        super().set()
        self._shut()

    def _shut(self) -> None:
        with self._guard:
            shut = list(self._held.values())
        for one in shut:
            one()

    def _expired(self) -> bool:
        return self._step is not None and time.monotonic() >= self._step[0]

    @contextlib.contextmanager
    def holding(self, shut: Callable[[], None]) -> Iterator[None]:
        """While inside, a cancel or a deadline calls ``shut`` (which ends a blocked read)."""
        with self._guard:
            key, self._next = self._next, self._next + 1
            self._held[key] = shut
        try:
            if self.is_set() or self._expired():  # it came before the read began
                shut()
            yield
        finally:
            with self._guard:
                del self._held[key]

    @contextlib.contextmanager
    def deadline(self, seconds: float, what: str) -> Iterator[None]:
        """``what`` ends within ``seconds``, whatever the server sends, however slowly."""
        saved = self._step
        self._step = (time.monotonic() + seconds, f"{what}: no whole answer within {seconds:g} s")
        timer = threading.Timer(seconds, self._shut)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            try:
                self.check()  # a step that ran out of time fails as that, whatever its read raised
            finally:
                self._step = saved

    def left(self, timeout: float | None) -> float | None:
        """``timeout`` for one read, cut to what the step's deadline leaves."""
        if self._step is None:
            return timeout
        left = max(self._step[0] - time.monotonic(), 0.001)
        return left if timeout is None else min(timeout, left)

    def check(self) -> None:
        """Raise ``Cancelled`` after a cancel, ``TimedOut`` past the step's deadline."""
        if self.is_set() or (self.linked is not None and self.linked.is_set()):
            raise Cancelled(f"{self.what}: cancelled")
        if self._step is not None and self._expired():
            raise TimedOut(self._step[1])


_CURRENT = threading.local()  # the Stop of the pull this thread is serving


def current_stop() -> Stop | None:
    return getattr(_CURRENT, "stop", None)


@contextlib.contextmanager
def stopping(stop: threading.Event | None) -> Iterator[Stop]:
    """Every read this thread makes inside is ended by ``stop`` (a ``Stop``; a plain ``Event``
    is checked between reads only) and by the deadlines set on the ``Stop`` returned."""
    saved = current_stop()
    own = stop if isinstance(stop, Stop) else Stop(linked=stop) if stop is not None else saved or Stop()
    _CURRENT.stop = own
    try:
        yield own
    finally:
        _CURRENT.stop = saved


@contextlib.contextmanager
def bounded(what: str, seconds: float) -> Iterator[Stop]:
    """A step of this thread's pull (a listing, a manifest, a file's metadata) that ends within
    ``seconds`` or at its cancel, whichever comes first."""
    with stopping(current_stop()) as stop, stop.deadline(seconds, what):
        yield stop


def shut_socket(sock: socket.socket) -> None:
    """End the reads blocked on ``sock`` from another thread: ``shutdown`` (``close`` does not
    wake a blocked read), through a duplicate so that a TLS socket's own state is not touched."""
    try:
        dup = socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:  # closed already
        return
    try:
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()


class _Watched:
    """A network stream of the shared client whose reads see the reading thread's ``Stop``: a
    cancel or the step's deadline ends a read at once (``holding``), and no read waits past
    the deadline. Outside a pull it is the stream itself."""

    def __init__(self, inner: Any):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        stop = current_stop()
        if stop is None:
            return self._inner.read(max_bytes, timeout)
        stop.check()
        sock = self._inner.get_extra_info("socket")

        def shut() -> None:
            if sock is not None:
                shut_socket(sock)
        try:
            with stop.holding(shut):
                return self._inner.read(max_bytes, stop.left(timeout))
        finally:
            stop.check()  # a read a cancel or a deadline ended fails as that

    def start_tls(self, *args: Any, **kwargs: Any) -> _Watched:
        return _Watched(self._inner.start_tls(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _WatchedBackend:
    """The shared client's network backend, its streams ``_Watched``."""

    def __init__(self, inner: Any):
        self._inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _Watched:
        return _Watched(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _Watched:
        return _Watched(self._inner.connect_unix_socket(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def watch_client(client: Any) -> None:
    """Give each of ``client``'s connection pools (its own and a proxy's) a ``_WatchedBackend``.
    httpx2 takes no backend through its client, so this reaches its transports' pools; where
    they are not there (another version), reads keep their per-read timeout only, and say so."""
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        if pool is None or not hasattr(pool, "_network_backend"):
            if transport is not None:
                log.warning("pulls: cannot watch %s's reads: a cancel waits for the read in progress",
                            type(transport).__name__)
            continue
        if not isinstance(pool._network_backend, _WatchedBackend):
            pool._network_backend = _WatchedBackend(pool._network_backend)


def _held_connection(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
    """``base`` whose socket, once connected, is the thread's ``held_connections``'."""

    class Held(base):  # type: ignore[valid-type, misc]
        def connect(self) -> None:
            super().connect()
            opened = getattr(_CURRENT, "opened", None)
            if opened is not None:
                opened.append(self.sock)

    return Held


_HTTP, _HTTPS = _held_connection(http.client.HTTPConnection), _held_connection(http.client.HTTPSConnection)


class HttpHandler(urllib.request.HTTPHandler):
    def http_open(self, req):  # noqa: ANN001, ANN201 (urllib's)
        return self.do_open(_HTTP, req)


class HttpsHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):  # noqa: ANN001, ANN201 (urllib's)
        return self.do_open(_HTTPS, req, context=self._context)


@contextlib.contextmanager
def held_connections(stop: Stop) -> Iterator[None]:
    """The connections ``HttpHandler`` and ``HttpsHandler`` open on this thread inside are
    ``stop``'s to shut down, from their connect until the block ends (their answer read)."""
    opened: list[socket.socket] = []
    _CURRENT.opened = opened

    def shut() -> None:
        for sock in list(opened):
            shut_socket(sock)
    try:
        with stop.holding(shut):
            yield
    finally:
        _CURRENT.opened = None
