"""The MCP servers the gateway connects to: the configured ones (``server.mcp_servers``), each
connected on first use and kept, and a server a request names (``McpServers.adhoc``), connected
for that request alone and only at a public address.

A configured server's life is a ``State`` (idle, connecting, ready, failed), changed in one place
(``_Server.move``). The first caller connects it and lists its tools once; callers meanwhile
share that connect (single-flight), and one that is cancelled leaves it running for the rest. A
server that dies (its process exits, its connection fails) is failed with the reason; the next
use connects again, though not before a backoff that doubles with each failure since its last
good call (``BACKOFF``), so a server that crashes on start is not restarted in a hot loop.

Secrets (``SecretRef``: inline, ``{env: NAME}``, ``{file: NAME}`` in the state folder's
``secrets``) are read when a connection is made, bounded, and never logged: a missing one fails
the connect with its name, and a reason a server fails for (its stderr, its error message) is
told without them (``hosted.redact``), on the page, to the caller and in the log. A stdio server
is started with a minimal environment plus its configured ``env``, and never on a request's word.
The bounds of one connection are ``mcpclient``'s; of a transport, ``mcpstdio``'s and ``mcphttp``'s."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..models.config.specs import McpServerConfig, SecretRef
from .hosted import CallOutcome, ToolError, ToolInfo, redact

if TYPE_CHECKING:  # the SDK is imported at a first connection (``sdk``): it brings OpenTelemetry's API with it
    from .mcpclient import Connection

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0  # seconds a connect and its tool list may take (a stdio server's start included)
BACKOFF = (0.5, 30.0)  # seconds before a failed server is tried again: the first, doubling to the most
WAIT_BACKOFF = 1.0  # a call waits out this much of a backoff; past it, it fails at once
MAX_SECRET = 16 * 1024  # bytes of a secret file


class State(str, enum.Enum):
    IDLE = "idle"
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"


_MOVES = {
    State.IDLE: {State.CONNECTING},
    State.CONNECTING: {State.READY, State.FAILED, State.IDLE},
    State.READY: {State.FAILED, State.IDLE},
    State.FAILED: {State.CONNECTING, State.IDLE},
}


class _Server:
    """One configured server: its state, connection, tools and counts."""

    def __init__(self, config: McpServerConfig):
        self.config = config
        self.state = State.IDLE
        self.error: str | None = None
        self.connection: Connection | None = None
        self.tools: list[ToolInfo] | None = None
        self.connecting: asyncio.Task[Connection] | None = None
        self.calls = 0
        self.connects = 0
        self.failures = 0  # since the last good call
        self.retry_at = 0.0
        self.secrets: tuple[str, ...] = ()  # its env's and headers' values, as last read: never in a reason

    def redacted(self, err: ToolError) -> ToolError:
        """``err`` without the server's secrets in its reason (``hosted.redact``)."""
        reason = redact(err.reason, self.secrets)
        return err if reason == err.reason else ToolError(reason, err.outcome)

    def move(self, to: State, error: str | None = None) -> None:
        """The one place a server's state changes; refuses a move the table does not have."""
        if to is not self.state and to not in _MOVES[self.state]:
            raise RuntimeError(f"MCP server {self.config.name}: {self.state.value} -> {to.value} is not a move")
        if to is State.FAILED:
            self.failures += 1
            self.retry_at = time.monotonic() + min(BACKOFF[1], BACKOFF[0] * 2 ** (self.failures - 1))
            log.warning("MCP server %s failed: %s", self.config.name, error)
        self.state = to
        self.error = error if to is State.FAILED else self.error if to is State.CONNECTING else None


