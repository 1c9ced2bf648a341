"""The SDK's side of ``/mcp`` (``api/mcp``): its low-level ``Server`` (``tools/list``,
``tools/call``) behind its ``StreamableHTTPSessionManager`` in stateless JSON mode, for one
application (``Endpoint``), and the caller each exchange is answered for (``Caller``). Imported by
``api/mcp`` at the first request to ``/mcp``: the ``mcp`` SDK brings OpenTelemetry's API, which a
gateway that serves no MCP (and no traces) never loads."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from aiohttp import web
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from .. import __version__
from ..base.errors import shown
from ..server.events import Observation
from ..tools.hosted import Kind, McpTools, ToolError, call_record, function_name, may_use
from .appkeys import CONFIG, MCP_SERVERS

log = logging.getLogger(__name__)

SCOPE_KEY = "gguf_gateway.caller"  # where the ASGI scope carries the caller to the handlers
INSTRUCTIONS = ("The tools of the MCP servers this gateway connects to, each named <server>_<tool>; "
                "a failed call is a result marked isError that says why.")


@dataclass(frozen=True)
class Caller:
    """Who asks, as the handlers need it: the key's ``mcp`` patterns (None: every server)."""

    name: str
    patterns: tuple[str, ...] | None
    observation: Observation | None = None  # the request's: each call is a line of it (``record``)


NOBODY = Caller("-", ())  # a request the scope names no caller for: no server


def usable(servers: McpTools, caller: Caller) -> list[str]:
    """The configured servers ``caller`` may use, in their configured order."""
    return [name for name in servers.names if may_use(caller.patterns, name)]


def resolve(name: str, servers: list[str]) -> tuple[str, str] | None:
    """``<server>_<tool>`` split back by the longest of ``servers`` that prefixes it (a server's
    name may hold ``_`` or ``-``, and so may a tool's), or None."""
    for server in sorted(servers, key=len, reverse=True):
        if name.startswith(server + "_") and len(name) > len(server) + 1:
            return server, name[len(server) + 1:]
    return None


class Endpoint:
    """The SDK's server and its session manager for one application, and the task that runs
    the manager (started by the first request, stopped by ``close``)."""

    def __init__(self, app: web.Application):
        self.app = app
        self.server: Server[Any] = Server("gguf-gateway", version=__version__, instructions=INSTRUCTIONS,
                                          on_list_tools=self.list_tools, on_call_tool=self.call_tool)
        self.manager = StreamableHTTPSessionManager(
            self.server, json_response=True, stateless=True,
            # the gateway's own middlewares check the Host (on loopback) and the Origin (CSRF)
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            # a backstop: ``api/body`` bounds the body, and the JSON written again may differ in length
            max_request_body_size=2 * app[CONFIG].server.max_body_bytes)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    async def started(self) -> StreamableHTTPSessionManager:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mcp endpoint")
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            await asyncio.wait([ready, self._task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self._ready.is_set():
            raise RuntimeError("the MCP endpoint's session manager did not start")
        return self.manager

    async def _run(self) -> None:
        async with self.manager.run():
            self._ready.set()
            await self._stop.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._stop.set()
            await asyncio.gather(self._task, return_exceptions=True)

    def servers(self) -> McpTools | None:
        return self.app.get(MCP_SERVERS)

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        servers, caller = self.servers(), caller_of(ctx)
        if servers is None:
            return types.ListToolsResult(tools=[])
        names = usable(servers, caller)
        bound = self.app[CONFIG].server.tool_timeout
        listed = await asyncio.gather(*(asyncio.wait_for(servers.tools(n), bound) for n in names),
                                      return_exceptions=True)
        tools: list[types.Tool] = []
        for name, infos in zip(names, listed):
            if isinstance(infos, BaseException):
                if isinstance(infos, asyncio.CancelledError):
                    raise infos
                why = infos.reason if isinstance(infos, ToolError) else \
                    f"no list within {bound:g} s" if isinstance(infos, asyncio.TimeoutError) else type(infos).__name__
                log.warning("/mcp: the tools of MCP server %r are left out: %s", name, why)
                continue
            for info in infos:
                try:
                    tools.append(types.Tool(name=function_name(name, info.name), description=info.description or None,
                                            input_schema=info.input_schema))
                except ValueError as e:  # a schema the protocol's model refuses
                    log.warning("/mcp: tool %r of MCP server %r left out: %s", info.name, name,
                                shown(str(e), 200))
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        servers, caller = self.servers(), caller_of(ctx)
        found = resolve(params.name, usable(servers, caller)) if servers is not None else None
        if servers is None or found is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {shown(params.name, 200)}")
        server, tool = found
        started, wall = time.monotonic(), time.time()
        try:
            outcome = await servers.call(server, tool, dict(params.arguments or {}))
        except ToolError as e:
            log.info("/mcp: %s's call of %s/%s failed (%s): %s", caller.name, server, tool, e.outcome,
                     shown(e.reason, 200))
            record(caller, server, tool, started, wall, 0, e.reason, e.outcome)
            return types.CallToolResult(content=[types.TextContent(text=e.reason)], is_error=True)
        except Exception:  # McpTools raises ToolError alone: anything else is the gateway's fault, logged
            log.exception("/mcp: the call of %s/%s failed", server, tool)
            record(caller, server, tool, started, wall, 0, "the gateway failed", "error")
            return types.CallToolResult(content=[types.TextContent(text=f"The gateway failed to call {tool!r}")],
                                        is_error=True)
        record(caller, server, tool, started, wall, outcome.bytes, outcome.text if outcome.is_error else None,
               "error" if outcome.is_error else "ok")
        return types.CallToolResult(content=[types.TextContent(text=outcome.text)], is_error=outcome.is_error)


def record(caller: Caller, server: str, tool: str, started: float, wall: float, size: int, error: str | None,
           outcome: str) -> None:
    """A call through ``/mcp`` as a line of its request's observation, as an answer's hosted call is
    (``toolbox.Ran.record``): the inference event's ``hosted_tool_calls``, the trace's
    ``execute_tool`` span, the metric, the capture's row."""
    if caller.observation is None:
        return
    caller.observation.hosted_tool_calls.append(call_record(
        tool, server, Kind.MCP, started, wall, size, None if error is None else shown(error, 300), outcome))


def caller_of(ctx: Any) -> Caller:
    """The caller the bridge put in the request's ASGI scope (``SCOPE_KEY``); none: ``NOBODY``."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    caller = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    return caller if isinstance(caller, Caller) else NOBODY


