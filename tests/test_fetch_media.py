"""``server/fetch.fetch_media``: a test server on 127.0.0.1 serves the answers (so reaching it
needs ``allow_private``); without it every loopback, private or link-local host is refused
before any connection is made."""

import asyncio
import ipaddress
import json
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.base.errors import InvalidRequest
from gateway.server.fetch import ForbiddenAddress, GuardedResolver, fetch_media, forbidden, media_session

PARAM = "messages[1].content[0].image_url.url"
BODY = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture
async def server(aiohttp_server):
    async def body(request):
        return web.Response(body=BODY, content_type="image/png")

    async def missing(request):
        return web.Response(status=404, text="no")

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(body=BODY)

    async def big(request):  # says its size, then is slow to send the body: only a refusal at once is quick
        resp = web.StreamResponse()
        resp.content_length = 5000
        await resp.prepare(request)
        await asyncio.sleep(5)
        await resp.write(b"x" * 5000)
        return resp

    async def big_streamed(request):  # says nothing: chunked, past the limit
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(10):
            await resp.write(b"y" * 1000)
        await resp.write_eof()
        return resp

    async def redirect(request):
        raise web.HTTPFound("/body")

    async def loop(request):
        raise web.HTTPFound("/loop")

    async def echo(request):  # what the fetch sent; and a cookie it must not send back
        resp = web.json_response({"ua": request.headers.get("User-Agent"),
                                  "auth": request.headers.get("Authorization"),
                                  "cookie": request.headers.get("Cookie")})
        resp.set_cookie("session", "abc")
        return resp

    app = web.Application()
    for path, handler in [("/body", body), ("/missing", missing), ("/slow", slow), ("/big", big),
                          ("/big-streamed", big_streamed), ("/redirect", redirect), ("/loop", loop),
                          ("/echo", echo)]:
        app.router.add_get(path, handler)
    return await aiohttp_server(app, host="127.0.0.1")


async def fetch(url, *, allow_private=False, max_bytes=4096, timeout=5.0, session=None):
    return await fetch_media(url, PARAM, max_bytes=max_bytes, timeout=timeout,
                             allow_private=allow_private, session=session)


async def refused(url, **kw) -> str:
    with pytest.raises(InvalidRequest) as caught:
        await fetch(url, **kw)
    err = caught.value
    assert err.status == 400 and err.param == PARAM and PARAM in err.message
    return err.message


async def test_fetches_the_body_when_private_addresses_are_allowed(server):
    assert await fetch(str(server.make_url("/body")), allow_private=True) == BODY


async def test_a_kept_session_fetches_too(server):
    async with media_session(allow_private=True) as session:
        for _ in range(2):
            assert await fetch(str(server.make_url("/body")), allow_private=True, session=session) == BODY


async def test_loopback_server_is_refused_without_allow_private(server):
    message = await refused(str(server.make_url("/body")))
    assert "private or loopback" in message and "allow_remote_media_private" in message


async def test_a_name_resolving_to_loopback_is_refused(server):
    message = await refused(f"http://localhost:{server.port}/body")
    assert "resolves to a private or loopback" in message


@pytest.fixture
def no_connect(monkeypatch):
    """Any attempt to open a socket connection fails the test."""
    def boom(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", boom)
    monkeypatch.setattr(socket.socket, "connect_ex", boom)


@pytest.mark.parametrize("url", [
    "http://[::1]/", "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.1.1:8080/",
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:169.254.169.254]/", "http://100.64.0.1/", "http://0.0.0.0/",
    "http://[fd00::1]/", "http://[fe80::1]/", "http://224.0.0.1/", "http://240.0.0.1/", "http://[2002:7f00:1::]/",
    "http://[64:ff9b::a00:1]/", "https://user:pw@127.0.0.1/",
])
async def test_private_ip_literals_are_refused_before_any_connection(no_connect, url):
    assert "private or loopback" in await refused(url, timeout=0.3)  # not the timeout's refusal


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "gopher://x/", "data:,x"])
async def test_other_schemes_are_refused(no_connect, url):
    assert "only http and https" in await refused(url)


@pytest.mark.parametrize("url", ["http://[::1", "http://2130706433/", "http://example.com:99999/"])
async def test_a_malformed_url_is_a_400(no_connect, url):
    assert "not a valid URL" in await refused(url)


async def test_a_name_that_does_not_resolve_is_a_400():
    assert "does not resolve" in await refused("http://does-not-exist.invalid/x.png")


async def test_http_error_is_a_400_naming_the_param(server):
    assert "HTTP 404" in await refused(str(server.make_url("/missing")), allow_private=True)


