"""The hosted tools a request asks for, read from each wire's own shape into ``tools.hosted.Ask``.

Parsing does not depend on the server's configuration: every hosted tool the gateway can run
(web search, web fetch, an MCP server) becomes an ``Ask`` (``Parsed.hosted``), and the
pipeline decides which of them run and drops the rest (adding their types to
``Parsed.dropped``). A hosted tool of a kind the gateway never runs (code execution, file
search, computer use, ...) stays dropped by the wire's parser, as do these forms of the ones it
runs:

- Responses' ``mcp`` with a ``connector_id`` or a ``tunnel_id`` (OpenAI's own connectors and
  tunnels: nothing this server can reach);
- Responses' ``web_search`` with ``external_web_access: false`` (Codex's ``cached`` mode: the
  caller asked for no live access, and this server's search is live).

Each wire's shapes:

- **Anthropic**: ``web_search_YYYYMMDD`` and ``web_fetch_YYYYMMDD`` tools (every dated
  version, by prefix), ``mcp_servers`` (``mcp-client-2025-04-04``: a server's own
  ``tool_configuration``), and ``mcp_toolset`` tools (``mcp-client-2025-11-20``: which tools of
  a server, as an allowlist or a denylist; then every server is named by exactly one toolset).
- **Responses** (and chat completions' ``tools``): ``web_search``, ``web_search_2025_08_26``,
  ``web_search_preview``, ``web_search_preview_2025_03_11``, and ``mcp`` (``require_approval``
  is ``always`` where not given, as on OpenAI).
- **Chat completions**: ``web_search_options``.

Every field is checked as its wire checks it, a 400 naming its param in the wire's own words
otherwise; lists, names, headers and URLs are bounded.
"""

from __future__ import annotations

import re
from typing import Any

from ..base.errors import InvalidRequest
from ..tools.hosted import Ask, Kind
from .params import named, shown

MAX_DOMAINS = 256  # allowed or blocked domains of one tool
MAX_DOMAIN = 253  # characters: a DNS name's, a path after it allowed
MAX_NAMES = 512  # tool names in an allowlist, a denylist or an approval list
MAX_NAME = 128  # characters of an MCP tool's name
MAX_SERVERS = 16  # MCP servers of one request
MAX_HEADERS = 32  # headers a request sends one MCP server
MAX_HEADER = 8192  # characters of one header's value (a token)
MAX_URL = 2048
MAX_FIELD = 4096  # characters of a free-text field (a location's city, a server's description)

SERVER_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # a server's name: the prefix of its tools' names
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")  # an HTTP token
ANTHROPIC_SEARCH = re.compile(r"web_search_\d{8}")
ANTHROPIC_FETCH = re.compile(r"web_fetch_\d{8}")
ANTHROPIC_TOOLSET = "mcp_toolset"
RESPONSES_SEARCH = ("web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11")
RESPONSES_RUNS = frozenset(RESPONSES_SEARCH) | {"mcp"}  # the hosted types of Responses' (and chat's) tools read here
CONTEXT_SIZES = ("low", "medium", "high")
LOCATION_FIELDS = ("city", "country", "region", "timezone")


def _fail(message: str, param: str, anthropic: bool) -> InvalidRequest:
    return InvalidRequest(f"{named(param, anthropic)} {message}", param)


def _object(value: Any, param: str, anthropic: bool, optional: bool = True) -> dict[str, Any] | None:
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise _fail("must be an object", param, anthropic)
    return value


def _string(value: Any, param: str, anthropic: bool, limit: int = MAX_FIELD) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise _fail(f"must be a string of at most {limit} characters", param, anthropic)
    return value


