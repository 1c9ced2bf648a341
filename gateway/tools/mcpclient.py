"""One connection to an MCP server through the official SDK (``mcp.Client``): its tools, bounded,
and its calls, bounded; whatever the transport (``mcpstdio``, ``mcphttp``).

The SDK's client lives in a task of its own (``Connection.start``), because its task groups and
cancel scopes must be entered and left in one task; calls come from the requests' tasks. The
transport's stream of messages passes ``_Guarded`` first: the gateway offers a server no
capability (no sampling, elicitation or roots) and reads none of its notifications, so both are
dropped there, and a flood of them costs one parse each, no task, no memory; a ``tools`` list
is cut to ``MAX_LISTED`` before the SDK builds its models. What ended a connection (the server
exited, sent a message past the cap, was refused) is ``Lost``, which its calls then report.

A call is bounded in time (``anyio.fail_after``; the SDK sends the server a courtesy cancel), and
its answer cut to ``max_result_bytes``. A caller that is cancelled (the client left) cancels its
own call only; the connection stays for the others."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client._transport import TransportStreams
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from .hosted import CallOutcome, ToolError, ToolInfo

log = logging.getLogger(__name__)

MAX_MESSAGE = 32 << 20  # bytes of one message from a server: past it, the answer is refused ("too_large")
MAX_LISTED = 10_000  # tools of one list page the SDK is given to read (models.yaml's max_tools is at most this)
MAX_PAGES = 32  # pages of a tool list read at most
MAX_DESCRIPTION = 4096  # characters of a tool's description kept
MAX_SCHEMA = 64 * 1024  # bytes of a tool's input schema, as JSON; past it the tool is left out
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
CLOSE_WAIT = 10.0  # seconds a closing connection's task is given before it is cancelled

Opener = Callable[["Lost"], AbstractAsyncContextManager[TransportStreams]]


class Lost:
    """Why a connection ended, once said: the first reason wins; ``outcome`` is the metric's
    label (``error``, ``refused``, ``too_large``). ``oversize`` counts answers refused for their
    size on a connection that lives on (an HTTP response), so a call can name its failure."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.outcome = "error"
        self.oversize = 0
        self.event = anyio.Event()

    def set(self, reason: str, outcome: str = "error") -> None:
        if self.reason is None:
            self.reason, self.outcome = reason, outcome
        self.event.set()


class _Guarded:
    """The transport's read stream, less what the gateway never reads (see the module)."""

    def __init__(self, inner: Any, lost: Lost):
        self._inner = inner
        self._lost = lost
        self.dropped = 0

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            try:
                item = await self._inner.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                self._lost.set("the server closed the connection")
                raise
            if isinstance(item, SessionMessage):
                message = item.message
                if isinstance(message, types.JSONRPCNotification | types.JSONRPCRequest):
                    self.dropped += 1
                    continue
                if isinstance(message, types.JSONRPCResponse):
                    tools = message.result.get("tools")
                    if isinstance(tools, list) and len(tools) > MAX_LISTED:
                        del tools[MAX_LISTED:]
            return item

    def __aiter__(self) -> _Guarded:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Guarded:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _guarded(opener: Opener, lost: Lost):  # noqa: ANN202
    async with opener(lost) as (read, write):
        yield _Guarded(read, lost), write


def bounded_tool(tool: types.Tool) -> ToolInfo | None:
    """The tool as the gateway offers it, or None where it is past the bounds (see ``TOOL_NAME``,
    ``MAX_SCHEMA``); a description is cut, not refused."""
    if not TOOL_NAME.fullmatch(tool.name):
        return None
    schema = tool.input_schema
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return None
    try:
        if len(json.dumps(schema, ensure_ascii=False)) > MAX_SCHEMA:
            return None
    except (TypeError, ValueError, RecursionError):
        return None
    return ToolInfo(name=tool.name, description=(tool.description or "")[:MAX_DESCRIPTION], input_schema=schema)


