"""The ``web_fetch`` tool: one page, read through the gateway's guarded fetcher and given to the
model as text (``fetch``), and the domain rules a web search's and a fetch's URLs are held to
(``domain_allowed``).

A URL a model or a caller names is untrusted, and so is what it answers:

- the fetch is ``server/fetch.fetch_guarded``'s: http(s) only, no private or loopback address
  (unless ``allow_private``), at most ``MAX_REDIRECTS`` redirects, each hop checked, ``max_bytes``
  and ``timeout`` for the whole of it; each hop's URL also against the domain rules;
- HTML becomes Markdown by ``markdownify`` (BeautifulSoup's ``html.parser`` beneath it), with
  ``script``, ``style``, ``noscript``, ``iframe``, ``svg``, ``template`` and ``head`` left out and
  the ``<title>`` kept as the page's title; the conversion runs in a thread (it is CPU work on
  up to ``max_bytes``). A page nested deeper than markdownify's recursion can walk is read as
  BeautifulSoup's plain text instead (iterative), never a ``RecursionError``;
- text (``text/*``), JSON and XML pass through as text; anything else (pictures, PDF, binary)
  is refused, naming its type; a body decodes by the charset the server named (else a
  ``<meta charset>``, else UTF-8), errors replaced;
- the text is cut to ``max_bytes`` characters, the title to ``MAX_TITLE_CHARS`` and the links
  to ``MAX_LINKS``.

Every failure is a ``ToolError`` whose reason the model reads."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timezone
from urllib.parse import urljoin, urlsplit

import aiohttp
from bs4 import BeautifulSoup
from markdownify import MarkdownConverter
from yarl import URL

from ..server.fetch import fetch_guarded
from .hosted import Page, ToolError

MAX_URL_CHARS = 4096
MAX_PAGE_BYTES = 5 * 2**20  # a page's bytes where its caller names no other bound (Ollama's web_fetch)
MAX_TITLE_CHARS = 300
MAX_LINKS = 200
MAX_LINK_CHARS = 2048
_DROPPED = ["script", "style", "noscript", "iframe", "svg", "template", "head", "title", "object", "embed"]
_HTML = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_APPLICATIONS = frozenset({"application/json", "application/xml", "application/ld+json",
                                "application/x-ndjson", "application/javascript", "application/yaml",
                                "application/x-yaml", "application/toml"})
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]{1,40})""", re.IGNORECASE)
_BLANKS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_ACCEPT = "text/html, application/xhtml+xml, text/plain;q=0.9, text/markdown;q=0.9, application/json;q=0.8, */*;q=0.1"
_PRIVATE_HINT = "(web_fetch never reaches private addresses)"


def _rule(entry: str) -> tuple[str, str]:
    """A domain rule as (host, path prefix): a scheme and a leading ``*.`` dropped, lower case."""
    entry = entry.strip().lower()
    if "://" in entry:
        entry = entry.split("://", 1)[1]
    host, _, path = entry.partition("/")
    host = host.removeprefix("*.").rstrip(".")
    return host, ("/" + path).rstrip("/") if path else ""


def _matches(host: str, path: str, entry: str) -> bool:
    rule_host, rule_path = _rule(entry)
    if not rule_host or not (host == rule_host or host.endswith("." + rule_host)):
        return False
    return not rule_path or path == rule_path or path.startswith(rule_path + "/")


def domain_allowed(url: str, allowed: tuple[str, ...] = (), blocked: tuple[str, ...] = ()) -> bool:
    """Whether ``url`` passes a tool's domain rules (Anthropic's ``allowed_domains`` and
    ``blocked_domains``): a rule ``example.com`` matches that host and its subdomains, and
    ``example.com/docs`` only under that path. A blocked match refuses; with ``allowed`` set, a
    URL must match one of them (a URL with no host then never passes). No rules: all pass."""
    if not allowed and not blocked:
        return True
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".").lower()
    except ValueError:
        return False
    path = parts.path or "/"
    if host and any(_matches(host, path, b) for b in blocked):
        return False
    return not allowed or (bool(host) and any(_matches(host, path, a) for a in allowed))


def _short(url: str, limit: int = 100) -> str:
    return url if len(url) <= limit else url[: limit - 3] + "..."