def _positive(value: Any, param: str, anthropic: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(f"must be a positive integer, got {shown(value)}", param, anthropic)
    return value


def _flag(value: Any, param: str, anthropic: bool) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise _fail("must be true or false", param, anthropic)
    return value


def _domains(value: Any, param: str, anthropic: bool) -> tuple[str, ...]:
    """A list of domains (``example.com``, a path after it allowed; no scheme), bounded."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_DOMAINS:
        raise _fail(f"must be a list of at most {MAX_DOMAINS} domains", param, anthropic)
    for j, domain in enumerate(value):
        at = f"{param}.{j}" if anthropic else f"{param}[{j}]"
        if (not isinstance(domain, str) or not 0 < len(domain) <= MAX_DOMAIN or "://" in domain
                or any(c.isspace() for c in domain)):
            raise _fail(f"must be a domain such as example.com (no scheme, at most {MAX_DOMAIN} characters), got "
                        f"{shown(domain)}", at, anthropic)
    return tuple(value)


def _names(value: Any, param: str, anthropic: bool) -> tuple[str, ...]:
    """A list of MCP tools' names, bounded."""
    if not isinstance(value, list) or len(value) > MAX_NAMES:
        raise _fail(f"must be a list of at most {MAX_NAMES} tool names", param, anthropic)
    for j, name in enumerate(value):
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            at = f"{param}.{j}" if anthropic else f"{param}[{j}]"
            raise _fail(f"must be a tool's name of 1 to {MAX_NAME} characters, got {shown(name)}", at, anthropic)
    return tuple(dict.fromkeys(value))


def _url(value: Any, param: str, anthropic: bool) -> str:
    """An MCP server's URL: http or https, bounded. Where it may reach is the pipeline's
    question (``mcp_allowed_urls``, ``base/addresses``), not the parser's."""
    if (not isinstance(value, str) or len(value) > MAX_URL or not value.isascii()
            or not re.match(r"https?://[^\s/?#]+", value) or any(c.isspace() for c in value)):
        raise _fail(f"must be an http or https URL of at most {MAX_URL} characters, got {shown(value)}", param,
                    anthropic)
    return value


def _header_value(value: Any, param: str, anthropic: bool) -> str:
    if not isinstance(value, str) or len(value) > MAX_HEADER or any(c in value for c in "\r\n\0"):
        raise _fail(f"must be a string of at most {MAX_HEADER} characters on one line", param, anthropic)
    return value


def _headers(value: Any, param: str) -> dict[str, str]:
    """Responses' ``headers`` for an MCP server: names HTTP tokens, values one line, bounded."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_HEADERS:
        raise _fail(f"must be an object of at most {MAX_HEADERS} headers", param, False)
    for name, text in value.items():
        if not HEADER_NAME.fullmatch(name):
            raise _fail(f"names the header {shown(name)}, which is not an HTTP header name", param, False)
        _header_value(text, f"{param}.{name}", False)
    return dict(value)


def _location(value: Any, param: str, anthropic: bool, nested: bool = False) -> None:
    """A user's approximate location (``{"type": "approximate", "city", ...}``; chat's form
    nests the fields in ``approximate``). Checked, not used: the search backend is the
    server's own."""
    loc = _object(value, param, anthropic)
    if loc is None:
        return
    if loc.get("type", None if anthropic else "approximate") != "approximate":
        raise _fail(f"type must be \"approximate\", got {shown(loc.get('type'))}", f"{param}.type", anthropic)
    at = f"{param}.approximate" if nested else param
    fields = _object(loc.get("approximate"), at, anthropic, optional=False) if nested else loc
    assert fields is not None
    for name in LOCATION_FIELDS:
        _string(fields.get(name), f"{at}.{name}", anthropic, 256)


def _context_size(value: Any, param: str) -> None:
    if value is not None and value not in CONTEXT_SIZES:
        raise _fail(f"must be one of {', '.join(CONTEXT_SIZES)}, got {shown(value)}", param, False)


def unique(asks: list[Ask]) -> list[Ask]:
    """``asks`` (Responses' or chat's), each MCP server label in them once: a 400 otherwise."""
    seen: set[str] = set()
    for ask in asks:
        if ask.kind is Kind.MCP and ask.server is not None:
            if ask.server in seen:
                raise _fail(f"names the MCP server {shown(ask.server)} twice", f"{ask.param}.server_label", False)
            seen.add(ask.server)
    return asks


