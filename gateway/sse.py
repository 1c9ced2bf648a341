"""Server-sent events: headers once, one ``data:`` frame per message."""

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

    async def open(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, data: dict[str, Any] | str, event: str | None = None) -> None:
        payload = data if isinstance(data, str) else _encode(data)
        frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
        await self.response.write(frame.encode())

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response
