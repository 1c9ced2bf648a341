"""The ``web_search`` tool's backends (``search``): a SearXNG server's JSON API, or a tool of a
configured MCP server (``server.web_search``).

- **SearXNG**: ``GET {searxng}/search?q=...&format=json`` (the server must list ``json`` in its
  ``search.formats``; a 403 says so). Its answer is an object whose ``results`` are
  ``{url, title, content, publishedDate, engine, score, ...}``; the first three are kept, and
  ``publishedDate`` as the result's ``page_age``. The URL is the operator's (a SearXNG on
  loopback is usual), so its session is the operator's (``server.fetch.WebSessions.operator``).
- **MCP** (``SERVER/TOOL``): the tool is called with ``{query}``; its text is read as a JSON list
  of ``{title, url, content}`` (or ``snippet``, ``description``; or ``{results: [...]}``), and
  any other text is one result whose content is that text.

What a backend answers is untrusted: ``MAX_RESPONSE_BYTES`` read at most, parsed by the one
bounded JSON parser (``base/strictjson``), ``timeout`` for the whole search, at most
``max_results`` results (the request's, else ``config.max_results``, never past
``MAX_RESULTS``), each field cut (``MAX_TITLE_CHARS``, ``MAX_URL_CHARS``,
``MAX_CONTENT_CHARS``), only http(s) URLs, each once, and the request's domain rules
(``webfetch.domain_allowed``). The query is at most ``MAX_QUERY_CHARS``. Every failure is a
``ToolError`` whose reason the model reads ("the search backend answered HTTP 502")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from yarl import URL

from ..base import strictjson
from ..models.config.specs import WebSearchConfig
from .hosted import CallOutcome, SearchResult, ToolError
from .webfetch import domain_allowed

McpCall = Callable[[str, str, dict], Awaitable[CallOutcome]]  # (server, tool, arguments) -> its outcome

MAX_QUERY_CHARS = 1000
MAX_RESULTS = 50
MAX_RESPONSE_BYTES = 2 * 2**20
MAX_TITLE_CHARS = 300
MAX_URL_CHARS = 2048
MAX_CONTENT_CHARS = 2000
MAX_TEXT_CHARS = 16000  # an MCP tool's plain-text answer, as one result
MAX_AGE_CHARS = 64


def _query(query: object) -> str:
    if not isinstance(query, str) or not query.strip():
        raise ToolError("web_search needs a non-empty query", "refused")
    query = " ".join(query.split())
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"the query is longer than {MAX_QUERY_CHARS} characters", "refused")
    return query


async def search(config: WebSearchConfig, query: str, *, session: aiohttp.ClientSession, timeout: float,
                 max_results: int | None = None, allowed_domains: tuple[str, ...] = (),
                 blocked_domains: tuple[str, ...] = (), mcp_call: McpCall | None = None) -> list[SearchResult]:
    """The results of ``query`` from the configured backend (see the module's docstring), or a
    ``ToolError``. ``session`` reaches the SearXNG server (the operator's: private addresses
    allowed); ``mcp_call`` calls a configured MCP server's tool (``McpServers.call``), needed
    for an ``mcp`` backend."""
    query = _query(query)
    limit = max(1, min(max_results if max_results is not None else config.max_results, MAX_RESULTS))
    try:
        if config.searxng is not None:
            raw = await asyncio.wait_for(_searxng(config.searxng, query, session, timeout), timeout)
        elif config.mcp is not None:
            raw = await asyncio.wait_for(_mcp(config.mcp, query, mcp_call), timeout)
        else:
            raise ToolError("no web search backend is configured (server.web_search)", "error")
    except asyncio.TimeoutError:
        raise ToolError(f"the search backend did not answer within {timeout:g} s", "timeout") from None
    return _kept(raw, query, limit, allowed_domains, blocked_domains)


def _endpoint(base: str) -> URL:
    url = URL(base)
    return url if url.path.rstrip("/").endswith("/search") else url.joinpath("search")


async def _searxng(base: str, query: str, session: aiohttp.ClientSession, timeout: float) -> list[dict[str, Any]]:
    url = _endpoint(base).with_query({"q": query, "format": "json", "pageno": "1"})
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False,
                               headers={"Accept": "application/json"}) as resp:
            if resp.status == 403:
                raise ToolError("the search backend refused the JSON format (HTTP 403): its settings must "
                                "list json in search.formats", "error")
            if resp.status == 429:
                raise ToolError("the search backend is rate limiting this gateway (HTTP 429)", "error")
            if resp.status != 200:
                raise ToolError(f"the search backend answered HTTP {resp.status}", "error")
            if resp.content_length is not None and resp.content_length > MAX_RESPONSE_BYTES:
                raise ToolError(f"the search backend's answer is larger than {MAX_RESPONSE_BYTES} bytes", "too_large")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise ToolError(f"the search backend's answer is larger than {MAX_RESPONSE_BYTES} bytes",
                                    "too_large")
    except asyncio.TimeoutError:
        raise
    except aiohttp.ClientConnectorError:
        raise ToolError("the search backend could not be reached", "error") from None
    except (aiohttp.ClientError, OSError):
        raise ToolError("the search backend's connection failed before its answer was read", "error") from None
    try:
        answer = await asyncio.to_thread(strictjson.loads, bytes(body)) if len(body) > 256 * 1024 \
            else strictjson.loads(bytes(body))
    except ValueError:
        raise ToolError("the search backend's answer is not valid JSON", "error") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
        raise ToolError("the search backend's answer has no results list (is it SearXNG's JSON API?)", "error")
    return [r for r in answer["results"] if isinstance(r, dict)]


async def _mcp(target: str, query: str, mcp_call: McpCall | None) -> list[dict[str, Any]]:
    server, _, tool = target.partition("/")
    if mcp_call is None or not server or not tool:
        raise ToolError(f"the search tool {target} cannot be called", "error")
    try:
        outcome = await mcp_call(server, tool, {"query": query})
    except ToolError:
        raise
    except asyncio.TimeoutError:
        raise
    except Exception as e:  # the MCP client's own failures: the model reads a reason, never a traceback
        raise ToolError(f"the search tool {target} failed ({type(e).__name__})", "error") from None
    text = outcome.text[:MAX_RESPONSE_BYTES]
    if outcome.is_error:
        raise ToolError(f"the search tool {target} failed: {text[:500]}", "error")
    try:
        answer = strictjson.loads(text)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("results"), list):
        answer = answer["results"]
    if isinstance(answer, list) and answer and all(isinstance(r, dict) for r in answer):
        return answer
    if isinstance(answer, list) and not answer:
        return []
    return [{"title": query, "url": "", "content": text[:MAX_TEXT_CHARS], "_text": True}]


def _field(item: dict[str, Any], *names: str, limit: int) -> str:
    for name in names:
        value = item.get(name)
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())[:limit]
    return ""


def _kept(raw: list[dict[str, Any]], query: str, limit: int, allowed: tuple[str, ...],
          blocked: tuple[str, ...]) -> list[SearchResult]:
    """The results worth giving: http(s) URLs (or one plain-text answer), each once, within the
    domain rules, at most ``limit``, each field cut."""
    out: list[SearchResult] = []
    seen: set[str] = set()
    for item in raw:
        if item.get("_text"):
            if not allowed:  # a text answer has no URL to hold to allowed domains
                content = item["content"].strip()
                out.append(SearchResult(title=query[:MAX_TITLE_CHARS], url="", content=content))
        else:
            url = item.get("url") if isinstance(item.get("url"), str) else item.get("link")
            if not isinstance(url, str):
                continue
            url = url.strip()
            if not url.lower().startswith(("http://", "https://")) or len(url) > MAX_URL_CHARS or url in seen:
                continue
            if not domain_allowed(url, allowed, blocked):
                continue
            seen.add(url)
            age = _field(item, "publishedDate", "page_age", "published", "date", limit=MAX_AGE_CHARS)
            out.append(SearchResult(title=_field(item, "title", "name", limit=MAX_TITLE_CHARS) or url[:MAX_TITLE_CHARS],
                                    url=url,
                                    content=_field(item, "content", "snippet", "description", limit=MAX_CONTENT_CHARS),
                                    page_age=age or None))
        if len(out) >= limit:
            break
    return out