# --- Anthropic ---------------------------------------------------------------------------------

def anthropic_runs(kind: Any) -> bool:
    """Whether a tool ``type`` of Anthropic's is read into an ``Ask`` (not left out)."""
    return isinstance(kind, str) and (kind == ANTHROPIC_TOOLSET or bool(ANTHROPIC_SEARCH.fullmatch(kind))
                                      or bool(ANTHROPIC_FETCH.fullmatch(kind)))


def _anthropic_web(t: dict[str, Any], where: str, kind: Kind) -> Ask:
    name = kind.value
    if t.get("name") != name:
        raise _fail(f"must be {name!r} for a {t['type']} tool, got {shown(t.get('name'))}", f"{where}.name", True)
    if t.get("allowed_domains") is not None and t.get("blocked_domains") is not None:
        raise _fail("cannot give both allowed_domains and blocked_domains", where, True)
    ask = Ask(kind, t["type"], param=where, name=name, max_uses=_positive(t.get("max_uses"), f"{where}.max_uses", True),
              allowed_domains=_domains(t.get("allowed_domains"), f"{where}.allowed_domains", True),
              blocked_domains=_domains(t.get("blocked_domains"), f"{where}.blocked_domains", True))
    if kind is Kind.WEB_SEARCH:
        _location(t.get("user_location"), f"{where}.user_location", True)
    else:
        citations = _object(t.get("citations"), f"{where}.citations", True)
        if citations is not None:
            _flag(citations.get("enabled"), f"{where}.citations.enabled", True)
        _positive(t.get("max_content_tokens"), f"{where}.max_content_tokens", True)
    return ask


def _anthropic_server(s: Any, where: str) -> Ask | None:
    """One of ``mcp_servers``; None where its ``tool_configuration`` turns it off."""
    if not isinstance(s, dict):
        raise _fail("must be an object", where, True)
    if s.get("type") != "url":
        raise _fail(f"must be \"url\", got {shown(s.get('type'))}", f"{where}.type", True)
    name = s.get("name")
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise _fail(f"must be a name of 1 to 64 letters, digits, _ . : or -, got {shown(name)}", f"{where}.name", True)
    url = _url(s.get("url"), f"{where}.url", True)
    token = s.get("authorization_token")
    headers = {} if token is None else {
        "Authorization": f"Bearer {_header_value(token, f'{where}.authorization_token', True)}"}
    config = _object(s.get("tool_configuration"), f"{where}.tool_configuration", True) or {}
    if _flag(config.get("enabled"), f"{where}.tool_configuration.enabled", True) is False:
        return None
    allowed = config.get("allowed_tools")
    return Ask(Kind.MCP, "mcp", param=where, server=name, url=url, headers=headers,
               allowed_tools=None if allowed is None else _names(allowed, f"{where}.tool_configuration.allowed_tools",
                                                                 True))


def _toolset(t: dict[str, Any], where: str, servers: dict[str, Ask | None]) -> Ask | None:
    """An ``mcp_toolset`` applied to its server's ``Ask``: every tool (less those ``configs``
    disables), or, with ``default_config.enabled`` false, only those ``configs`` enables."""
    server = t.get("mcp_server_name")
    if not isinstance(server, str) or server not in servers:
        raise _fail(f"names {shown(server)}, which is not the name of one of mcp_servers",
                    f"{where}.mcp_server_name", True)
    ask = servers[server]
    if ask is not None and ask.type == ANTHROPIC_TOOLSET:
        raise _fail(f"names the MCP server {shown(server)}, which another mcp_toolset names",
                    f"{where}.mcp_server_name", True)
    default = _object(t.get("default_config"), f"{where}.default_config", True) or {}
    enabled = _flag(default.get("enabled"), f"{where}.default_config.enabled", True) is not False
    configs = _object(t.get("configs"), f"{where}.configs", True) or {}
    if len(configs) > MAX_NAMES:
        raise _fail(f"may configure at most {MAX_NAMES} tools", f"{where}.configs", True)
    on, off = [], []
    for tool, config in configs.items():
        at = f"{where}.configs.{tool}"
        if not 0 < len(tool) <= MAX_NAME:
            raise _fail(f"must be a tool's name of 1 to {MAX_NAME} characters", at, True)
        flag = _flag((_object(config, at, True, optional=False) or {}).get("enabled"), f"{at}.enabled", True)
        if flag is False:
            off.append(tool)
        elif flag is True:
            on.append(tool)
    if ask is None:  # tool_configuration turned it off
        return None
    ask.type, ask.param = ANTHROPIC_TOOLSET, where
    if enabled:
        ask.denied_tools = tuple(off)
    else:
        ask.allowed_tools = tuple(tool for tool in on if ask.allowed_tools is None or tool in ask.allowed_tools)
    return ask


