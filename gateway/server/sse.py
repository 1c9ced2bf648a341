"""Server-sent events: headers once, one ``data:`` frame per message; frames sent with ``hold``
wait for the next frame without it, or ``flush``, and go out in one write with it.

A write that cannot finish within ``write_timeout`` seconds (the client stopped reading and
the socket's buffers are full) aborts the connection and raises ``ConnectionResetError``:
to the handler, the client has gone, so its slot and its place in the queue are freed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..base.errors import ApiError

encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # made once, used per token


class EventStream:
    content_type = "text/event-stream; charset=utf-8"

    def __init__(self, request: web.Request, headers: dict[str, str] | None = None, write_timeout: float = 0.0):
        self.request = request
        self.write_timeout = write_timeout  # 0: none
        self.stalled = False
        self.response = web.StreamResponse(headers={
            "Content-Type": self.content_type,
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # tell reverse proxies not to hold the stream back
            **(headers or {}),
        })
        self._held: list[bytes] = []
        # told each write as it goes out: the request's capture (``server/captures``), where it has one
        self.tap: Callable[[bytes], None] | None = None
        # what a failure before the answer ends says, in the stream's own wire shape: (message,
        # event name) pairs; set by whoever opens the stream before its answer can begin
        self.failure: Callable[[ApiError], list[tuple[dict[str, Any] | str, str | None]]] | None = None

    @property
    def opened(self) -> bool:
        return self.response.prepared

    async def open(self) -> None:
        """Send the headers (once: a stream opened early to tell a load's progress goes on)."""
        if not self.response.prepared:
            await self.response.prepare(self.request)

    async def comment(self, text: str) -> None:
        """A comment line, which clients skip (``: loading 43%``); it goes out at once."""
        self._held.append(f": {text}\n\n".encode())
        await self.flush()

    async def send(self, data: dict[str, Any] | str, event: str | None = None, hold: bool = False) -> None:
        payload = data if isinstance(data, str) else encode(data)
        self._held.append(self._frame(payload, event))
        if not hold:
            await self.flush()

    @staticmethod
    def _frame(payload: str, event: str | None) -> bytes:
        return ((f"event: {event}\n" if event else "") + f"data: {payload}\n\n").encode()

    async def flush(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            if self.tap is not None:
                self.tap(data)
            await self._bounded(self.response.write(data))

    async def close(self) -> web.StreamResponse:
        await self.flush()
        await self._bounded(self.response.write_eof())
        return self.response

    async def _bounded(self, write) -> None:
        if not self.write_timeout:
            return await write
        timer = asyncio.get_running_loop().call_later(self.write_timeout, self._stall)
        try:
            await write
        finally:
            timer.cancel()
        if self.stalled:
            raise ConnectionResetError(f"the client read nothing for {self.write_timeout:g} s")

    def _stall(self) -> None:
        self.stalled = True
        transport = self.request.transport
        if transport is not None:
            transport.abort()


class LineStream(EventStream):
    """Newline-delimited JSON, one object a line (Ollama's streams), with the same holding and
    write bounds."""

    content_type = "application/x-ndjson"

    @staticmethod
    def _frame(payload: str, event: str | None) -> bytes:
        return (payload + "\n").encode()
