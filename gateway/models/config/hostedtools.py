"""models.yaml's keys for the tools the gateway runs itself (``gateway/tools``): the MCP servers
it may connect to (``server.mcp_servers``), the backend that answers web searches
(``server.web_search``), and the secrets their settings may name. Declared here once, as checks
with their JSON Schema; ``server.py`` lists them among the section's keys.

A secret (an MCP server's header or environment value) is written inline, or as ``{env: NAME}``
(read from the gateway's environment) or ``{file: NAME}`` (a file in the state folder's
``secrets`` folder): ``SecretRef``, read when a connection is made (``tools/mcpservers``), so a
changed file is read again and a secret never sits in the parsed configuration."""

from __future__ import annotations

import re
from typing import Any

from ...base import checks
from ...base.checks import INVALID, Report, show
from .specs import McpServerConfig, SecretRef, WebSearchConfig

# a server's name is part of its tools' names (``<server>_<tool>``) and of the page's URLs
SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,47}")
_SECRET_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # RFC 9110's token
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

SECRET_SCHEMA = {"anyOf": [
    {"type": "string"},
    {"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"], "additionalProperties": False},
    {"type": "object", "properties": {"file": {"type": "string"}}, "required": ["file"], "additionalProperties": False},
]}


@checks.accepts(SECRET_SCHEMA)
def secret(r: Report, where: str, v: Any) -> Any:
    """A value given inline, or ``{env: NAME}``, or ``{file: NAME}`` (in the state folder's ``secrets``)."""
    if isinstance(v, str):
        if "\n" in v or "\r" in v or "\x00" in v:
            r.error(where, "must be one line")
            return INVALID
        return SecretRef(value=v)
    if isinstance(v, dict) and len(v) == 1:
        (kind, name), = v.items()
        if kind == "env" and isinstance(name, str) and _ENV.fullmatch(name):
            return SecretRef(env=name)
        if kind == "file" and isinstance(name, str) and _SECRET_NAME.fullmatch(name) and name not in (".", ".."):
            return SecretRef(file=name)
    r.error(where, f"must be a string, {{env: NAME}} or {{file: NAME}} (a file in the state folder's secrets), "
                   f"got {show(v)}")
    return INVALID


def _named(pattern: re.Pattern[str], what: str) -> checks.Check:
    @checks.accepts(checks.nullable({"type": "object", "propertyNames": {"pattern": f"^{pattern.pattern}$"},
                                     "additionalProperties": SECRET_SCHEMA}))
    def check(r: Report, where: str, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            r.error(where, f"must be a mapping of {what} to values, got {show(v)}")
            return INVALID
        out = {}
        for key, item in v.items():
            if not isinstance(key, str) or not pattern.fullmatch(key):
                r.error(f"{where}.{key}", f"is not a valid {what}")
                continue
            parsed = secret(r, f"{where}.{key}", item)
            if parsed is not INVALID:
                out[key] = parsed
        return out
    return check


@checks.accepts({"type": "string", "pattern": "^https?://"})
def http_url(r: Report, where: str, v: Any) -> Any:
    if not isinstance(v, str) or not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", v.strip()):
        r.error(where, f"must be an http:// or https:// URL, got {show(v)}")
        return INVALID
    return v.strip()


_SERVER: dict[str, checks.Check] = {
    "command": checks.string,
    "args": checks.list_of(checks.string),
    "env": _named(_ENV, "environment variable names"),
    "cwd": checks.path,
    "url": http_url,
    "headers": _named(_HEADER, "header names"),
    "timeout": checks.positive_seconds,
    "max_tools": checks.integer(minimum=1, maximum=10000, what="an integer from 1 to 10000"),
}
SERVER_DOCS = {
    "command": "stdio: the program to start", "args": "stdio: its arguments",
    "env": "stdio: its environment (added to a minimal one); a value may be {env: NAME} or {file: NAME}",
    "cwd": "stdio: its working folder",
    "url": "streamable HTTP: the server's URL",
    "headers": "streamable HTTP: headers sent (a value may be {env: NAME} or {file: NAME})",
    "timeout": "seconds one call may take (unset: server.tool_timeout)",
    "max_tools": "the most tools taken from its list",
}


@checks.accepts(checks.nullable({"type": "object", "propertyNames": {"pattern": f"^{SERVER_NAME.pattern}$"},
                                  "additionalProperties": checks.object_schema(_SERVER)}))
def mcp_servers(r: Report, where: str, v: Any) -> Any:
    """``NAME: {command, args, env, cwd}`` (stdio) or ``NAME: {url, headers}`` (streamable HTTP)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        r.error(where, f"must be a mapping of server names to their settings, got {show(v)}")
        return INVALID
    out: dict[str, McpServerConfig] = {}
    for name, value in v.items():
        at = f"{where}.{name}"
        if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
            r.error(at, "a server's name is 1 to 48 letters, digits or -, starting with a letter or digit")
            continue
        fields = checks.mapping(r, at, value, _SERVER)
        if ("command" in fields) == ("url" in fields):
            r.error(at, "needs exactly one of command (stdio) or url (streamable HTTP)")
            continue
        stdio_only = [k for k in ("args", "env", "cwd") if k in fields and "url" in fields]
        http_only = [k for k in ("headers",) if k in fields and "command" in fields]
        for k in stdio_only + http_only:
            r.error(f"{at}.{k}", "does not apply to this server's transport")
        if stdio_only or http_only:
            continue
        out[name] = McpServerConfig(name=name, **fields)
    return out


_SEARCH: dict[str, checks.Check] = {
    "searxng": http_url,
    "mcp": checks.string,
    "max_results": checks.integer(minimum=1, maximum=50, what="an integer from 1 to 50"),
}
SEARCH_DOCS = {
    "searxng": "a SearXNG server, asked at /search?q=...&format=json",
    "mcp": "or a tool of a configured MCP server, as SERVER/TOOL (called with {query})",
    "max_results": "results given to the model per search",
}


@checks.accepts(checks.nullable({"oneOf": [{**checks.object_schema(_SEARCH), "required": [k]}
                                           for k in ("searxng", "mcp")]}))
def web_search(r: Report, where: str, v: Any) -> Any:
    """The backend that answers searches: ``{searxng: URL}`` or ``{mcp: SERVER/TOOL}``."""
    if v is None:
        return None
    fields = checks.mapping(r, where, v, _SEARCH)
    if ("searxng" in fields) == ("mcp" in fields):
        r.error(where, "needs exactly one of searxng (a URL) or mcp (SERVER/TOOL)")
        return INVALID
    tool = fields.get("mcp")
    if tool is not None and not re.fullmatch(rf"{SERVER_NAME.pattern}/\S+", tool):
        r.error(f"{where}.mcp", f"must be SERVER/TOOL, got {show(tool)}")
        return INVALID
    return WebSearchConfig(**fields)


@checks.accepts(checks.nullable({"type": "array", "items": {"type": "string", "pattern": "^https?://"}}))
def allowed_urls(r: Report, where: str, v: Any) -> Any:
    """URL prefixes (scheme and host, maybe a path) a request may name as an MCP server."""
    urls = checks.list_of(http_url)(r, where, v)
    return urls


def check_references(r: Report, server: dict[str, Any]) -> None:
    """Keys that name each other: ``web_search.mcp``'s server is configured."""
    search = server.get("web_search")
    if isinstance(search, WebSearchConfig) and search.mcp is not None:
        name = search.mcp.split("/", 1)[0]
        if name not in server.get("mcp_servers", {}):
            r.error("server.web_search.mcp",
                    f"names the MCP server {show(name)}, which server.mcp_servers does not have")