class McpServers:
    """The configured servers (see the module). ``tools`` and ``call`` raise ``ToolError``."""

    def __init__(self, configs: Mapping[str, McpServerConfig], state_dir: Path, *, tool_timeout: float,
                 max_result_bytes: int):
        self._servers = {name: _Server(config) for name, config in configs.items()}
        self.state_dir = state_dir
        self.tool_timeout = tool_timeout
        self.max_result_bytes = max_result_bytes

    def __contains__(self, server: str) -> bool:
        return server in self._servers

    @property
    def names(self) -> list[str]:
        return list(self._servers)

    def _entry(self, server: str) -> _Server:
        entry = self._servers.get(server)
        if entry is None:
            raise ToolError(f"no MCP server named {server!r} is configured", "refused")
        return entry

    async def tools(self, server: str) -> list[ToolInfo]:
        """The server's tools (connecting it first where it is not)."""
        entry = self._entry(server)
        await self._connected(entry)
        return list(entry.tools or ())

    async def call(self, server: str, tool: str, arguments: dict[str, Any], *,
                   timeout: float | None = None) -> CallOutcome:
        """Call ``tool`` of ``server`` within ``timeout`` (the server's ``timeout``, else ``tool_timeout``)."""
        entry = self._entry(server)
        connection = await self._connected(entry)
        entry.calls += 1
        try:
            seconds = timeout or entry.config.timeout or self.tool_timeout
            result = await connection.call(tool, arguments, timeout=seconds)
        except ToolError as exc:
            if not connection.alive and entry.connection is connection:
                self._drop(entry, connection.lost.reason or exc.reason)
            raise entry.redacted(exc) from None
        entry.failures = 0
        return result

    async def _connected(self, entry: _Server) -> Connection:
        connection = entry.connection
        if connection is not None and connection.alive:
            return connection
        if connection is not None:
            self._drop(entry, connection.lost.reason or "the connection ended")
        if entry.connecting is None:
            wait = entry.retry_at - time.monotonic()
            if entry.state is State.FAILED and wait > 0:
                if wait > WAIT_BACKOFF:
                    raise ToolError(f"{entry.config.name}: {entry.error} (tried again in {wait:.0f} s)")
                await asyncio.sleep(wait)
            if entry.connecting is None:  # another caller may have started it meanwhile
                entry.connecting = asyncio.create_task(self._connect(entry), name=f"mcp connect {entry.config.name}")
                entry.connecting.add_done_callback(_retrieved)
        return await asyncio.shield(entry.connecting)

    async def _connect(self, entry: _Server) -> Connection:
        config = entry.config
        entry.move(State.CONNECTING)
        entry.connects += 1
        connection: Connection | None = None
        try:
            opener = await self._opener(entry)
            connection = sdk().Connection(config.name, opener, max_tools=config.max_tools,
                                    max_result_bytes=self.max_result_bytes, timeout=CONNECT_TIMEOUT)
            await connection.start(CONNECT_TIMEOUT)
            entry.tools = await connection.tools()
        except ToolError as exc:
            if connection is not None:
                await connection.close()
            exc = entry.redacted(exc)
            entry.move(State.FAILED, exc.reason)
            raise exc from None
        except BaseException:
            if connection is not None:
                await connection.close()
            entry.move(State.FAILED, "the connect was cancelled")
            raise
        finally:
            entry.connecting = None
        connection.timeout = config.timeout or self.tool_timeout
        entry.connection = connection
        entry.move(State.READY)
        return connection

    def _drop(self, entry: _Server, reason: str) -> None:
        """A connection that ended: the server fails with its reason, and the connection is closed aside."""
        connection, entry.connection = entry.connection, None
        if entry.state is State.READY:
            entry.move(State.FAILED, redact(reason, entry.secrets))
        if connection is not None:
            task = asyncio.create_task(connection.close(), name=f"mcp close {entry.config.name}")
            task.add_done_callback(_retrieved)

    async def _opener(self, entry: _Server):  # noqa: ANN202 (an Opener)
        config = entry.config
        if config.command is not None:
            env = {k: await self._secret(config.name, f"env.{k}", ref) for k, ref in config.env.items()}
            entry.secrets = tuple(env.values())
            command, args, cwd = config.command, config.args, config.cwd
            stdio = sdk()
            return lambda lost: stdio.stdio_transport(command, args, env, cwd, lost, max_message=stdio.MAX_MESSAGE)
        headers = {k: await self._secret(config.name, f"headers.{k}", ref) for k, ref in config.headers.items()}
        entry.secrets = tuple(headers.values())
        url, http = config.url or "", sdk()
        return lambda lost: http.http_transport(url, headers, lost, allow_private=True, max_message=http.MAX_MESSAGE)

    async def _secret(self, server: str, where: str, ref: SecretRef) -> str:
        """A secret's value (see the module); ``ToolError`` naming where it was wanted, never its value."""
        if ref.value is not None:
            return ref.value
        if ref.env is not None:
            value = os.environ.get(ref.env)
            if value is None:
                raise ToolError(f"{server}: {where} names the environment variable {ref.env}, which is not set")
            return value
        name = ref.file or ""
        path = self.state_dir / "secrets" / name
        try:
            data = await asyncio.to_thread(_read_bounded, path)
        except (OSError, ValueError) as exc:
            raise ToolError(f"{server}: {where} names the secret file secrets/{name}, which cannot be read "
                            f"({exc.__class__.__name__})") from None
        return data

    def status(self) -> list[dict[str, Any]]:
        """Each server for the page and ``/mcp``: its name, transport, state, tools, last error and counts."""
        return [{"name": name, "transport": e.config.transport, "state": e.state.value,
                 "tools": None if e.tools is None else [t.name for t in e.tools],
                 "error": e.error, "calls": e.calls, "connects": e.connects}
                for name, e in self._servers.items()]

    async def close(self) -> None:
        """Close every connection (a stdio server's process is terminated)."""
        for entry in self._servers.values():
            task, entry.connecting = entry.connecting, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait({task}, timeout=15)
            connection, entry.connection = entry.connection, None
            if connection is not None:
                await connection.close()
            if entry.state is not State.IDLE:
                entry.move(State.IDLE)

    @contextlib.asynccontextmanager
    async def adhoc(self, url: str, headers: dict[str, str]) -> AsyncIterator[Connection]:
        """A connection to the streamable-HTTP server at ``url`` that a request named, for that
        request alone, at a public address only (``mcphttp``); ``ToolError`` where it cannot be made."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ToolError(f"{url[:100]!r} is not an http:// or https:// URL", "refused")
        label = parts.hostname
        fixed = dict(headers)
        client = sdk()
        connection = client.Connection(label, lambda lost: client.http_transport(url, fixed, lost, allow_private=False,
                                                                                 max_message=client.MAX_MESSAGE),
                                       max_tools=256, max_result_bytes=self.max_result_bytes, timeout=self.tool_timeout)
        await connection.start(CONNECT_TIMEOUT)
        try:
            yield connection
        finally:
            await connection.close()


def _read_bounded(path: Path) -> str:
    with path.open("rb") as f:
        data = f.read(MAX_SECRET + 1)
    if len(data) > MAX_SECRET:
        raise ValueError("too large")
    return data.decode("utf-8").strip()


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A background task's failure is said where it is awaited; here it is only retrieved."""
    if not task.cancelled():
        task.exception()


class _Sdk:
    """The MCP client's modules, imported at a first connection (``sdk``)."""

    def __init__(self) -> None:
        from .mcpclient import MAX_MESSAGE, Connection
        from .mcphttp import http_transport
        from .mcpstdio import stdio_transport
        self.MAX_MESSAGE, self.Connection = MAX_MESSAGE, Connection
        self.http_transport, self.stdio_transport = http_transport, stdio_transport


_SDK: list[_Sdk] = []


def sdk() -> _Sdk:
    """The MCP client (``mcpclient``, ``mcphttp``, ``mcpstdio``), imported on first use: the
    ``mcp`` SDK they use brings OpenTelemetry's API, which a gateway with no MCP server (and no
    tracing) never loads."""
    if not _SDK:
        _SDK.append(_Sdk())
    return _SDK[0]


__all__ = ["McpServers", "State"]
