"""What a capture (``server/captures``) must not keep, taken out. Pure functions on bytes and
headers.

- Credentials: the headers that carry them are kept as ``[redacted]`` (``headers``), and the
  values the request presented (``presented``: its bearer token, ``x-api-key``, ...) are cut
  out of the bodies wherever they appear (``cut_secrets``): a client that echoes its key into
  a prompt does not leave it in a capture.
- Content (``server.capture.redact_content``): every string in the JSON becomes its length,
  ``"[42 chars]"``, but for the words that give a message its shape (``SHAPE_KEYS``: roles,
  types, names of tools, finish reasons, ids), so a capture still shows how many messages,
  tools and calls went each way and how long each was, not what they said. A stream is redacted
  a line at a time (each ``data:`` line of server-sent events, each line of Ollama's NDJSON);
  what is not JSON is kept as its length alone."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"
# headers whose value is a credential, or may be; and any name with one of these words in it
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"})
SECRET_WORDS = ("key", "token", "secret", "password", "auth", "cookie", "signature")
# headers that carry a key: its value is cut out of the bodies too
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization")
MIN_SECRET = 4  # a shorter value is not looked for in the bodies (it would cut ordinary text)
# keys whose short string values give a message's shape and are kept by ``content``
SHAPE_KEYS = frozenset({"role", "type", "object", "model", "name", "id", "call_id", "tool_call_id", "tool_use_id",
                        "finish_reason", "stop_reason", "done_reason", "status", "event", "format", "media_type",
                        "detail", "tool_choice", "encoding_format", "created_at", "item_id"})
MAX_SHAPE_VALUE = 128  # a longer value under a shape key is text all the same


def is_secret(name: str) -> bool:
    lower = name.lower()
    return lower in SECRET_HEADERS or any(word in lower for word in SECRET_WORDS)


def headers(given: Mapping[str, str], max_count: int, max_length: int) -> dict[str, str]:
    """The first ``max_count`` headers, each value at most ``max_length`` characters, with
    every credential's value ``[redacted]``."""
    out: dict[str, str] = {}
    for name, value in given.items():
        if len(out) >= max_count:
            break
        out[name] = REDACTED if is_secret(name) else value[:max_length]
    return out


def presented(given: Mapping[str, str]) -> tuple[bytes, ...]:
    """The credentials a request's headers carry (a bearer token without its scheme), as bytes."""
    found = []
    for name in CREDENTIAL_HEADERS:
        value = given.get(name, "").strip()
        if " " in value:  # "Bearer sk-...", "Basic ..."
            value = value.split(None, 1)[1].strip()
        if len(value) >= MIN_SECRET:
            found.append(value.encode("utf-8", errors="replace"))
    return tuple(found)


def cut_secrets(data: bytes | None, secrets: tuple[bytes, ...]) -> bytes | None:
    if data is None:
        return None
    for secret in secrets:
        if secret in data:
            data = data.replace(secret, REDACTED.encode())
    return data


def content(data: bytes | None, *, sse: bool) -> bytes | None:
    """``data`` (a JSON body, or a stream's write: server-sent events where ``sse``, else JSON
    lines) with its text redacted as the module says."""
    if data is None:
        return None
    if not sse:
        whole = _redacted_json(data)
        if whole is not None:
            return whole
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if sse:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    lines[i] = b"data: " + (_redacted_json(payload) or _length(payload))
        elif line.strip():
            lines[i] = _redacted_json(line) or _length(line)
    return b"\n".join(lines)


def _length(text: bytes) -> bytes:
    return f"[{len(text)} bytes]".encode()


def _redacted_json(data: bytes) -> bytes | None:
    try:
        return json.dumps(redact_value(json.loads(data)), ensure_ascii=False, separators=(",", ":")).encode()
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python goes
        return None


def redact_value(value: Any, key: str | None = None) -> Any:
    """A parsed JSON value with its text redacted (``key``: the key it is under); recursive, as
    deep as ``json.loads`` went."""
    if isinstance(value, str):
        if key in SHAPE_KEYS and len(value) <= MAX_SHAPE_VALUE:
            return value
        return f"[{len(value)} chars]"
    if isinstance(value, dict):
        return {k: redact_value(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v, key) for v in value]
    return value
