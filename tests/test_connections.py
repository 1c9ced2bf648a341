"""The connection guard's policy and bookkeeping, with stand-in transports (the real server's
connections are driven in test_hostile.py)."""

from gateway.server.connections import Conn, ConnectionGuard, ConnState, Limits, expiry

LIMITS = Limits(header_timeout=10, keepalive_timeout=30, max_connections=3)


def test_expiry_by_state():
    assert expiry(Conn(ConnState.IDLE, 100.0), LIMITS) == (110.0, "header_timeout")  # new, silent
    assert expiry(Conn(ConnState.READING, 100.0, served=2), LIMITS) == (110.0, "header_timeout")
    assert expiry(Conn(ConnState.IDLE, 100.0, served=1), LIMITS) == (130.0, "keepalive_timeout")
    assert expiry(Conn(ConnState.HANDLING, 100.0), LIMITS) is None
    assert expiry(Conn(ConnState.IDLE, 100.0, served=1), Limits(10, 0, 3)) is None  # 0: no limit


class Transport:
    def __init__(self):
        self.written, self.closed = b"", False

    def write(self, data):
        self.written += data

    def close(self):
        self.closed = True


def test_the_guard_follows_each_connection_and_closes_the_expired():
    reasons = []
    guard = ConnectionGuard(LIMITS, on_close=reasons.append)
    a, b, c = Transport(), Transport(), Transport()
    assert all(guard.opened(t) for t in (a, b, c))
    guard.received(b)  # b's headers are arriving
    guard.begin(c)  # c runs a handler
    opened = guard.conns[a].since
    assert guard.sweep_once(opened + 5) == 0
    assert guard.sweep_once(opened + 11) == 2 and a.closed and b.closed and not c.closed
    assert sorted(reasons) == ["header_timeout", "header_timeout"]
    guard.end(c)  # answered: now idle under keep-alive
    assert guard.conns[c].served == 1 and guard.conns[c].state is ConnState.IDLE
    assert guard.sweep_once(guard.conns[c].since + 29) == 0
    assert guard.sweep_once(guard.conns[c].since + 31) == 1 and c.closed


def test_past_the_limit_a_connection_gets_a_503_and_is_closed():
    guard = ConnectionGuard(LIMITS)
    for _ in range(3):
        assert guard.opened(Transport())
    extra = Transport()
    assert not guard.opened(extra)
    assert extra.closed and extra.written.startswith(b"HTTP/1.1 503") and b"too_many_connections" in extra.written
    assert len(guard.conns) == 3 and guard.refused == 1


def test_connection_noise_is_one_line_without_the_bytes_and_rate_limited():
    import logging

    from aiohttp.http_exceptions import LineTooLong

    from gateway.server.connections import QuietConnectionLogs

    quiet = QuietConnectionLogs(interval=60)

    def record(name, msg, exc):
        return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, ("127.0.0.1",), (type(exc), exc, None))

    bad = LineTooLong(b"Authorization: Bearer sk-SECRET" * 10, 8190)
    first = record("aiohttp.server", "Error handling request from %s", bad)
    assert quiet.filter(first)
    line = first.getMessage()
    assert line == "malformed HTTP request (LineTooLong, status 400)" and first.exc_info is None
    assert first.levelno == logging.WARNING
    assert not quiet.filter(record("aiohttp.server", "Error handling request from %s", bad))  # within the interval
    accept = record("asyncio", "socket.accept() out of system resource", OSError(24, "Too many open files"))
    assert quiet.filter(accept) and "out of file descriptors" in accept.getMessage() and accept.exc_info is None
    assert not quiet.filter(record("asyncio", "socket.accept() out of system resource", OSError(24, "x")))
    other = record("aiohttp.server", "Error handling request from %s", RuntimeError("a bug"))
    assert quiet.filter(other) and other.exc_info is not None  # a real fault keeps its traceback
