"""How a request went in its worker, seen where the gateway reads the workers' events and writes
their commands: for tests that need it after the request's client has gone (a cancelled answer's
token count, the order answers ended), when no handler reads that request's events any more.

``until`` waits on such a thing (or any other state) to come true: a test waits on the event,
never for a time; its ``bound`` is only how long before the test fails, as generous as a loaded
machine needs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway import protocol

BOUND = 120.0  # seconds before a wait fails: far past anything a loaded machine takes


class Recorder:
    """Every event any worker of this process sends, and every cancel the gateway sends one, from
    ``record_events`` on (until the test ends), in the order the gateway reads and writes them."""

    def __init__(self) -> None:
        self.done: list[protocol.Done] = []
        self.made: dict[int, int] = {}  # request id -> tokens generated so far, as its latest text event said
        self.cancelled: list[int] = []  # request ids the gateway told their worker to cancel
        self.embeds: list[int] = []  # request ids of the embeddings the gateway asked a worker for
        self.changed = asyncio.Event()

    def seen(self, event: Any) -> None:
        if isinstance(event, protocol.Done):
            self.done.append(event)
        elif isinstance(event, protocol.Text):
            self.made[event.id] = max(self.made.get(event.id, 0), event.tokens)
        elif isinstance(event, protocol.Cancel):
            self.cancelled.append(event.id)
        elif isinstance(event, protocol.Embed):
            self.embeds.append(event.id)
        self.changed.set()

    async def until(self, predicate: Callable[[], Any], what: str, bound: float = BOUND) -> Any:
        """``predicate()`` once it is true, checked at each event recorded."""
        deadline = time.monotonic() + bound
        while not (got := predicate()):
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())
            except TimeoutError:
                raise AssertionError(f"{what}: not after {bound:.0f} s") from None
        return got

    async def finished(self, n: int = 1) -> protocol.Done:
        """The ``n``-th done event."""
        await self.until(lambda: len(self.done) >= n, "the worker never finished the request")
        return self.done[n - 1]


def record_events(monkeypatch) -> Recorder:
    recorder = Recorder()
    decode, encode = protocol.decode_event, protocol.encode_command

    def decode_and_record(data: bytes | bytearray) -> protocol.Event:
        event = decode(data)
        recorder.seen(event)
        return event

    def record_and_encode(command: protocol.Command) -> bytes:
        recorder.seen(command)
        return encode(command)

    monkeypatch.setattr(protocol, "decode_event", decode_and_record)
    monkeypatch.setattr(protocol, "encode_command", record_and_encode)
    return recorder


def record_done(monkeypatch) -> list[protocol.Done]:
    """Every done event that any worker of this process sends from now on (until the test ends),
    in the order the gateway reads them."""
    return record_events(monkeypatch).done


async def until(predicate: Callable[[], Any], what: str, bound: float = BOUND, every: float = 0.01) -> Any:
    """``predicate()`` once it is true, for state no recorded event tells (checked every ``every``
    seconds: how often, not how long)."""
    deadline = time.monotonic() + bound
    while not (got := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {bound:.0f} s")
        await asyncio.sleep(every)
    return got


async def under_way(resp) -> bytes:
    """Read a stream (SSE) up to its first ``data:`` line: its model is loaded and the request
    started in its worker. Before it, a stream may carry comments (``: loading 43%``) while the
    model loads, for as long as that takes."""
    while line := await resp.content.readline():
        if line.startswith(b"data:"):
            return line
    raise AssertionError("the stream ended before its first event")
