"""An answer's stream over a WebSocket: the same events ``sse.EventStream`` writes as
server-sent events, each as one JSON text frame (the Responses WebSocket, ``api/responses_socket``).

``Outbox`` is the socket's one way out: its frames go one at a time (the answer's events and
the socket's own, a steer's acknowledgement, an error, share it), and a frame that cannot go out
within ``timeout`` seconds (the client stopped reading and the socket's buffers are full)
aborts the connection and raises ``ConnectionResetError``, as a stalled SSE write does: to the
answer, the client has gone, so its generation ends and its model's slot is freed.

``SocketStream`` is an ``EventStream`` whose frames go to an ``Outbox``: the pipeline writes an
answer to it as it writes one to an SSE stream (``api/pipeline.stream``), its failures in-band
in the writer's words. A capture's tap is told each event in its SSE form, so a captured socket
answer reads as the stream it would have been; ``on_event`` sees each event object as it goes
(the socket follows its responses' ids and ends there)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .sse import EventStream, encode


class Outbox:
    """One WebSocket's frames out, one at a time, each bounded by ``timeout`` seconds."""

    def __init__(self, socket: web.WebSocketResponse, transport: Any, timeout: float):
        self.socket = socket
        self.timeout = timeout
        self._transport = transport
        self._lock = asyncio.Lock()

    async def send(self, text: str) -> None:
        async with self._lock:
            if self.socket.closed:
                raise ConnectionResetError("the socket is closed")
            try:
                await asyncio.wait_for(self.socket.send_str(text), self.timeout)
            except asyncio.TimeoutError:
                if self._transport is not None:
                    self._transport.abort()
                raise ConnectionResetError(f"the client read nothing for {self.timeout:g} s") from None

    async def event(self, event: dict[str, Any]) -> None:
        await self.send(encode(event))


class SocketStream(EventStream):
    """An ``EventStream`` whose events go to ``outbox`` as JSON text frames."""

    def __init__(self, request: web.Request, outbox: Outbox,
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        super().__init__(request)
        self.outbox = outbox
        self.on_event = on_event
        self._opened = False

    @property
    def opened(self) -> bool:
        return self._opened

    async def open(self) -> None:
        self._opened = True  # the socket is open already: nothing to send

    async def comment(self, text: str) -> None:
        """A load's progress: the socket's wire has no comment, so nothing goes out."""

    async def send(self, data: dict[str, Any] | str, event: str | None = None, hold: bool = False) -> None:
        if isinstance(data, str):  # a bare data line (OpenAI's ``[DONE]``): no event on a socket
            return
        payload = encode(data)
        if self.tap is not None:
            self.tap(self._frame(payload, event))
        if self.on_event is not None:
            self.on_event(data)
        await self.outbox.send(payload)

    async def flush(self) -> None:
        """Each event went out as it was sent."""

    async def close(self) -> web.StreamResponse:
        return self.response
