"""Web search and web fetch, the tools the gateway runs itself (``tools/websearch``,
``tools/webfetch``), against real servers on loopback: a SearXNG stand-in that answers as
SearXNG's JSON API does (and fails as a server can: HTTP 500, a dropped connection, corrupt JSON,
a huge body, a slow answer), pages (HTML with scripts and styles, redirects, a 10 MB page,
binary, hostile nesting), an MCP search tool's answers, and Ollama's experimental routes driven
by the official ``ollama`` client against the real application.

Loopback is a private address: a fetch of these pages needs ``allow_private``, and without it is
refused."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import httpx
import ollama
import pytest
from aiohttp import web

from gateway.api.appkeys import TOOLS
from gateway.app import create_app
from gateway.models.config import load_config
from gateway.models.config.specs import WebSearchConfig
from gateway.server.fetch import media_session
from gateway.tools import webfetch, websearch
from gateway.tools.hosted import CallOutcome, ToolError

USER, ADMIN = "user-key", "admin-key"


def searx_result(url: str, title: str, content: str, date: str | None = None) -> dict:
    """One result as SearXNG's JSON API gives it (its ``results[]`` entries)."""
    return {"url": url, "title": title, "content": content, "engine": "duckduckgo",
            "parsed_url": list(urlsplit(url)) + [""], "template": "default.html",
            "engines": ["duckduckgo", "brave"], "positions": [1, 2], "publishedDate": date, "thumbnail": "",
            "score": 2.5, "category": "general", "priority": ""}


RESULTS = [
    searx_result("https://docs.python.org/3/library/asyncio.html", "asyncio \u2014 Asynchronous I/O",
                 "asyncio is a library to write concurrent code", "2024-05-01T00:00:00"),
    searx_result("https://realpython.com/async-io-python/", "Async IO in Python", "A complete walkthrough"),
    searx_result("https://docs.python.org/3/library/asyncio.html", "dup", "the same URL again"),
    searx_result("javascript:alert(1)", "bad", "not http"),
    searx_result("https://spam.example/x", "Spam", "x" * 50000),
    searx_result("https://blog.spam.example/y", "Spam too", "y"),
    {"title": "no url at all"},
    "not an object",
]


def envelope(query: str, results: list) -> dict:
    return {"query": query, "number_of_results": 0, "results": results, "answers": [], "corrections": [],
            "infoboxes": [], "suggestions": [], "unresponsive_engines": []}