async def test_a_declared_size_past_the_limit_is_refused_at_once(server):
    # refused on its headers: a fetch that read on would wait the body's 5 s, past its own 4 s
    message = await refused(str(server.make_url("/big")), allow_private=True, timeout=4)
    assert "larger than 4096 bytes" in message


async def test_a_streamed_body_past_the_limit_is_refused(server):
    assert "larger than 4096 bytes" in await refused(str(server.make_url("/big-streamed")), allow_private=True)


async def test_exactly_the_limit_is_fetched(server):
    assert await fetch(str(server.make_url("/body")), allow_private=True, max_bytes=len(BODY)) == BODY


async def test_a_slow_answer_is_refused_in_time(server):
    start = time.monotonic()
    message = await refused(str(server.make_url("/slow")), allow_private=True, timeout=0.3)
    assert "took longer than 0.3 s" in message
    assert time.monotonic() - start < 5  # before the slow answer would have come


async def test_a_redirect_is_followed(server):
    assert await fetch(str(server.make_url("/redirect")), allow_private=True) == BODY


async def test_endless_redirects_are_refused(server):
    assert "more than 3 redirects" in await refused(str(server.make_url("/loop")), allow_private=True)


async def test_sends_its_name_and_no_credentials_or_cookies(server):
    # by name: aiohttp's ordinary cookie jar keeps no cookies for an IP-literal host
    url = server.make_url("/echo").with_host("localhost").with_user("user").with_password("secret")
    async with media_session(allow_private=True) as session:
        await fetch(str(url), allow_private=True, session=session)  # sets the cookie
        seen = json.loads(await fetch(str(url), allow_private=True, session=session))
    assert seen == {"ua": "gguf-gateway", "auth": None, "cookie": None}


async def test_a_huge_url_is_shortened_in_the_message(no_connect):
    message = await refused("http://10.0.0.1/" + "a" * 5000)
    assert len(message) < 400


async def test_the_resolver_drops_loopback_and_fails_when_none_is_left():
    with pytest.raises(ForbiddenAddress):
        await GuardedResolver().resolve("localhost", 80)
    with pytest.raises(ForbiddenAddress):
        await GuardedResolver().resolve("127.0.0.1", 80)


async def test_the_resolver_keeps_loopback_when_allowed():
    found = await GuardedResolver(allow_private=True).resolve("127.0.0.1", 80)
    assert [r["host"] for r in found] == ["127.0.0.1"]


def test_forbidden_addresses():
    bad = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
           "224.0.0.1", "255.255.255.255", "::1", "::", "fc00::1", "fe80::1", "ff02::1", "::ffff:10.0.0.1",
           "2002:a00:1::", "64:ff9b::7f00:1"]
    good = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]
    assert [a for a in bad if not forbidden(ipaddress.ip_address(a))] == []
    assert [a for a in good if forbidden(ipaddress.ip_address(a))] == []


@pytest.mark.parametrize(("location", "reason"), [
    ("http://127.0.0.1:1/secret", "private or loopback"),
    ("http://[::ffff:169.254.169.254]/latest/meta-data/", "private or loopback"),
    ("file:///etc/passwd", "only http and https"),
])
async def test_each_redirect_is_checked_before_it_is_followed(monkeypatch, no_connect, location, reason):
    # a public host answering with a redirect: the next hop must be refused before its
    # connection (aiohttp would connect to an IP literal without asking the resolver). The
    # first hop's answer is a fake, so nothing is connected to at all.
    calls = []

    class Answer:
        status = 302
        headers = {"Location": location}
        url = URL("http://93.184.215.14/pic.png")

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

    def get(self, url, **kw):
        calls.append((str(url), kw.get("allow_redirects")))
        return Answer()

    monkeypatch.setattr(aiohttp.ClientSession, "get", get)
    assert reason in await refused("http://93.184.215.14/pic.png")
    assert calls == [("http://93.184.215.14/pic.png", False)]


async def test_a_closed_port_and_one_that_hangs_up_read_alike():
    """A caller who chose the URL learns nothing of which ports are open: a refused connection
    and one the host cuts at once give the same words (issue 64, the on-demand pull's rule)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        open_port = server.sockets[0].getsockname()[1]
        shut = await refused(f"http://127.0.0.1:{closed_port}/x", allow_private=True)
        cut = await refused(f"http://127.0.0.1:{open_port}/x", allow_private=True)
    finally:
        server.close()
    assert shut.replace(str(closed_port), "PORT") == cut.replace(str(open_port), "PORT"), (shut, cut)
    assert "could not be reached" in shut
