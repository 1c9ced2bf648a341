"""The application's typed state, one key each: handlers import these, never ``app.py``
(which imports the handlers)."""

from __future__ import annotations

from aiohttp import web

from ..access.gate import Gate
from ..base.secretfile import KeptSecret
from ..models.config import Config
from ..server.captures import CaptureStore
from ..server.connections import ConnectionGuard
from ..server.events import EventSink
from ..server.live import Live
from ..server.metrics import Metrics
from ..server.response_store import ResponseStore
from ..server.tracing import Tracing
from ..serving.registry import Registry
from ..tools.hosted import McpTools
from ..tools.toolbox import Services

CONFIG = web.AppKey("config", Config)
REGISTRY = web.AppKey("registry", Registry)
METRICS = web.AppKey("metrics", Metrics)
EVENTS = web.AppKey("events", EventSink)
LIFECYCLE = web.AppKey("lifecycle", dict)  # {"draining": bool}
CONNECTIONS = web.AppKey("connections", ConnectionGuard)
LIVE = web.AppKey("live", Live)  # what the dashboard draws
RESPONSES = web.AppKey("responses", ResponseStore)  # OpenAI Responses kept for previous_response_id
SEAL_KEY = web.AppKey("seal_key", KeptSecret)  # what a reasoning item's encrypted_content is signed with
GATE = web.AppKey("gate", Gate)  # the keys in force, their limits, and the usage store
CAPTURES = web.AppKey("captures", CaptureStore)  # requests and answers kept (server.capture)
# OpenTelemetry's traces (``server/tracing``), or None: off, and nothing of OpenTelemetry imported
TRACING: web.AppKey[Tracing | None] = web.AppKey("tracing")
# the hosted tools' services (``tools/toolbox.Services``: MCP servers, web search and fetch)
TOOLS = web.AppKey("tools", Services)
# the configured MCP servers (``tools/mcpservers.McpServers``): their tools for every wire and ``/mcp``,
# their state for the page (the same object as ``TOOLS``' ``mcp``: this key types it by the seam ``/mcp``
# and the page use, ``tools/hosted.McpTools``); absent where none is set (``/mcp`` then lists no tool)
MCP_SERVERS: web.AppKey[McpTools] = web.AppKey("mcp_servers")