@pytest.fixture
async def searxng(aiohttp_server):
    seen: list[dict] = []

    async def ok(request):
        seen.append(dict(request.query))
        if request.query.get("format") != "json":
            return web.Response(status=403, text="Forbidden")
        return web.json_response(envelope(request.query["q"], RESULTS))

    async def fail(request):
        return web.Response(status=500, text="Internal Server Error")

    async def forbid(request):  # a SearXNG whose settings do not list json in search.formats
        return web.Response(status=403, text="Forbidden")

    async def drop(request):
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(1)
        return web.Response(text="never")

    async def corrupt(request):
        return web.Response(text='{"results": [{"url": "https://a.b/", ', content_type="application/json")

    async def wrong_shape(request):
        return web.json_response({"query": "x", "items": []})

    async def huge(request):  # no Content-Length: chunks until the reader stops
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(b'{"results": [')
        try:
            for _ in range(100):
                await resp.write(b'{"url": "https://a.b/", "title": "' + b"t" * 65536 + b'"},')
        except ConnectionError:
            pass
        return resp

    async def slow(request):
        await asyncio.sleep(5)
        return web.json_response(envelope("x", RESULTS))

    app = web.Application()
    for prefix, handler in (("", ok), ("/fail", fail), ("/forbid", forbid), ("/drop", drop), ("/corrupt", corrupt),
                            ("/shape", wrong_shape), ("/huge", huge), ("/slow", slow)):
        app.router.add_get(f"{prefix}/search", handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    server.seen = seen
    return server


@pytest.fixture
async def operator():
    async with media_session(allow_private=True) as session:  # the operator's: SearXNG on loopback
        yield session


def searx(server, prefix: str = "") -> WebSearchConfig:
    return WebSearchConfig(searxng=str(server.make_url(prefix or "/")))


async def test_searxng_results_are_kept_deduplicated_and_cut(searxng, operator):
    found = await websearch.search(searx(searxng), "  python   asyncio ", session=operator, timeout=5, max_results=10)
    assert searxng.seen == [{"q": "python asyncio", "format": "json", "pageno": "1"}]
    assert [r.url for r in found] == ["https://docs.python.org/3/library/asyncio.html",
                                      "https://realpython.com/async-io-python/", "https://spam.example/x",
                                      "https://blog.spam.example/y"]
    assert found[0].title == "asyncio \u2014 Asynchronous I/O" and found[0].page_age == "2024-05-01T00:00:00"
    assert found[1].page_age is None
    assert len(found[2].content) == websearch.MAX_CONTENT_CHARS


async def test_the_result_count_follows_the_request_then_the_configuration(searxng, operator):
    assert len(await websearch.search(searx(searxng), "q", session=operator, timeout=5, max_results=1)) == 1
    config = WebSearchConfig(searxng=str(searxng.make_url("/")), max_results=2)
    assert len(await websearch.search(config, "q", session=operator, timeout=5)) == 2


async def test_domain_rules_match_a_domain_and_its_subdomains(searxng, operator):
    blocked = await websearch.search(searx(searxng), "q", session=operator, timeout=5,
                                     blocked_domains=("spam.example",))
    assert all("spam.example" not in r.url for r in blocked) and len(blocked) == 2
    allowed = await websearch.search(searx(searxng), "q", session=operator, timeout=5,
                                     allowed_domains=("python.org",))
    assert [r.url for r in allowed] == ["https://docs.python.org/3/library/asyncio.html"]
    assert webfetch.domain_allowed("https://example.com/docs/a", ("example.com/docs",))
    assert not webfetch.domain_allowed("https://example.com/docsx", ("example.com/docs",))
    assert not webfetch.domain_allowed("https://notexample.com/", ("example.com",))
    assert webfetch.domain_allowed("https://a.b.example.com/", ("*.example.com",))


@pytest.mark.parametrize(("prefix", "words", "outcome"), [
    ("/fail", "answered HTTP 500", "error"),
    ("/forbid", "search.formats", "error"),
    ("/drop", "connection failed", "error"),
    ("/corrupt", "not valid JSON", "error"),
    ("/shape", "no results list", "error"),
    ("/huge", "larger than", "too_large"),
])
async def test_a_failing_backend_is_a_reason_the_model_reads(searxng, operator, prefix, words, outcome):
    with pytest.raises(ToolError) as caught:
        await websearch.search(searx(searxng, prefix), "q", session=operator, timeout=5)
    assert words in caught.value.reason and caught.value.outcome == outcome


async def test_a_slow_backend_is_cut_at_the_timeout(searxng, operator):
    start = time.monotonic()
    with pytest.raises(ToolError) as caught:
        await websearch.search(searx(searxng, "/slow"), "q", session=operator, timeout=0.3)
    assert caught.value.outcome == "timeout" and "0.3 s" in caught.value.reason
    assert time.monotonic() - start < 3


async def test_an_unreachable_backend_is_a_tool_error(operator, unused_tcp_port):
    config = WebSearchConfig(searxng=f"http://127.0.0.1:{unused_tcp_port}")
    with pytest.raises(ToolError, match="could not be reached"):
        await websearch.search(config, "q", session=operator, timeout=5)


@pytest.mark.parametrize("query", ["", "   ", None, "x" * (websearch.MAX_QUERY_CHARS + 1)])
async def test_a_bad_query_is_refused_before_any_request(searxng, operator, query):
    with pytest.raises(ToolError) as caught:
        await websearch.search(searx(searxng), query, session=operator, timeout=5)
    assert caught.value.outcome == "refused" and searxng.seen == []


def mcp_answering(text: str, is_error: bool = False, calls: list | None = None):
    async def call(server: str, tool: str, arguments: dict) -> CallOutcome:
        if calls is not None:
            calls.append((server, tool, arguments))
        return CallOutcome(text=text, is_error=is_error, bytes=len(text))
    return call


MCP = WebSearchConfig(mcp="search/find")


async def test_an_mcp_tool_answering_a_json_list(operator):
    calls: list = []
    text = json.dumps([{"title": "A", "url": "https://a.example/", "content": "first"},
                       {"title": "B", "url": "https://b.example/", "snippet": "second"}, {"title": "no url"}])
    found = await websearch.search(MCP, "q", session=operator, timeout=5, mcp_call=mcp_answering(text, calls=calls))
    assert calls == [("search", "find", {"query": "q"})]
    assert [(r.title, r.url, r.content) for r in found] == [("A", "https://a.example/", "first"),
                                                            ("B", "https://b.example/", "second")]
    wrapped = json.dumps({"results": [{"title": "C", "url": "https://c.example/", "content": "third"}]})
    assert [r.url for r in await websearch.search(MCP, "q", session=operator, timeout=5,
                                                  mcp_call=mcp_answering(wrapped))] == ["https://c.example/"]


async def test_an_mcp_tool_answering_plain_text_is_one_result(operator):
    found = await websearch.search(MCP, "the query", session=operator, timeout=5,
                                   mcp_call=mcp_answering("It is sunny in Paris."))
    assert [(r.title, r.url, r.content) for r in found] == [("the query", "", "It is sunny in Paris.")]
    # with allowed domains, a text with no URL cannot be held to them: left out
    assert await websearch.search(MCP, "q", session=operator, timeout=5, allowed_domains=("a.example",),
                                  mcp_call=mcp_answering("text")) == []


async def test_an_mcp_tool_that_fails_hangs_or_raises(operator):
    with pytest.raises(ToolError, match="search/find failed: quota exceeded"):
        await websearch.search(MCP, "q", session=operator, timeout=5, mcp_call=mcp_answering("quota exceeded", True))

    async def hangs(server, tool, arguments):
        await asyncio.sleep(10)

    with pytest.raises(ToolError) as caught:
        await websearch.search(MCP, "q", session=operator, timeout=0.2, mcp_call=hangs)
    assert caught.value.outcome == "timeout"

    async def raises(server, tool, arguments):
        raise RuntimeError("secret internals")

    with pytest.raises(ToolError) as caught:
        await websearch.search(MCP, "q", session=operator, timeout=5, mcp_call=raises)
    assert "secret internals" not in caught.value.reason and "RuntimeError" in caught.value.reason
    with pytest.raises(ToolError, match="cannot be called"):
        await websearch.search(MCP, "q", session=operator, timeout=5)


PAGE = """<!doctype html><html><head><title>  The   Page </title>
<style>body { color: red }</style><script>var secret = "in a script";</script></head>
<body><h1>Heading</h1><p>Some <b>bold</b> text and snake_case, <a href="/other#frag">a link</a>.</p>
<noscript>turn on JavaScript</noscript><iframe src="/x">framed</iframe><svg><text>drawn</text></svg>
<ul><li>one</li><li>two</li></ul><img src="data:image/png;base64,AAAA" alt="a picture">
<a href="https://elsewhere.example/page">elsewhere</a><a href="mailto:a@b.c">mail</a>
<script>document.write("late")</script></body></html>"""
BIG = 10 * 2**20
DEPTH = 100_000


@pytest.fixture
async def pages(aiohttp_server):
    async def page(request):
        return web.Response(text=PAGE, content_type="text/html")

    async def latin(request):
        return web.Response(body="caf\xe9 cr\xe8me".encode("latin-1"), headers={"Content-Type": "text/plain; charset=iso-8859-1"})

    async def meta_charset(request):
        body = '<html><head><meta charset="windows-1252"><title>T</title></head><body><p>na\xefve</p></body></html>'
        return web.Response(body=body.encode("cp1252"), headers={"Content-Type": "text/html"})

    async def data(request):
        return web.json_response({"a": [1, 2, 3]})

    async def markdown(request):
        return web.Response(text="# Title\n\nbody", content_type="text/markdown")

    async def binary(request):
        return web.Response(body=bytes(range(256)) * 10, content_type="application/octet-stream")

    async def image(request):
        return web.Response(body=b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, content_type="image/png")

    async def pdf(request):
        return web.Response(body=b"%PDF-1.7\n...", content_type="application/pdf")

    async def big(request):  # streamed, no Content-Length
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        await resp.prepare(request)
        try:
            for _ in range(BIG // 65536):
                await resp.write(b"<p>" + b"w" * 65529 + b"</p>")
        except ConnectionError:
            pass
        return resp

    async def deep(request):
        return web.Response(text="<html><body>" + "<div>" * DEPTH + "deep inside" + "</div>" * DEPTH + "</body></html>",
                            content_type="text/html")

    async def redirect(request):
        raise web.HTTPFound("/page")

    async def elsewhere(request):  # to another host name: the domain rules are checked again
        raise web.HTTPFound(f"http://localhost:{request.url.port}/page")

    async def missing(request):
        return web.Response(status=404, text="nope")

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(text="late")

    app = web.Application()
    for path, handler in (("/page", page), ("/latin", latin), ("/meta", meta_charset), ("/data", data),
                          ("/md", markdown), ("/binary", binary), ("/image", image),
                          ("/pdf", pdf), ("/big", big), ("/deep", deep), ("/redirect", redirect),
                          ("/elsewhere", elsewhere), ("/missing", missing), ("/slow", slow)):
        app.router.add_get(path, handler)
    return await aiohttp_server(app, host="127.0.0.1")


@pytest.fixture
async def guarded_open():
    async with media_session(allow_private=True) as session:  # loopback pages: allowed here
        yield session


async def read(pages, session, path: str, **kw):
    kw = {"max_bytes": 2**20, "timeout": 5.0, "allow_private": True, **kw}
    return await webfetch.fetch(str(pages.make_url(path)), session=session, **kw)


async def refused(pages, session, path: str, **kw) -> ToolError:
    with pytest.raises(ToolError) as caught:
        await read(pages, session, path, **kw)
    return caught.value


async def test_html_becomes_markdown_without_scripts_or_styles(pages, guarded_open):
    page = await read(pages, guarded_open, "/page")
    assert page.title == "The Page" and page.content_type == "text/html" and page.url.endswith("/page")
    assert "# Heading" in page.text and "**bold**" in page.text and "snake_case" in page.text
    assert "[a link](/other#frag)" in page.text and "- one\n- two" in page.text and "a picture" in page.text
    for gone in ("secret", "color: red", "turn on JavaScript", "framed", "drawn", "late", "base64", "The Page"):
        assert gone not in page.text, gone
    assert page.links == (str(pages.make_url("/other")), "https://elsewhere.example/page")
    assert page.retrieved_at.endswith("Z")


async def test_text_json_and_markdown_pass_through_decoded_by_their_charset(pages, guarded_open):
    assert (await read(pages, guarded_open, "/latin")).text == "caf\xe9 cr\xe8me"
    meta = await read(pages, guarded_open, "/meta")
    assert meta.title == "T" and "na\xefve" in meta.text
    data = await read(pages, guarded_open, "/data")
    assert json.loads(data.text) == {"a": [1, 2, 3]} and data.content_type == "application/json"
    assert (await read(pages, guarded_open, "/md")).text == "# Title\n\nbody"


@pytest.mark.parametrize(("path", "named"), [
    ("/binary", "application/octet-stream"), ("/image", "image/png"),
    ("/pdf", "application/pdf"),
])
async def test_what_is_not_text_is_refused_naming_its_type(pages, guarded_open, path, named):
    err = await refused(pages, guarded_open, path)
    assert named in err.reason and err.outcome == "refused"


@pytest.fixture
async def untyped():
    """A server that names no Content-Type (aiohttp's own always names one): HTML, text, binary."""
    bodies = {b"/html": b"<!DOCTYPE html><html><title>Bare</title><p>hello</p></html>", b"/text": b"plain words",
              b"/bin": b"\x00\x01\x02binary"}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        body = bodies[line.split()[1]]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


async def test_a_body_of_no_stated_type_is_looked_at(untyped, guarded_open):
    def get(path):
        return webfetch.fetch(untyped + path, session=guarded_open, max_bytes=1000, timeout=5, allow_private=True)

    page = await get("/html")
    assert page.title == "Bare" and page.text == "hello"
    assert (await get("/text")).text == "plain words"
    with pytest.raises(ToolError, match="of no stated type"):
        await get("/bin")


async def test_a_redirect_is_followed_and_the_final_url_told(pages, guarded_open):
    page = await read(pages, guarded_open, "/redirect")
    assert page.url == str(pages.make_url("/page")) and page.title == "The Page"


async def test_a_ten_megabyte_page_is_refused_past_the_bound(pages, guarded_open):
    start = time.monotonic()
    err = await refused(pages, guarded_open, "/big", max_bytes=2**20)
    assert err.outcome == "too_large" and "larger than 1048576 bytes" in err.reason
    assert time.monotonic() - start < 5


async def test_hostile_nesting_is_read_as_plain_text_off_the_event_loop(pages, guarded_open):
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    try:
        page = await read(pages, guarded_open, "/deep", max_bytes=2 * 2**20)
    finally:
        ticker.cancel()
    assert page.text == "deep inside"
    assert ticks > 5  # the loop kept turning while the page converted


async def test_loopback_is_refused_without_allow_private(pages):
    async with media_session(allow_private=False) as guarded:
        by_address = await refused(pages, guarded, "/page", allow_private=False)
        assert "private or loopback" in by_address.reason and by_address.outcome == "refused"
        with pytest.raises(ToolError, match="resolves to a private or loopback address"):
            await webfetch.fetch(f"http://localhost:{pages.port}/page", session=guarded, max_bytes=2**20,
                                 timeout=5, allow_private=False)


async def test_domain_rules_hold_the_page_and_each_redirect(pages, guarded_open):
    err = await refused(pages, guarded_open, "/page", blocked_domains=("127.0.0.1",))
    assert "outside the domains" in err.reason
    err = await refused(pages, guarded_open, "/elsewhere", allowed_domains=("127.0.0.1",))
    assert "a redirect" in err.reason and "outside the domains" in err.reason
    assert (await read(pages, guarded_open, "/redirect", allowed_domains=("127.0.0.1",))).title == "The Page"


@pytest.mark.parametrize(("url", "words"), [
    ("file:///etc/passwd", "only http and https"), ("", "needs a URL"), ("http://[::1", "not a valid URL"),
    ("https://a.example/" + "x" * 5000, "longer than"),
])
async def test_bad_urls_are_refused(guarded_open, url, words):
    with pytest.raises(ToolError, match=words):
        await webfetch.fetch(url, session=guarded_open, max_bytes=1000, timeout=1)


async def test_http_errors_and_slow_pages_are_tool_errors(pages, guarded_open):
    assert "HTTP 404" in (await refused(pages, guarded_open, "/missing")).reason
    slow = await refused(pages, guarded_open, "/slow", timeout=0.3)
    assert slow.outcome == "timeout" and "0.3 s" in slow.reason


# Ollama's experimental routes, on the real application, through the official client


def gateway_config(write_config, search: str = "") -> object:
    return load_config(write_config(
        "server:\n  discover_default_stores: false\n"
        f"  api_keys:\n    admin: {ADMIN}\n    bob: {{key: {USER}, role: user}}\n{search}models: {{}}\n"))


def official(client, key: str | None = USER) -> ollama.AsyncClient:
    """The official client, its hosted web calls (which it sends to ollama.com) sent to the
    gateway's experimental routes, as Ollama's own server takes them."""
    base = client.make_url("/")

    async def to_gateway(request: httpx.Request) -> None:
        request.url = request.url.copy_with(scheme="http", host=base.host, port=base.port,
                                            path="/api/experimental/" + request.url.path.rsplit("/", 1)[-1])
        request.headers["Host"] = f"{base.host}:{base.port}"

    return ollama.AsyncClient(host=str(base), headers={"Authorization": f"Bearer {key}"} if key else {},
                              event_hooks={"request": [to_gateway]})


async def test_the_official_client_searches_and_fetches_through_the_gateway(aiohttp_client, write_config, searxng,
                                                                            pages):
    app = create_app(gateway_config(write_config, f"  web_search:\n    searxng: {searxng.make_url('/')}\n"))
    app[TOOLS].web.allow_private = True  # these pages are on loopback; the gateway's own never reach it
    client = await aiohttp_client(app)
    async with official(client) as ol:
        found = await ol.web_search("python asyncio", max_results=2)
        assert [(r.title, r.url) for r in found.results] == [
            ("asyncio \u2014 Asynchronous I/O", "https://docs.python.org/3/library/asyncio.html"),
            ("Async IO in Python", "https://realpython.com/async-io-python/")]
        assert found.results[0].content == "asyncio is a library to write concurrent code"
        page = await ol.web_fetch(str(pages.make_url("/page")))
        assert page.title == "The Page" and "# Heading" in page.content and "secret" not in page.content
        assert list(page.links) == [str(pages.make_url("/other")), "https://elsewhere.example/page"]
        with pytest.raises(ollama.ResponseError) as caught:
            await ol.web_fetch(str(pages.make_url("/image")))
        assert caught.value.status_code == 400 and "image/png" in caught.value.error
    # Ollama's own bounds: 5 by default, 10 at most
    r = await client.post("/api/experimental/web_search", json={"query": "q"}, headers={"Authorization": f"Bearer {USER}"})
    assert r.status == 200 and len((await r.json())["results"]) == 4  # all the stand-in's distinct results
    r = await client.post("/api/experimental/web_search", json={"query": "q", "max_results": 0},
                          headers={"Authorization": f"Bearer {USER}"})
    assert r.status == 400 and "max_results" in (await r.json())["error"]
    r = await client.post("/api/experimental/web_search", json={"query": "q"})
    assert r.status == 401


async def test_the_gateways_own_sessions_never_reach_loopback(aiohttp_client, write_config, searxng, pages):
    app = create_app(gateway_config(write_config, f"  web_search:\n    searxng: {searxng.make_url('/')}\n"))
    client = await aiohttp_client(app)
    async with official(client) as ol:
        assert len((await ol.web_search("q")).results) == 3  # the client's default; SearXNG on loopback reached
        with pytest.raises(ollama.ResponseError) as caught:
            await ol.web_fetch(str(pages.make_url("/page")))
    assert caught.value.status_code == 400 and "private or loopback" in caught.value.error


async def test_a_failing_backend_is_a_502_in_ollamas_shape(aiohttp_client, write_config, searxng):
    app = create_app(gateway_config(write_config, f"  web_search:\n    searxng: {searxng.make_url('/fail')}\n"))
    client = await aiohttp_client(app)
    async with official(client) as ol:
        with pytest.raises(ollama.ResponseError) as caught:
            await ol.web_search("q")
    assert caught.value.status_code == 502 and "HTTP 500" in caught.value.error


async def test_without_a_backend_the_routes_say_so(aiohttp_client, write_config):
    client = await aiohttp_client(create_app(gateway_config(write_config)))
    async with official(client) as ol:
        for call in (ol.web_search("q"), ol.web_fetch("https://example.com/")):
            with pytest.raises(ollama.ResponseError) as caught:
                await call
            assert caught.value.status_code == 501 and "not configured" in caught.value.error
