"""What every part of the hosted tools shares: the kinds (``Kind``), what a request asks for
(``Ask``, read by each wire's parser from its own shape), what the backends give back
(``ToolInfo``, ``SearchResult``, ``Page``, ``CallOutcome``), the one failure a model reads
(``ToolError``), which servers a key may use (``may_use``), a reason told without a server's
secrets (``redact``), and what the configured MCP servers
offer those who run their tools (``McpTools``: ``tools/mcpservers.McpServers`` has it; the
answer's loop and ``/mcp`` read it). Pure; no I/O.

A hosted tool is offered to the model as a function in its own tool format: ``web_search``
(``{query}``), ``web_fetch`` (``{url}``), and an MCP server's tool as ``<server>_<tool>`` with
the server's own input schema (``function_name``)."""

from __future__ import annotations

import enum
import fnmatch
import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class Kind(str, enum.Enum):
    WEB_SEARCH = "web_search"
    WEB_FETCH = "web_fetch"
    MCP = "mcp"


@dataclass
class Ask:
    """One hosted tool a request asks for, in its wire's words.

    ``type``: the wire's own (``web_search_20250305``, ``web_fetch_20250910``,
    ``web_search``, ``web_search_preview``, ``mcp``, ``mcp_toolset``, ``web_search_options``);
    ``name``: the name the wire gives the tool (Anthropic's ``name``); ``param``: where it came,
    for an error. For MCP: ``server`` is the server's label (Responses' ``server_label``,
    Anthropic's ``mcp_servers[].name``), ``url`` the URL the request gave (None: a configured
    server named by its label), ``headers`` what the request sends it (an authorization),
    ``allowed_tools`` the tools of it offered (None: all), ``denied_tools`` those of them not
    offered (Anthropic's ``mcp_toolset`` with tools disabled by name), ``approval`` the tools
    whose call waits for the caller's approval (Responses' ``require_approval``; ``("*",)``:
    every one), ``approval_exempt`` those of ``("*",)`` that do not wait (``require_approval``'s
    ``never`` list with no ``always`` list)."""

    kind: Kind
    type: str
    param: str = "tools"
    name: str | None = None
    max_uses: int | None = None
    max_results: int | None = None  # web search: results asked for (None: ``web_search.max_results``)
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    server: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    allowed_tools: tuple[str, ...] | None = None
    approval: tuple[str, ...] = ()
    denied_tools: tuple[str, ...] = ()
    approval_exempt: tuple[str, ...] = ()


@dataclass
class Approval:
    """A caller's answer to an approval request (Responses' ``mcp_approval_response``): the
    request's id, and whether the call may run; ``server``, ``name`` and ``arguments`` (a JSON
    string) those of the ``mcp_approval_request`` it answers, where the request carries that
    item (in its input, or in its previous response's output); None where it does not."""

    request_id: str
    approve: bool
    reason: str | None = None
    server: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass(frozen=True)
class ToolInfo:
    """One tool an MCP server lists."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    content: str = ""  # the snippet the backend gave
    page_age: str | None = None


@dataclass(frozen=True)
class Page:
    """A fetched page, as text (HTML turned into text by a library made for it)."""

    url: str  # where it was read, after redirects
    title: str
    text: str
    content_type: str = "text/plain"
    retrieved_at: str = ""  # ISO 8601, UTC
    links: tuple[str, ...] = ()  # its links, absolute http(s) URLs (Ollama's web_fetch answers them)


@dataclass(frozen=True)
class CallOutcome:
    """What an MCP tool's call gave: its text (the content's text parts joined; a picture or
    other part named, not carried), whether the server said it failed, its size as received,
    and whether the text was cut to the bounds."""

    text: str
    is_error: bool = False
    bytes: int = 0
    truncated: bool = False


class ToolError(Exception):
    """A hosted tool could not give a result: the reason, which the model reads as the call's
    result (``is_error``) and the caller sees in the result block; never a 500. ``outcome``:
    the metric's label (``error``, ``timeout``, ``refused``, ``too_large``)."""

    def __init__(self, reason: str, outcome: str = "error"):
        super().__init__(reason)
        self.reason = reason
        self.outcome = outcome


REDACTED = "[secret]"
MIN_REDACTED = 6  # characters of the shortest value redacted: a shorter one ("1", "true") is no secret


def redact(text: str, secrets: tuple[str, ...] | list[str]) -> str:
    """``text`` with every one of ``secrets`` (an MCP server's configured ``env`` and ``headers``
    values) said as ``[secret]``: a reason a server failed for, which its own output may spell
    (a stdio server's stderr, an HTTP server's error message), reaches the page, the caller and
    the log."""
    for secret in sorted((s for s in secrets if len(s) >= MIN_REDACTED), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def function_name(server: str, tool: str) -> str:
    """An MCP tool's name as the model sees it (and as ``/mcp`` lists it): ``<server>_<tool>``,
    llama-server's naming."""
    return f"{server}_{tool}"


def may_use(patterns: tuple[str, ...] | None, server: str) -> bool:
    """Whether a key whose ``mcp`` setting is ``patterns`` (None: unset, every server) may use
    the configured MCP server ``server``."""
    return patterns is None or any(fnmatch.fnmatchcase(server, p) for p in patterns)


class McpTools(Protocol):
    """The configured MCP servers, as those who run their tools see them (``McpServers``).

    ``names``: the configured servers' names. ``status()``: one row per server, for the page:
    ``{"name", "transport": "stdio"|"http", "state": "idle"|"connecting"|"ready"|"failed",
    "tools": [names], "error": str|None, "calls": int}``. ``tools(server)``: its tools (listed
    once connected, bounded by its ``max_tools``). ``call(server, tool, arguments)``: one call,
    within ``timeout`` (None: the server's own or ``server.tool_timeout``), its text bounded.
    ``tools`` and ``call`` raise ``ToolError``, never anything else, for a server that fails."""

    @property
    def names(self) -> list[str]: ...

    def status(self) -> list[dict[str, Any]]: ...

    async def tools(self, server: str) -> list[ToolInfo]: ...

    async def call(self, server: str, tool: str, arguments: dict[str, Any], *,
                   timeout: float | None = None) -> CallOutcome: ...


def call_record(name: str, server: str | None, kind: Kind, started: float, wall: float, size: int,
                error: str | None, outcome: str, *, configured: bool = True, cut: bool = False) -> dict[str, Any]:
    """A hosted call's line in its request's observation (``Observation.hosted_tool_calls``: the
    inference event, the trace's ``execute_tool`` span, the metric, the capture's row).
    ``started``: its monotonic start, ``wall``: its time; ``configured``: its server is one of
    ``server.mcp_servers`` (else its names never become a metric's series)."""
    return {"name": name, "server": server, "configured": configured, "kind": kind.value,
            "seconds": round(time.monotonic() - started, 6), "bytes": size, "error": error, "outcome": outcome,
            "cut": cut, "started": started, "time": wall}