def outcome(result: types.CallToolResult, max_bytes: int) -> CallOutcome:
    """A call's result as the model reads it: the text parts joined, any other part named (``[image]``),
    cut to ``max_bytes`` on a character's boundary."""
    parts = []
    for part in result.content:
        text = getattr(part, "text", None)
        parts.append(text if part.type == "text" and isinstance(text, str) else f"[{part.type}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False)[: max_bytes + 1])
    data = "\n".join(parts).encode("utf-8", "replace")
    cut = len(data) > max_bytes
    text = data[:max_bytes].decode("utf-8", "ignore") if cut else data.decode("utf-8")
    return CallOutcome(text=text, is_error=bool(result.is_error), bytes=len(data), truncated=cut)


class Connection:
    """One MCP session (see the module). ``start`` it (or enter it), then ``tools`` and ``call``;
    ``close`` it. Raises ``ToolError`` with a reason a model may read; never the server's traceback."""

    def __init__(self, label: str, opener: Opener, *, max_tools: int, max_result_bytes: int, timeout: float):
        self.label = label
        self.max_tools = max_tools
        self.max_result_bytes = max_result_bytes
        self.timeout = timeout
        self.lost = Lost()
        self._opener = opener
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._closing = anyio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tools: list[ToolInfo] | None = None

    @property
    def alive(self) -> bool:
        return self._client is not None and self.lost.reason is None

    async def start(self, timeout: float) -> None:
        """Connect and negotiate within ``timeout`` seconds; ``ToolError`` otherwise."""
        self._task = asyncio.create_task(self._run(), name=f"mcp {self.label}")
        try:
            with anyio.fail_after(timeout):
                done = asyncio.ensure_future(self._ready.wait())
                try:
                    await asyncio.wait({done, self._task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    done.cancel()
        except TimeoutError:
            await self.close()
            raise ToolError(f"{self.label}: no answer to the handshake within {timeout:g} s", "timeout") from None
        except BaseException:
            await self.close()
            raise
        if not self.alive:
            await self.close()
            raise ToolError(f"{self.label}: {self.lost.reason or 'could not connect'}", self.lost.outcome)

    async def _run(self) -> None:
        try:
            client = Client(_guarded(self._opener, self.lost), cache=None,
                            client_info=types.Implementation(name="gguf-gateway", version="1"))
            async with client:
                self._client = client
                self._ready.set()
                await self._closing_or_lost()
        except Exception as exc:  # noqa: BLE001 (whatever ended it is its reason, logged, never raised)
            self.lost.set(_reason(exc))
            log.info("MCP server %s: connection ended: %s", self.label, self.lost.reason,
                     exc_info=log.isEnabledFor(logging.DEBUG))
        finally:
            self._client = None
            self.lost.set("the connection was closed")

    async def _closing_or_lost(self) -> None:
        async with anyio.create_task_group() as tg:
            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()
            tg.start_soon(wait, self._closing)
            tg.start_soon(wait, self.lost.event)

    async def close(self) -> None:
        """End the session (a stdio server's process terminated); waits at most ``CLOSE_WAIT`` seconds."""
        self._closing.set()
        task = self._task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=CLOSE_WAIT)
        if not done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({task}, timeout=CLOSE_WAIT)

    async def __aenter__(self) -> Connection:
        await self.start(self.timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _live(self) -> Client:
        client = self._client
        if client is None or self.lost.reason is not None:
            raise ToolError(f"{self.label}: {self.lost.reason or 'not connected'}", self.lost.outcome)
        return client

    async def tools(self) -> list[ToolInfo]:
        """The server's tools, listed once: at most ``max_tools``, each within the bounds."""
        if self._tools is None:
            self._tools = await self._guard(self._list(), self.timeout, "listing its tools")
        return self._tools

    async def _list(self) -> list[ToolInfo]:
        client = self._live()
        kept: dict[str, ToolInfo] = {}
        skipped = left = 0
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            for tool in page.tools:
                if len(kept) >= self.max_tools:
                    left += 1
                    continue
                info = bounded_tool(tool)
                if info is None or info.name in kept:
                    skipped += 1
                else:
                    kept[info.name] = info
            cursor = page.next_cursor
            if cursor is None or len(kept) >= self.max_tools:
                break
        if skipped or left or cursor is not None:
            log.warning("MCP server %s: %d tools taken; %d past the bounds left out, %d past max_tools (%d)%s",
                        self.label, len(kept), skipped, left, self.max_tools,
                        ", and the pages after the last read" if cursor is not None else "")
        return list(kept.values())

    async def call(self, tool: str, arguments: dict[str, Any], *, timeout: float | None = None) -> CallOutcome:
        """Call ``tool``; a failure the server reports is ``CallOutcome(is_error=True)``, any other a ``ToolError``."""
        seconds = self.timeout if timeout is None else timeout
        return await self._guard(self._call(tool, arguments), seconds, f"calling {tool}")

    async def _call(self, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        result = await self._live().call_tool(tool, arguments)
        return outcome(result, self.max_result_bytes)

    async def _guard(self, work: Any, seconds: float, doing: str) -> Any:
        oversize = self.lost.oversize
        try:
            with anyio.fail_after(seconds):
                return await work
        except TimeoutError:
            raise ToolError(f"{self.label}: no answer {doing} within {seconds:g} s", "timeout") from None
        except ToolError:
            raise
        except MCPError as exc:
            if self.lost.oversize != oversize or "exceeded the" in exc.message:
                raise ToolError(f"{self.label}: its answer was over {MAX_MESSAGE} bytes", "too_large") from None
            if exc.code == types.CONNECTION_CLOSED:
                with contextlib.suppress(TimeoutError):
                    with anyio.fail_after(1.0):  # what ended it, once the connection's task has said
                        await self.lost.event.wait()
                why = self.lost.reason or "the connection closed"
                raise ToolError(f"{self.label}: {why}", self.lost.outcome) from None
            raise ToolError(f"{self.label}: error {doing}: {exc.message[:500]}") from None
        except Exception as exc:  # noqa: BLE001 (a server's bad answer, in words; the traceback to the debug log)
            log.debug("MCP server %s: %s failed", self.label, doing, exc_info=True)
            raise ToolError(f"{self.label}: error {doing}: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """An exception in words, the innermost of a group; never a traceback."""
    while getattr(exc, "exceptions", None):  # an exception group (Python 3.11's, or anyio's backport)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(exc, MCPError):
        return exc.message[:500]
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text[:300]}" if text else exc.__class__.__name__
