"""One aiohttp request answered by an ASGI application (``serve``): the bridge ``/mcp`` needs,
since the ``mcp`` SDK's streamable HTTP transport is ASGI and the gateway is aiohttp.

Bounded on both sides. The body is read by the caller beforehand (``api/body``: its time, bytes
and JSON) and handed over whole, in one ``http.request`` message; after it, ``receive`` waits
until the request ends and then says ``http.disconnect`` (a client that leaves cancels the
handler, and with it the application's call, by aiohttp's handler cancellation). What the
application sends is counted: past ``max_bytes`` the rest is dropped and the answer is a 502
where nothing was sent yet, or a stream cut and its connection closed where it was. A body sent in
one message (the SDK's JSON answers) is answered as a whole ``web.Response``, which the
middlewares (CORS, the request id) still add their headers to. Hop-by-hop
headers the application names (``Connection``, ``Transfer-Encoding``, ``Keep-Alive``) are aiohttp's
to write, and are left out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from ..base.errors import ApiError

Message = MutableMapping[str, Any]
Asgi = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                Awaitable[None]]

HOP_BY_HOP = frozenset({b"connection", b"transfer-encoding", b"keep-alive"})


def scope_of(request: web.Request, headers: Iterable[tuple[bytes, bytes]], extra: dict[str, Any]) -> dict[str, Any]:
    """The ASGI HTTP scope of ``request`` with ``headers`` (lower-cased names), and ``extra`` keys
    the application reads (an ASGI scope may carry a server's own)."""
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    local = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method, "scheme": request.scheme, "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1", "replace"),
        "query_string": request.query_string.encode("latin-1", "replace"), "root_path": "",
        "headers": [(k.lower(), v) for k, v in headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": tuple(local[:2]) if isinstance(local, tuple) else None,
        "state": {}, **extra,
    }


async def serve(app: Asgi, request: web.Request, body: bytes, *, headers: Iterable[tuple[bytes, bytes]],
                extra: dict[str, Any], max_bytes: int) -> web.StreamResponse:
    """Run ``app`` on ``request`` whose body is ``body`` (read already), as the module says; its
    answer: a whole ``web.Response`` where the application sent its body in one message (the
    middlewares still add their headers), else a stream written as it comes. Raises ``ApiError``
    (502) where the application answered nothing or too much before its answer began."""
    scope = scope_of(request, headers, extra)
    ended = asyncio.Event()
    given = False
    status, out = 0, CIMultiDict[str]()
    whole: bytes | None = None
    stream: web.StreamResponse | None = None
    sent = 0
    overflow = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await ended.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, whole, stream, sent, overflow
        kind = message.get("type")
        if kind == "http.response.start":
            if not status:
                status = int(message["status"])
                for name, value in message.get("headers", ()):
                    if name.lower() not in HOP_BY_HOP:
                        out.add(name.decode("latin-1"), value.decode("latin-1"))
            return
        if kind != "http.response.body" or not status or whole is not None or overflow:
            return
        chunk, more = bytes(message.get("body", b"")), bool(message.get("more_body", False))
        sent += len(chunk)
        if sent > max_bytes:
            overflow = True
            if stream is not None:
                stream.force_close()  # the stream is cut: the client must not wait for its end
            return
        if stream is None and not more:
            whole = chunk
            return
        if stream is None:
            stream = web.StreamResponse(status=status, headers=out)
            await stream.prepare(request)
        if chunk:
            await stream.write(chunk)
        if not more:
            await stream.write_eof()

    try:
        await app(scope, receive, send)
    finally:
        ended.set()
    if stream is not None:
        return stream
    if overflow:
        raise ApiError(f"The answer is larger than {max_bytes} bytes", status=502, code="answer_too_large")
    if not status:
        raise ApiError("No answer was given", status=502, code="bad_gateway")
    out.popall("Content-Length", None)  # aiohttp writes the body's own
    return web.Response(status=status, headers=out, body=whole or b"")
