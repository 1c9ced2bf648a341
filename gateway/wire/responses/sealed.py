"""Reasoning sealed into a reasoning item's ``encrypted_content`` (asked for with ``include:
["reasoning.encrypted_content"]``), so a stateless next turn carries its thinking back.

Signed, not encrypted: the thinking (the caller's own answer, which it saw) as base64 of
versioned JSON, then a dot, then its HMAC-SHA256 under the gateway's key (``base/secretfile``:
kept in its state folder, the same across restarts). An item altered, cut, made by hand or by
another server (OpenAI's own, another gateway's) does not open: a 400 naming the field, never
thinking the model did not write put into its history. The signature is checked before any of
the content is parsed.

A compaction item's summary (``/v1/responses/compact``) is sealed the same way under another
field (``field="summary"``): a reasoning item's seal does not open as a compaction, nor one as
the other.

Pure, given the key; ``EPHEMERAL`` is the key of a caller that has none (a test, a wire-level
use): what it seals opens in this process alone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from typing import Any

from ...base import strictjson
from ...base.errors import InvalidRequest

SEAL_VERSION = "gguf-gateway/2"  # /1 was unsigned
EPHEMERAL = secrets.token_bytes(32)


def _mac(key: bytes, body: str) -> str:
    """The signature of the seal's first part, as it is written: any change to the text fails."""
    return _b64(hmac.new(key, b"encrypted_content\0" + body.encode("ascii"), hashlib.sha256).digest())


def seal(thinking: str, key: bytes = EPHEMERAL, field: str = "thinking") -> str:
    """A reasoning item's ``encrypted_content``: its thinking, signed with ``key`` (``field``:
    what the text is, ``summary`` for a compaction item's). Opaque, so clients carry it back
    unchanged."""
    body = _b64(json.dumps({"v": SEAL_VERSION, field: thinking}, ensure_ascii=False).encode())
    return f"{body}.{_mac(key, body)}"


def unseal(value: Any, where: str, key: bytes = EPHEMERAL, field: str = "thinking") -> str:
    """The thinking (or other ``field``) ``seal`` made with ``key``, or a 400 naming ``where``:
    the value came back from a client."""
    what = "reasoning" if field == "thinking" else f"a {field}"
    problem = InvalidRequest(f"`{where}` is not {what} this server sealed (a response's own `encrypted_content`, "
                             "unchanged)", where)
    if not isinstance(value, str) or not value.isascii() or value.count(".") != 1:
        raise problem
    body, mac = value.split(".")
    if not hmac.compare_digest(mac, _mac(key, body)):
        raise problem
    try:
        payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, binascii.Error):
        raise problem from None
    data = strictjson.loads(payload, where)  # signed by this server's key: its own JSON
    if not isinstance(data, dict) or data.get("v") != SEAL_VERSION or not isinstance(data.get(field), str):
        raise problem
    return data[field]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")