def anthropic_asks(body: dict[str, Any]) -> list[Ask]:
    """The web search and fetch tools of ``tools``, and the servers of ``mcp_servers`` (as their
    ``mcp_toolset`` tools configure them, where any is given), in that order."""
    tools, raw = body.get("tools"), body.get("mcp_servers")
    tools = tools if isinstance(tools, list) else []  # its shape is anthropic_tools's to refuse
    if raw is not None and (not isinstance(raw, list) or len(raw) > MAX_SERVERS):
        raise _fail(f"must be a list of at most {MAX_SERVERS} servers", "mcp_servers", True)
    servers: dict[str, Ask | None] = {}
    for i, s in enumerate(raw or ()):
        ask = _anthropic_server(s, f"mcp_servers.{i}")
        name = s["name"]
        if name in servers:
            raise _fail(f"names the MCP server {shown(name)} twice", f"mcp_servers.{i}.name", True)
        servers[name] = ask
    asks, toolsets = [], False
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if not anthropic_runs(kind):
            continue
        assert isinstance(t, dict) and isinstance(kind, str)
        if kind == ANTHROPIC_TOOLSET:
            toolsets = True
            _toolset(t, f"tools.{i}", servers)
        else:
            asks.append(_anthropic_web(t, f"tools.{i}", Kind.WEB_SEARCH if kind.startswith("web_search")
                                       else Kind.WEB_FETCH))
    for i, (name, ask) in enumerate(servers.items()):
        if toolsets and (ask is None or ask.type != ANTHROPIC_TOOLSET) and not _off((raw or [])[i]):
            raise _fail(f"the MCP server {shown(name)} is named by no mcp_toolset in tools (each server needs "
                        "exactly one)", f"mcp_servers.{i}.name", True)
        if ask is not None:
            asks.append(ask)
    return asks


def _off(server: dict[str, Any]) -> bool:
    config = server.get("tool_configuration")
    return isinstance(config, dict) and config.get("enabled") is False


# --- Responses and chat completions ------------------------------------------------------------

def _allowed_tools(value: Any, param: str) -> tuple[str, ...] | None:
    """Responses' ``allowed_tools``: a list of names, or ``{"tool_names": [...]}``. Its
    ``read_only`` filter needs the server's annotations, which this server does not read: a
    400 rather than a looser list than asked."""
    if value is None:
        return None
    if isinstance(value, list):
        return _names(value, param, False)
    spec = _object(value, param, False, optional=False)
    assert spec is not None
    if _flag(spec.get("read_only"), f"{param}.read_only", False):
        raise _fail("is not supported by this server: name the tools in `tool_names`", f"{param}.read_only", False)
    names = spec.get("tool_names")
    return None if names is None else _names(names, f"{param}.tool_names", False)


