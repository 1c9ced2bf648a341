"""The one reader of request bodies: every route that takes JSON reads it through
``read_json_object``, so every route refuses the same hostile shapes the same way.

A body is read within ``server.body_timeout`` (a body that never ends is a 408), decoded
when it says ``Content-Encoding: gzip`` or ``deflate`` (never past ``server.max_body_bytes``:
a small compressed body cannot expand without bound; any other encoding is a 415), and parsed
as strict JSON by ``base/strictjson`` (the one parser of JSON from outside, which the wire
parsers use for the JSON a caller sends inside a string too): no ``NaN``/``Infinity``, numbers
Python can hold, at most ``MAX_DEPTH`` levels of nesting, and no lone UTF-16 surrogate in any
string or key. Each refusal is a 4xx naming what is wrong; none reaches a handler. Large bodies
are parsed off the event loop. A body can also be given (``GIVEN_BODY``: a WebSocket event
made into a request by ``api/responses_socket``): parsed and checked by the same parser, off the
event loop where large, when its frame arrived, it is not encoded and parsed again (for a frame of
millions of tiny values that costs seconds, much of it holding the interpreter's lock).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..access import claims
from ..base import strictjson
from ..base.errors import ApiError, InvalidRequest
from ..base.strictjson import MAX_DEPTH
from ..server.captures import CAPTURE
from ..server.events import request_key
from .access import wire_of
from .appkeys import CONFIG

__all__ = ["MAX_DEPTH", "check_content_type", "decode", "parse_body", "parse_json", "read_json_object"]


@dataclass(frozen=True)
class Given:
    """A body its request's maker read, bounded and parsed (``strictjson``) already: ``body``;
    ``text()``, its JSON, is made only for a capture (off the event loop)."""

    body: dict[str, Any]
    text: Callable[[], bytes]


OFF_LOOP_BYTES = 256 * 1024  # bodies larger than this are decoded and parsed in a thread
# a body given by the handler that made the request rather than read from its connection: the
# Responses WebSocket's ``response.create``, whose request is the socket's own, cloned per event
GIVEN_BODY = request_key("given_body", Given)
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request's body as a JSON object, checked as the module says; raises ``ApiError``.
    Its ``priority`` (or OpenAI's ``service_tier``) lowers its claim on a busy model, for the
    rest of the request (``access.claims.ask``; 400 for a priority that is not one)."""
    body: dict[str, Any] = await read_json(request)
    if wire_of(request) is not None:  # a route that spends tokens (``access.spends``)
        claims.ask(body)
    return body


async def read_json(request: web.Request, array: bool = False) -> Any:
    """The request's body as a JSON object, or where ``array`` an object or an array
    (llama-server's POST /lora-adapters), checked as the module says; raises ``ApiError``."""
    server = request.app[CONFIG].server
    capture = request.get(CAPTURE)
    given = request.get(GIVEN_BODY)
    if given is not None:  # a WebSocket's event as a request's body: read, bounded and parsed already
        if capture is not None:
            capture.request_body(await asyncio.to_thread(given.text))
        return given.body
    raw = await _read(request, server.body_timeout)
    check_content_type(request.headers)
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if capture is not None:  # kept as decoded, so a compressed body reads as the JSON it is
        try:
            raw = await asyncio.to_thread(decode, raw, encoding, server.max_body_bytes) \
                if len(raw) > OFF_LOOP_BYTES else decode(raw, encoding, server.max_body_bytes)
        finally:
            capture.request_body(raw)  # as it came, where it could not be decoded
        encoding = "identity"
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_body, raw, encoding, server.max_body_bytes, array)
    return parse_body(raw, encoding, server.max_body_bytes, array)


async def _read(request: web.Request, timeout: float) -> bytes:
    try:
        if request.content.is_eof() or not timeout:  # all here already: no timer needed
            return await request.read()
        return await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise ApiError(f"The request body did not arrive within server.body_timeout ({timeout:g} s)",
                       status=408, code="request_timeout", headers={"Connection": "close"}) from None
    except web.HTTPException:  # 413 past server.max_body_bytes
        raise
    except Exception as e:  # a malformed or cut body: bad chunk sizes, a reset connection
        raise InvalidRequest(f"The request body could not be read: {type(e).__name__}",
                             code="invalid_body") from None


def check_content_type(headers: Mapping[str, str]) -> None:
    """A JSON body must say it is JSON where a browser could have sent it: the types a page on
    another site can make a browser post without asking first (CORS's safelisted
    ``text/plain``, ``multipart/form-data`` and ``application/x-www-form-urlencoded``) are
    refused (CSRF). Any other type (``application/octet-stream``, as an HTTP library writes for
    bytes) a browser must ask about first, which CORS answers, so it is taken as JSON like no
    type at all; and so is the form type from a client that is not a browser (``curl -d``, as
    Ollama's own examples post)."""
    given = headers.get("Content-Type")
    if given is None:
        return
    kind = given.split(";", 1)[0].strip().lower()
    if kind not in _SIMPLE_TYPES:
        return
    browser = "Origin" in headers or any(k.lower().startswith("sec-fetch-") for k in headers)
    if kind == "application/x-www-form-urlencoded" and not browser:
        return
    raise ApiError(f"Content-Type {given[:60]!r} is not JSON: send the body as application/json", status=415,
                   code="unsupported_media_type")


_SIMPLE_TYPES = frozenset({"text/plain", "multipart/form-data", "application/x-www-form-urlencoded"})


def parse_body(raw: bytes, encoding: str, limit: int, array: bool = False) -> Any:
    """Decode and parse one body (pure: a test calls it with bytes): a JSON object, or where
    ``array`` an object or an array."""
    body = parse_json(decode(raw, encoding, limit))
    if array and isinstance(body, list):
        return body
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON {'array or ' if array else ''}object",
                             code="invalid_json")
    return body


def decode(raw: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return raw
    wbits = _ENCODINGS.get(encoding)
    if wbits is None:
        raise ApiError(f"Content-Encoding {encoding[:40]!r} is not supported: send the body as is, or gzip or "
                       "deflate", status=415, code="unsupported_content_encoding")
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(raw, limit + 1)
    except zlib.error:
        raise InvalidRequest(f"The request body is not valid {encoding} data (Content-Encoding: {encoding})",
                             code="invalid_body") from None
    if len(out) > limit or d.unconsumed_tail:
        raise ApiError(f"The request body is larger than server.max_body_bytes ({limit} bytes) once decoded",
                       status=413, code="request_too_large")
    if not d.eof:
        raise InvalidRequest(f"The request body is cut short: incomplete {encoding} data", code="invalid_body")
    return out


def parse_json(raw: bytes) -> Any:
    """The body's JSON, parsed and bounded by ``base/strictjson`` (the parser every JSON text
    from outside goes through); a refusal names the place in the body. No body at all is None
    (``parse_body`` says a body must be an object)."""
    return strictjson.loads(raw) if raw else None
