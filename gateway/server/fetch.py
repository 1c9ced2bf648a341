"""Fetching what a URL from outside names: a picture or sound that a request names by http(s)
URL (OpenAI ``image_url.url``, Anthropic ``source: {type: url}``; ``fetch_media``, only where the
operator set ``server.allow_remote_media``), and a page the ``web_fetch`` tool reads
(``tools/webfetch``, through ``fetch_guarded``, which also gives the final URL and the content
type). The hosted tools' sessions, one pair per application, are ``WebSessions``.

A URL in a request makes the gateway open a connection on the caller's behalf, from inside the
operator's network (SSRF). So ``fetch_guarded`` (and ``fetch_media`` through it):

- fetches only ``http`` and ``https`` URLs;
- never connects to a loopback, private, unique-local, link-local (cloud metadata among them),
  multicast, unspecified, reserved or shared (CGNAT) address, nor to an IPv6 form that embeds
  one (IPv4-mapped, 6to4, NAT64), unless ``allow_private``. The check is on the address
  actually connected to: the connector's resolver (``GuardedResolver``) drops forbidden
  addresses, so a name that resolves to one is refused, and since aiohttp's ``TCPConnector``
  never asks the resolver about a host that is an IP literal, each URL's literal host is checked
  here before any request;
- follows at most ``MAX_REDIRECTS`` redirects by hand, each URL checked as the first (a redirect
  to an IP literal would otherwise skip the resolver);
- reads at most ``max_bytes`` (refused at once on a larger Content-Length, and as soon as the
  streamed body passes it) within ``timeout`` seconds for the whole fetch, redirects included;
- keeps no cookies, sends no credentials (userinfo in a URL is dropped) and no proxy settings
  from the environment, and names itself ``gguf-gateway``.

Every failure is the exception its caller's ``refuse`` makes of a short reason and a kind
(``refused``, ``too_large``, ``timeout``, ``error``): for ``fetch_media`` an ``InvalidRequest``
(400) naming the request's field (``param``) with the URL shortened (the caller's URL is the
caller's mistake, never a 500); for ``web_fetch`` the tool's error, which the model reads.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from ..base.addresses import forbidden, forbidden_text
from ..base.errors import InvalidRequest

MAX_REDIRECTS = 3
USER_AGENT = "gguf-gateway"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_PRIVATE_HINT = "(server.allow_remote_media_private allows it)"
_MEDIA_SIZE = "server.max_media_bytes"
# a refused connection and one cut after it opened read alike: a caller who chose the URL learns
# nothing of which ports are open on a host
UNREACHABLE = "the host could not be reached"
# (reason, kind) -> the exception the caller raises; kind: refused, too_large, timeout, error
Refuse = Callable[[str, str], Exception]
CheckHop = Callable[[URL], None]  # raises (its caller's ``refuse``) for a URL the caller will not reach


@dataclass(frozen=True)
class Fetched:
    """What ``fetch_guarded`` read: the URL it came from after redirects, its media type
    (lower case, no parameters; "" where the server named none), its charset (None: unnamed)
    and its body."""

    url: str
    content_type: str
    charset: str | None
    body: bytes


class ForbiddenAddress(OSError):
    """A host that resolves only to forbidden addresses. An ``OSError`` so that aiohttp wraps it
    as it wraps any resolver failure (``ClientConnectorError.os_error``)."""


class GuardedResolver(AbstractResolver):
    """aiohttp's default resolver, less the forbidden addresses; failing where none is left."""

    def __init__(self, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self._inner: AbstractResolver | None = None  # made on first use: it needs a running loop

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if self._inner is None:
            self._inner = DefaultResolver()
        found = await self._inner.resolve(host, port, family)
        if self.allow_private:
            return found
        kept = [r for r in found if not forbidden_text(r["host"])]
        if not kept:
            raise ForbiddenAddress(f"{host} resolves only to private or loopback addresses")
        return kept

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


def media_session(allow_private: bool) -> aiohttp.ClientSession:
    """A session whose every connection goes through ``GuardedResolver`` (call it with a running
    loop; close it when done). ``fetch_media`` must be given the same ``allow_private``."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(resolver=GuardedResolver(allow_private)),
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        trust_env=False,
    )


class WebSessions:
    """The HTTP sessions of the tools the gateway runs itself, one pair per application: made
    in ``create`` (with a running loop, at the application's start) and closed in ``close``.
    ``guarded`` reaches what a model or a caller names (``media_session(allow_private)``: never
    a private or loopback address unless ``allow_private``, which no setting turns on); ``operator``
    reaches what the configuration names (a SearXNG server, often on loopback): no address
    refused, and still no cookies, no credentials and no proxy from the environment."""

    def __init__(self, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self._guarded: aiohttp.ClientSession | None = None
        self._operator: aiohttp.ClientSession | None = None

    def create(self) -> None:
        self._guarded = media_session(self.allow_private)
        self._operator = media_session(True)

    @property
    def guarded(self) -> aiohttp.ClientSession:
        if self._guarded is None:
            raise RuntimeError("WebSessions.create has not run: the application has not started")
        return self._guarded

    @property
    def operator(self) -> aiohttp.ClientSession:
        if self._operator is None:
            raise RuntimeError("WebSessions.create has not run: the application has not started")
        return self._operator

    async def close(self) -> None:
        for session in (self._guarded, self._operator):
            if session is not None:
                await session.close()
        self._guarded = self._operator = None


def _short(url: str, limit: int = 100) -> str:
    return url if len(url) <= limit else url[: limit - 3] + "..."


async def fetch_media(url: str, param: str, *, max_bytes: int, timeout: float,
                      allow_private: bool = False, session: aiohttp.ClientSession | None = None) -> bytes:
    """The body at ``url``, or an ``InvalidRequest`` naming ``param`` (see the module's docstring)."""

    def refuse(reason: str, kind: str) -> InvalidRequest:
        return InvalidRequest(f"could not fetch the file at `{param}` ({_short(url)}): {reason}", param)

    got = await fetch_guarded(url, refuse, max_bytes=max_bytes, timeout=timeout, allow_private=allow_private,
                              session=session)
    return got.body


async def fetch_guarded(url: str, refuse: Refuse, *, max_bytes: int, timeout: float, allow_private: bool = False,
                        session: aiohttp.ClientSession | None = None, check_hop: CheckHop | None = None,
                        private_hint: str = _PRIVATE_HINT, size_setting: str = _MEDIA_SIZE,
                        accept: str | None = None) -> Fetched:
    """What ``url`` answers, fetched as the module's docstring says; every failure is
    ``refuse(reason, kind)``, raised. ``session``: one made by ``media_session`` with the same
    ``allow_private`` (None: one made for this fetch). ``check_hop`` is asked about each URL
    before its connection, the first and every redirect's (a tool's domain rules);
    ``private_hint`` and ``size_setting`` name, in a reason, the settings that would allow it;
    ``accept``: the Accept header sent."""
    own = session is None
    client = media_session(allow_private) if session is None else session
    try:
        return await _fetch(client, url, refuse, max_bytes, timeout, allow_private,
                            check_hop, private_hint, size_setting, accept)
    except asyncio.TimeoutError:  # aiohttp's timeouts are these too
        raise refuse(f"took longer than {timeout:g} s", "timeout") from None
    except aiohttp.ClientConnectorError as exc:  # a resolver's failure is its os_error
        if isinstance(exc.os_error, ForbiddenAddress):
            raise refuse(f"the host resolves to a private or loopback address {private_hint}".rstrip(),
                         "refused") from None
        if isinstance(exc.os_error, socket.gaierror):
            raise refuse("the host name does not resolve", "error") from None
        raise refuse(UNREACHABLE, "error") from None
    except (aiohttp.InvalidURL, ValueError):  # yarl's and idna's complaints are ValueErrors
        raise refuse("not a valid URL", "refused") from None
    except (aiohttp.ClientError, OSError):
        raise refuse(UNREACHABLE, "error") from None
    finally:
        if own:
            await client.close()


async def _fetch(client: aiohttp.ClientSession, url: str, refuse: Refuse, max_bytes: int, timeout: float,
                 allow_private: bool, check_hop: CheckHop | None, private_hint: str, size_setting: str,
                 accept: str | None) -> Fetched:
    # one deadline for the whole fetch: each hop gets what is left of it, as aiohttp's own timeout
    deadline = asyncio.get_running_loop().time() + timeout
    target = URL(url)
    too_large = f"the file is larger than {max_bytes} bytes ({size_setting})"
    headers = {"Accept": accept} if accept is not None else None
    for hop in range(MAX_REDIRECTS + 1):
        _check(target, refuse, allow_private, private_hint)
        if check_hop is not None:
            check_hop(target)
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise asyncio.TimeoutError
        async with client.get(target.with_user(None), allow_redirects=False, auth=None, headers=headers,
                              timeout=aiohttp.ClientTimeout(total=left)) as resp:
            location = resp.headers.get("Location")
            if resp.status in _REDIRECTS and location:
                if hop == MAX_REDIRECTS:
                    raise refuse(f"more than {MAX_REDIRECTS} redirects", "refused")
                target = resp.url.join(URL(location))
                continue
            if not 200 <= resp.status < 300:
                raise refuse(f"HTTP {resp.status}", "error")
            if resp.content_length is not None and resp.content_length > max_bytes:
                raise refuse(too_large, "too_large")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > max_bytes:
                    raise refuse(too_large, "too_large")
            return Fetched(str(resp.url), resp.content_type.lower() if "Content-Type" in resp.headers else "",
                           resp.charset, bytes(body))
    raise AssertionError("unreachable: the loop returns or raises")


def _check(target: URL, refuse: Refuse, allow_private: bool, private_hint: str) -> None:
    """Refuse a URL that is not http(s), has no host, or whose host is a forbidden IP literal
    (aiohttp connects to a literal without asking the resolver)."""
    if target.scheme not in ("http", "https"):
        raise refuse("only http and https URLs are fetched", "refused")
    host = target.raw_host
    if not host:
        raise refuse("the URL names no host", "refused")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: the resolver checks what it resolves to
    if not allow_private and forbidden(ip):
        raise refuse(f"the host is a private or loopback address {private_hint}".rstrip(), "refused")
