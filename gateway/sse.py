"""Server-sent events: headers once, one ``data:`` frame per message; frames sent with ``hold``
wait for the next frame without it, or ``flush``, and go out in one write with it."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # made once, used per token


class EventStream:
    def __init__(self, request: web.Request, headers: dict[str, str] | None = None):
        self.request = request
        self.response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",  # tell reverse proxies not to hold the stream back
            **(headers or {}),
        })
        self._held: list[bytes] = []

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, data: dict[str, Any] | str, event: str | None = None, hold: bool = False) -> None:
        payload = data if isinstance(data, str) else _encode(data)
        self._held.append(((f"event: {event}\n" if event else "") + f"data: {payload}\n\n").encode())
        if not hold:
            await self.flush()

    async def flush(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            await self.response.write(data)

    async def close(self) -> web.StreamResponse:
        await self.flush()
        await self.response.write_eof()
        return self.response