def _approval(value: Any, param: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``require_approval`` as (the tools whose call waits, those exempt from ``("*",)``):
    ``always`` (OpenAI's default) or ``never``, or a filter object. A filter with an
    ``always`` list: its tools wait and the others run; with only a ``never`` list: every tool
    but those waits. A ``read_only`` filter is not read (this server does not see the
    servers' annotations): its tools wait."""
    if value is None or value == "always":
        return ("*",), ()
    if value == "never":
        return (), ()
    if not isinstance(value, dict):
        raise _fail(f"must be \"always\", \"never\" or a filter object, got {shown(value)}", param, False)
    lists = {}
    for key in ("always", "never"):
        part = _object(value.get(key), f"{param}.{key}", False)
        if part is None:
            continue
        _flag(part.get("read_only"), f"{param}.{key}.read_only", False)
        names = part.get("tool_names")
        lists[key] = (_names(names, f"{param}.{key}.tool_names", False) if names is not None else (),
                      part.get("read_only") is True)
    always, never = lists.get("always"), lists.get("never", ((), False))
    if always is not None and not always[1]:
        return always[0], ()
    return ("*",), never[0]


def _responses_mcp(t: dict[str, Any], where: str) -> Ask | None:
    label = t.get("server_label")
    if not isinstance(label, str) or not SERVER_NAME.fullmatch(label):
        raise _fail(f"must be a label of 1 to 64 letters, digits, _ . : or -, got {shown(label)}",
                    f"{where}.server_label", False)
    for name in ("connector_id", "tunnel_id"):
        if t.get(name) is not None:
            _string(t[name], f"{where}.{name}", False, 256)
            return None  # OpenAI's connectors and tunnels: stays dropped
    url = t.get("server_url")
    url = None if url is None else _url(url, f"{where}.server_url", False)
    _string(t.get("server_description"), f"{where}.server_description", False)
    headers = _headers(t.get("headers"), f"{where}.headers")
    token = t.get("authorization")
    if token is not None:
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {_header_value(token, f'{where}.authorization', False)}"
    approval, exempt = _approval(t.get("require_approval"), f"{where}.require_approval")
    return Ask(Kind.MCP, "mcp", param=where, server=label, url=url, headers=headers,
               allowed_tools=_allowed_tools(t.get("allowed_tools"), f"{where}.allowed_tools"),
               approval=approval, approval_exempt=exempt)


def _responses_search(t: dict[str, Any], where: str) -> Ask | None:
    if _flag(t.get("external_web_access"), f"{where}.external_web_access", False) is False:
        return None  # Codex's cached mode: no live search asked for, stays dropped
    filters = _object(t.get("filters"), f"{where}.filters", False) or {}
    _context_size(t.get("search_context_size"), f"{where}.search_context_size")
    _location(t.get("user_location"), f"{where}.user_location", False)
    return Ask(Kind.WEB_SEARCH, t["type"], param=where,
               allowed_domains=_domains(filters.get("allowed_domains"), f"{where}.filters.allowed_domains", False))


def responses_ask(t: dict[str, Any], where: str) -> Ask | None:
    """A tool of ``RESPONSES_RUNS`` (in Responses' ``tools``, or chat's) as an ``Ask``; None
    where this form of it stays dropped."""
    return _responses_mcp(t, where) if t["type"] == "mcp" else _responses_search(t, where)


def responses_asks(tools: Any) -> tuple[list[Ask], list[str]]:
    """The hosted tools of a ``tools`` list in Responses' shape that the gateway may run, and
    the types of those of them that stay dropped (each once, in order). The list's shape and
    its other tools are its parser's to check."""
    asks: list[Ask] = []
    dropped: list[str] = []
    for i, t in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(t, dict) and t.get("type") in RESPONSES_RUNS:
            ask = responses_ask(t, f"tools[{i}]")
            if ask is not None:
                asks.append(ask)
            elif t["type"] not in dropped:
                dropped.append(t["type"])
    return unique(asks), dropped


def web_search_options(body: dict[str, Any]) -> Ask | None:
    """Chat completions' ``web_search_options`` (``search_context_size``, ``user_location``)."""
    value = body.get("web_search_options")
    if value is None:
        return None
    options = _object(value, "web_search_options", False)
    assert options is not None
    _context_size(options.get("search_context_size"), "web_search_options.search_context_size")
    _location(options.get("user_location"), "web_search_options.user_location", False, nested=True)
    return Ask(Kind.WEB_SEARCH, "web_search_options", param="web_search_options")
