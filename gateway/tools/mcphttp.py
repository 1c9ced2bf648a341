"""A streamable-HTTP MCP server's transport with bounds: the SDK's ``streamable_http_client`` over
an ``httpx2`` client of the gateway's own making.

- **Bytes.** One server-sent event is at most ``max_message`` bytes (the SDK's
  ``max_sse_event_size``), and so is a whole JSON answer (``_CappedStream``: the SDK reads a JSON
  body whole, unbounded); past either, that request fails, and ``Lost.oversize`` says why.
- **Addresses.** A connection made on a request's word (``allow_private=False``: Responses'
  ``server_url``, Anthropic's ``mcp_servers[].url``) reaches only public addresses, by the rules of
  ``base/addresses``. They are checked on the address actually connected to, after the name is
  resolved (``_GuardedBackend``, the network backend of ``httpcore2``'s pool), so neither a name
  that resolves to a private address nor a redirect can lead the gateway into its own network;
  the SDK follows redirects only within the endpoint's origin, and each is a new connection
  through the same check. No proxy from the environment is used for those. A configured server
  (the operator's word) may be on loopback."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpcore2
import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client

from ..base.addresses import forbidden_text
from .mcpclient import Lost

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 300.0  # an SSE stream may stay open while a tool runs; calls have their own timeout


class _TooLarge(httpx2.StreamError):
    """A JSON answer past the cap; a ``StreamError``, which the SDK turns into that request's error."""


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, cap: int, lost: Lost):
        self._inner, self._cap, self._lost = inner, cap, lost

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._cap:
                self._lost.oversize += 1
                raise _TooLarge(f"the answer exceeded the {self._cap} byte limit")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _GuardedBackend(httpcore2.AsyncNetworkBackend):
    """``httpcore2``'s own backend, connecting only to addresses ``forbidden`` allows."""

    def __init__(self, lost: Lost):
        self._inner = httpcore2.AnyIOBackend()
        self._lost = lost

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            raise httpcore2.ConnectError(f"{host} does not resolve") from exc
        allowed = list(dict.fromkeys(str(info[4][0]) for info in found if not forbidden_text(str(info[4][0]))))
        if not allowed:
            self._lost.set(f"{host} is a private, loopback or link-local address, which a request may not name",
                           "refused")
            raise httpcore2.ConnectError("refused: not a public address")
        last: Exception | None = None
        for address in allowed:
            try:
                return await self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                     socket_options=socket_options)
            except httpcore2.ConnectError as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("refused: not a network address")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _Transport(httpx2.AsyncHTTPTransport):
    def __init__(self, lost: Lost, cap: int, allow_private: bool):
        super().__init__(trust_env=allow_private)
        self._lost, self._cap = lost, cap
        if not allow_private:
            pool = self._pool
            assert hasattr(pool, "_network_backend"), "httpcore2's pool no longer takes a backend this way"
            pool._network_backend = _GuardedBackend(lost)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if not response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            response.stream = _CappedStream(response.stream, self._cap, self._lost)
        return response


@asynccontextmanager
async def http_transport(url: str, headers: Mapping[str, str], lost: Lost, *, allow_private: bool,
                         max_message: int) -> AsyncIterator[TransportStreams]:
    """The SDK's stream pair to the server at ``url`` (see the module)."""
    client = httpx2.AsyncClient(headers=dict(headers), transport=_Transport(lost, max_message, allow_private),
                                timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT),
                                follow_redirects=False, trust_env=allow_private)
    async with client, streamable_http_client(url, http_client=client, max_sse_event_size=max_message) as streams:
        yield streams