async def fetch(url: str, *, session: aiohttp.ClientSession, max_bytes: int, timeout: float,
                allowed_domains: tuple[str, ...] = (), blocked_domains: tuple[str, ...] = (),
                allow_private: bool = False) -> Page:
    """The page at ``url`` as text (see the module's docstring), or a ``ToolError``.
    ``session`` must be a guarded one made with the same ``allow_private``
    (``server.fetch.WebSessions.guarded``, or ``media_session``)."""
    if not isinstance(url, str) or not url.strip():
        raise ToolError("web_fetch needs a URL", "refused")
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ToolError(f"the URL is longer than {MAX_URL_CHARS} characters", "refused")

    def refuse(reason: str, kind: str) -> ToolError:
        return ToolError(f"could not fetch {_short(url)}: {reason}", kind)

    def check_hop(target: URL) -> None:
        if not domain_allowed(str(target), allowed_domains, blocked_domains):
            where = "the page" if str(target) == url else f"a redirect ({_short(str(target))})"
            raise refuse(f"{where} is outside the domains this request allows", "refused")

    got = await fetch_guarded(url, refuse, max_bytes=max_bytes, timeout=timeout, allow_private=allow_private,
                              session=session, check_hop=check_hop, private_hint=_PRIVATE_HINT,
                              size_setting="the fetch's limit", accept=_ACCEPT)
    kind = _kind(got.content_type, got.body)
    if kind is None:
        raise refuse(f"the page is {got.content_type or 'of no stated type'}, not text or HTML: "
                     "web_fetch reads HTML, text and JSON", "refused")
    retrieved = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    if kind == "html":
        title, text, links = await asyncio.to_thread(html_to_text, got.body, got.charset, got.url)
        content_type = "text/html"
    else:
        title, text, links = "", _decode(got.body, got.charset), ()
        content_type = got.content_type or "text/plain"
    return Page(url=got.url, title=title, text=text[:max_bytes], content_type=content_type,
                retrieved_at=retrieved, links=links)


def _kind(content_type: str, body: bytes) -> str | None:
    """``html``, ``text``, or None (not text) for a body of ``content_type``; a body whose type
    is not said is looked at."""
    if content_type in _HTML:
        return "html"
    if content_type.startswith("text/") or content_type in _TEXT_APPLICATIONS \
            or content_type.endswith(("+json", "+xml")):
        return "text"
    if content_type in ("", "application/octet-stream"):
        head = body[:1024]
        if b"\x00" in head:
            return None
        lowered = head.lstrip().lower()
        if lowered.startswith((b"<!doctype html", b"<html")):
            return "html"
        try:
            body[:65536].decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start < len(body[:65536]) - 4:  # not just a character cut at the edge
                return None
        return "text"
    return None


def _decode(body: bytes, charset: str | None) -> str:
    """The body as text by ``charset`` (an unknown one: UTF-8), errors replaced."""
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


class _Converter(MarkdownConverter):
    """markdownify's converter, Markdown headings in ATX form, pictures by their alt text only
    (their URLs are noise to a model)."""

    def convert_img(self, el, text, parent_tags):
        alt = el.attrs.get("alt") or ""
        return alt if isinstance(alt, str) else ""


def _converter() -> _Converter:
    """One converter per page: markdownify's keeps a cache as it converts, and pages convert in
    threads."""
    return _Converter(heading_style="atx", bullets="-", escape_asterisks=False, escape_underscores=False)


def html_to_text(body: bytes, charset: str | None, base: str) -> tuple[str, str, tuple[str, ...]]:
    """An HTML page as (title, Markdown text, its links as absolute http(s) URLs). CPU work: run
    it in a thread. A page nested too deep for markdownify is read as plain text instead."""
    if charset is None:
        declared = _META_CHARSET.search(body[:4096])
        charset = declared.group(1).decode("ascii") if declared else None
    soup = BeautifulSoup(_decode(body, charset), "html.parser")
    title = ""
    if soup.title is not None:
        title = " ".join(soup.title.get_text(" ").split())[:MAX_TITLE_CHARS]
    links = _links(soup, base)
    for tag in soup.find_all(_DROPPED):
        tag.decompose()
    try:
        text = _converter().convert_soup(soup)
    except RecursionError:  # hostile nesting: BeautifulSoup's text, made without recursion
        text = soup.get_text("\n")
    text = _BLANKS.sub("\n\n", text).strip()
    return title, text, links


def _links(soup: BeautifulSoup, base: str) -> tuple[str, ...]:
    """The page's ``<a href>`` links, absolute, http(s) only, each once, at most ``MAX_LINKS``."""
    out: dict[str, None] = {}
    for a in soup.find_all("a", href=True):
        href = a.get("href")
        if not isinstance(href, str):
            continue
        try:
            absolute = urljoin(base, href.strip())
        except ValueError:
            continue
        if absolute.startswith(("http://", "https://")) and len(absolute) <= MAX_LINK_CHARS:
            out.setdefault(absolute.split("#", 1)[0], None)
            if len(out) >= MAX_LINKS:
                break
    return tuple(out)
