"""The one reader of request bodies (gateway/api/body.py), called with bytes."""

import gzip
import json
import zlib

import pytest

from gateway.api.body import MAX_DEPTH, check_content_type, parse_body
from gateway.base.errors import ApiError

LIMIT = 1 << 20


def refusal(raw: bytes, encoding: str = "identity") -> ApiError:
    with pytest.raises(ApiError) as e:
        parse_body(raw, encoding, LIMIT)
    return e.value


def test_a_plain_object_passes_untouched():
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \U0001F600"}], "n": 10 ** 30}
    assert parse_body(json.dumps(body).encode(), "identity", LIMIT) == body


@pytest.mark.parametrize("raw, param", [
    (b'{"messages": [{"content": "a\\ud800"}]}', "messages[0].content"),
    (b'{"stop": ["ok", "\\udfff"]}', "stop[1]"),
    (b'{"a": {"\\ud800": 1}}', "a"),
])
def test_a_lone_surrogate_is_refused_where_it_is(raw, param):
    err = refusal(raw)
    assert err.status == 400 and err.code == "invalid_unicode" and err.param == param


def test_a_surrogate_pair_is_text():
    assert parse_body(b'{"a": "\\ud83d\\ude00"}', "identity", LIMIT) == {"a": "\U0001F600"}


@pytest.mark.parametrize("depth, ok", [(MAX_DEPTH - 1, True), (MAX_DEPTH + 1, False), (100_000, False)])
def test_nesting_is_bounded(depth, ok):
    raw = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    if ok:
        parse_body(raw, "identity", LIMIT)
    else:
        assert refusal(raw).code == "invalid_json"


@pytest.mark.parametrize("raw", [b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": ' + b"7" * 5000 + b"}",
                                 b"[1]", b"", b'"s"', b"\xff"])
def test_what_is_not_a_json_object_is_a_400(raw):
    err = refusal(raw)
    assert err.status == 400 and err.code == "invalid_json"


def test_compressed_bodies_are_decoded_within_the_limit():
    body = json.dumps({"a": "b" * 1000}).encode()
    assert parse_body(gzip.compress(body), "gzip", LIMIT) == {"a": "b" * 1000}
    assert parse_body(zlib.compress(body), "deflate", LIMIT) == {"a": "b" * 1000}
    assert refusal(body, "gzip").code == "invalid_body"
    assert refusal(gzip.compress(body)[:-10], "gzip").code == "invalid_body"
    bomb = gzip.compress(b'{"a": "' + b"x" * (4 * LIMIT) + b'"}')
    assert len(bomb) < LIMIT // 100
    err = refusal(bomb, "gzip")
    assert err.status == 413 and err.code == "request_too_large"
    err = refusal(body, "br")
    assert err.status == 415 and err.code == "unsupported_content_encoding"


@pytest.mark.parametrize("headers, ok", [
    ({}, True), ({"Content-Type": "application/json"}, True), ({"Content-Type": "application/json; charset=utf-8"}, True),
    ({"Content-Type": "application/vnd.api+json"}, True),
    ({"Content-Type": "application/octet-stream"}, True),  # what an HTTP library writes for bytes; a browser asks first
    ({"Content-Type": "application/x-www-form-urlencoded"}, True),  # curl -d, no browser headers
    ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://127.0.0.1:8080"}, False),
    ({"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Mode": "navigate"}, False),
    ({"Content-Type": "text/plain"}, False), ({"Content-Type": "multipart/form-data; boundary=x"}, False),
])
def test_a_json_body_must_say_so_where_a_browser_could_have_sent_it(headers, ok):
    if ok:
        check_content_type(headers)
    else:
        with pytest.raises(ApiError) as e:
            check_content_type(headers)
        assert e.value.status == 415 and e.value.code == "unsupported_media_type"
