"""The hosted tools of one request: which of what it asks for run here (``Toolbox.open``), the
functions the model is offered for them, and the running of a call (``Toolbox.run``).

``Services`` is the app's: the configured MCP servers (``mcpservers.McpServers``), the HTTP
sessions of web search (the operator's backend, which may be on loopback) and web fetch (a URL
the model or the caller chose: the guarded session of ``server/fetch``, which reaches no private
address), and the bounds of ``server:``.

What a request asks for (``Ask``, read by its wire) becomes offers:
- web search and fetch run where ``server.web_search`` (and ``server.web_fetch``) say so;
  without a backend the tool is dropped, as before this existed, and named in ``dropped``;
- MCP runs where ``server.mcp_servers`` or ``server.mcp_allowed_urls`` is set (else it is
  dropped). A server named by its label is a configured one; one named by URL is the configured
  server of that URL, or, where the URL starts with one of ``server.mcp_allowed_urls``, a
  connection made for this request alone (``McpServers.adhoc``, through the address rules of
  ``base/addresses``). Any other URL is refused (400), as is a configured server the caller's
  key may not use (403); a stdio server never comes from a request. Its tools are listed
  (``listings``: what Responses shows as ``mcp_list_tools``), each offered as
  ``<server>_<tool>`` with the server's own input schema, less those the request leaves out.

A call runs under ``server.tool_timeout`` (or the server's own), its result bounded by
``server.max_tool_result_bytes`` here and by tokens in the pipeline, which has the model's
tokenizer. A failure is a result the model reads (``HostedResult.error``), never an exception:
``ToolError`` from a backend, a timeout, arguments that do not parse, a use past ``max_uses``.
Cancelling the task that runs a call (a client gone) cancels the call."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from ..base.errors import ApiError, InvalidRequest
from ..models.config.specs import ServerConfig
from ..server.fetch import WebSessions
from . import webfetch, websearch
from .hosted import Ask, CallOutcome, Kind, Page, SearchResult, ToolError, ToolInfo, call_record, function_name, may_use
from .mcpservers import McpServers
from .resulttext import cut_bytes, defang, defang_json, for_model

log = logging.getLogger(__name__)

# what the model is told each tool does (the gateway's functions, in every model's tool format)
_SEARCH: dict[str, Any] = {"name": "web_search",
                           "description": "Search the web. Returns the top results: title, URL and snippet.",
                           "parameters": {"type": "object", "properties": {"query": {"type": "string",
                                                                     "description": "what to search for"}},
                          "required": ["query"]}}
_FETCH: dict[str, Any] = {"name": "web_fetch", "description": "Fetch a web page by its URL and read it as text.",
          "parameters": {"type": "object", "properties": {"url": {"type": "string",
                                                                  "description": "the page's http(s) URL"}},
                         "required": ["url"]}}
MAX_ARGUMENTS = 64 * 1024  # characters of a call's arguments the gateway reads
CALLS_PER_ROUND = 8  # hosted calls of one answer, per round of server.max_tool_rounds: past them, an error result


class Services:
    """What the hosted tools need, made once for the app: the configured MCP servers and the
    HTTP sessions of web search and fetch (``server.fetch.WebSessions``: made at the app's start,
    ``close`` at its end)."""

    def __init__(self, server: ServerConfig, mcp: McpServers, web: WebSessions):
        self.server = server
        self.mcp = mcp
        self.web = web

    @property
    def web_search(self) -> bool:
        return self.server.web_search is not None

    @property
    def web_fetch(self) -> bool:
        on = self.server.web_fetch
        return self.web_search if on is None else on

    def searches_for(self, ask: Ask, key_mcp: tuple[str, ...] | None) -> bool:
        """Whether a key (its ``mcp`` setting) may use ``ask``'s backend: web search through an MCP
        server is that server's use, which the key's ``mcp`` list must allow."""
        config = self.server.web_search
        if ask.kind is not Kind.WEB_SEARCH or config is None or config.mcp is None:
            return True
        return may_use(key_mcp, config.mcp.split("/", 1)[0])

    async def search(self, query: str, ask: Ask) -> list[SearchResult]:
        """``query`` asked of ``server.web_search`` (the operator's backend: its session may
        reach loopback), within the ask's domains."""
        config = self.server.web_search
        assert config is not None
        return await websearch.search(config, query, session=self.web.operator, timeout=self.server.tool_timeout,
                                      max_results=ask.max_results, allowed_domains=ask.allowed_domains,
                                      blocked_domains=ask.blocked_domains, mcp_call=self._mcp_call)

    async def fetch(self, url: str, ask: Ask) -> Page:
        """The page at ``url`` (a model's or a caller's word: the guarded session), as text."""
        return await webfetch.fetch(url, session=self.web.guarded, max_bytes=webfetch.MAX_PAGE_BYTES,
                                    timeout=self.server.tool_timeout, allowed_domains=ask.allowed_domains,
                                    blocked_domains=ask.blocked_domains, allow_private=self.web.allow_private)

    async def _mcp_call(self, server: str, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        return await self.mcp.call(server, tool, arguments)

    async def close(self) -> None:
        await self.mcp.close()
        await self.web.close()


@dataclass
class Offer:
    """One function the model is offered for a hosted tool: ``name`` as the model sees it."""

    name: str
    kind: Kind
    ask: Ask
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    server: str | None = None  # MCP: the server's label, as the request named it
    tool: str | None = None  # MCP: the tool's own name
    target: str | None = None  # MCP: the configured server it is (None: ``connection``'s)
    connection: Any = None  # MCP: a request's own connection (a server named by an allowed URL)
    uses: int = 0

    def function(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            out["description"] = self.description
        return {"type": "function", "function": out}

    @property
    def needs_approval(self) -> bool:
        approval = self.ask.approval
        if "*" in approval:
            return self.tool not in self.ask.approval_exempt
        return self.tool in approval


@dataclass
class Listing:
    """An MCP server's tools as this request got them (or why not)."""

    server: str
    tools: list[ToolInfo]
    error: str | None = None


@dataclass
class Ran:
    """A hosted call done: what the writer tells (``hosted``'s kind, name, server; the result's
    output or error), the text the model reads (bounded by bytes and defanged; the pipeline
    cuts it by tokens), and its line in the inference event."""

    offer: Offer
    output: Any
    error: str | None
    text: str
    record: dict[str, Any]


class Toolbox:
    """One request's hosted tools (see the module)."""

    def __init__(self, services: Services | None, offers: list[Offer], dropped: list[str],
                 listings: list[Listing], stack: AsyncExitStack):
        self.services = services
        self.offers = {o.name: o for o in offers}
        self.dropped = dropped
        self.listings = listings
        self._stack = stack
        self.calls = 0  # calls run (or refused) in this answer

    def __bool__(self) -> bool:
        return bool(self.offers)

    def functions(self) -> list[dict[str, Any]]:
        return [o.function() for o in self.offers.values()]

    def owns(self, name: str) -> bool:
        return name in self.offers

    @classmethod
    async def open(cls, asks: list[Ask], services: Services | None, key_mcp: tuple[str, ...] | None) -> Toolbox:
        """The offers for ``asks`` (``key_mcp``: the caller's key's ``mcp`` setting; None: any)."""
        stack = AsyncExitStack()
        offers: list[Offer] = []
        dropped: list[str] = []
        listings: list[Listing] = []
        asked: set[str] = set()  # the MCP servers asked for: a configured one's name, another's URL
        try:
            for ask in asks:
                if ask.kind is Kind.MCP:
                    if services is None or not (services.server.mcp_servers or services.server.mcp_allowed_urls):
                        if ask.type not in dropped:  # no MCP here at all: dropped, as ever
                            dropped.append(ask.type)
                        continue
                    await _mcp_offers(ask, services, key_mcp, stack, offers, listings, asked)
                elif services is not None and (services.web_search if ask.kind is Kind.WEB_SEARCH
                                               else services.web_fetch) and services.searches_for(ask, key_mcp):
                    base = _SEARCH if ask.kind is Kind.WEB_SEARCH else _FETCH
                    name = base["name"]
                    if name not in {o.name for o in offers}:
                        offers.append(Offer(name, ask.kind, ask, base["description"], base["parameters"]))
                elif ask.type not in dropped:
                    dropped.append(ask.type)
        except BaseException:
            await stack.aclose()
            raise
        return cls(services, offers, dropped, listings, stack)

    async def run(self, name: str, arguments: str) -> Ran:
        """The call of ``name`` with ``arguments`` (JSON text) run; every failure is its result."""
        offer = self.offers[name]
        services = self.services
        assert services is not None
        started, wall = time.monotonic(), time.time()
        output: Any = None
        error: str | None = None
        outcome = "ok"
        size = 0
        try:
            self.calls += 1
            most = CALLS_PER_ROUND * services.server.max_tool_rounds
            if self.calls > most:
                raise ToolError(f"this answer has made the {most} calls of the server's tools it may make",
                                "max_uses_exceeded")
            args = _arguments(arguments)
            limit = offer.ask.max_uses
            if limit is not None and offer.uses >= limit:
                raise ToolError(f"this tool may be used at most {limit} times in one answer", "max_uses_exceeded")
            offer.uses += 1
            output = await asyncio.wait_for(self._call(offer, args, services), services.server.tool_timeout + 1)
            if isinstance(output, CallOutcome):
                size = output.bytes
                if output.is_error:
                    outcome = "error"
            elif isinstance(output, Page):  # the caller reads no more of it than the model does
                size = len(output.text.encode("utf-8", "replace"))
                kept, _ = cut_bytes(output.text, services.server.max_tool_result_bytes)
                output = dataclasses.replace(output, text=kept)
        except ToolError as err:
            error, outcome = err.reason, err.outcome
        except (TimeoutError, asyncio.TimeoutError):
            error, outcome = f"the tool took longer than {services.server.tool_timeout:g} s", "timeout"
        text, cut = cut_bytes(for_model(output, error), services.server.max_tool_result_bytes)
        record = call_record(offer.tool or offer.name, offer.target or offer.server, offer.kind, started, wall,
                             size or len(text.encode()), error, outcome, configured=offer.target is not None, cut=cut)
        return Ran(offer, output, error, defang(text), record)

    async def _call(self, offer: Offer, args: dict[str, Any], services: Services) -> Any:
        if offer.kind is Kind.WEB_SEARCH:
            query = args.get("query")
            if not isinstance(query, str) or not query.strip():
                raise ToolError("web_search needs a non-empty string `query`", "invalid_tool_input")
            return await services.search(query.strip(), offer.ask)
        if offer.kind is Kind.WEB_FETCH:
            url = args.get("url")
            if not isinstance(url, str) or not url.strip():
                raise ToolError("web_fetch needs a string `url`", "invalid_tool_input")
            return await services.fetch(url.strip(), offer.ask)
        assert offer.tool is not None and offer.server is not None
        if offer.connection is not None:
            return await offer.connection.call(offer.tool, args)
        assert offer.target is not None
        return await services.mcp.call(offer.target, offer.tool, args)

    async def aclose(self) -> None:
        await self._stack.aclose()


def _arguments(text: str) -> dict[str, Any]:
    if len(text) > MAX_ARGUMENTS:
        raise ToolError(f"the call's arguments are longer than {MAX_ARGUMENTS} characters", "invalid_tool_input")
    try:
        args = json.loads(text or "{}")
    except ValueError:
        raise ToolError("the call's arguments are not JSON", "invalid_tool_input") from None
    if not isinstance(args, dict):
        raise ToolError("the call's arguments must be a JSON object", "invalid_tool_input")
    return args


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/").lower() == b.rstrip("/").lower()


def _origin(url: str) -> tuple[str, str, int, str] | None:
    """``url``'s (scheme, host, port, path), or None where it is not a plain http(s) URL: one
    with userinfo (``https://good.example@evil``), a dot-segment in its path (spelled or
    percent-encoded), or a port out of range."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    segments = unquote(parts.path).split("/")
    if "." in segments or ".." in segments or "\\" in parts.path:
        return None
    host = parts.hostname.rstrip(".").lower()
    return scheme, host, port or (443 if scheme == "https" else 80), parts.path.rstrip("/")


def shown_name(name: str | None, url: str | None) -> str:
    return repr(name) if name is not None else repr((url or "")[:100])


def url_allowed(url: str, prefixes: tuple[str, ...]) -> bool:
    """Whether ``url`` is one ``server.mcp_allowed_urls`` allows: the same scheme, host and port
    as one of ``prefixes``, and a path at or under its path (by whole segments). Never a string's
    prefix: ``https://good.example`` does not allow ``https://good.example.evil`` nor
    ``https://good.example@evil``, nor ``https://good.example/mcp`` ``https://good.example/mcpx``."""
    got = _origin(url)
    if got is None:
        return False
    for prefix in prefixes:
        want = _origin(prefix)
        if want is not None and got[:3] == want[:3] and (got[3] == want[3] or got[3].startswith(want[3] + "/")):
            return True
    return False


async def _mcp_offers(ask: Ask, services: Services, key_mcp: tuple[str, ...] | None, stack: AsyncExitStack,
                      offers: list[Offer], listings: list[Listing], asked: set[str]) -> None:
    configured = services.server.mcp_servers
    label = ask.server or ""
    name: str | None = None
    connection: Any = None
    if ask.url is None:
        if label not in configured:
            raise InvalidRequest(f"the MCP server {label!r} is not one this server has (server.mcp_servers)",
                                 ask.param)
        name = label
    else:
        name = next((n for n, c in configured.items() if c.url is not None and _same_url(c.url, ask.url)), None)
        if name is None:
            if not url_allowed(ask.url, services.server.mcp_allowed_urls):
                raise InvalidRequest("the MCP server's URL is neither a configured server's nor on this server's "
                                     "server.mcp_allowed_urls", ask.param)
            if key_mcp is not None:  # a key kept to some servers uses those, not one a request names
                raise ApiError("this API key may use only the MCP servers its `mcp` setting names, not one a "
                               "request names by URL", status=403, param=ask.param, code="permission_error")
    # one server asked for under two labels: its tools offered twice over, each round's prompt the longer
    target = name if name is not None else f"url {_origin(ask.url or '')}"
    if target in asked:
        raise InvalidRequest(f"names the MCP server {shown_name(name, ask.url)} twice (under another label)", ask.param)
    asked.add(target)
    if name is None:
        try:
            connection = await stack.enter_async_context(services.mcp.adhoc(ask.url or "", ask.headers))
        except ToolError as err:
            listings.append(Listing(label, [], err.reason))
            return
    if name is not None and not may_use(key_mcp, name):
        raise ApiError(f"this API key may not use the MCP server {name!r}", status=403, param=ask.param,
                       code="permission_error")
    try:
        tools = await (connection.tools() if connection is not None else services.mcp.tools(name or label))
        label = label or (name or "")
    except ToolError as err:
        listings.append(Listing(label, [], err.reason))
        return
    if ask.allowed_tools is not None:
        tools = [t for t in tools if t.name in ask.allowed_tools]
    tools = [t for t in tools if t.name not in ask.denied_tools]
    listings.append(Listing(label, tools))
    taken = {o.name for o in offers}
    for tool in tools:
        fname = function_name(label, tool.name)
        if fname in taken:
            continue
        taken.add(fname)
        # what the server says of a tool reaches the prompt as a result's text does: defanged
        offers.append(Offer(fname, Kind.MCP, ask, defang(tool.description), defang_json(tool.input_schema),
                            server=label, tool=tool.name, target=name, connection=connection))
