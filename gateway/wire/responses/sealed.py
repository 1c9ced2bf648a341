"""Reasoning sealed into a reasoning item's ``encrypted_content`` (asked for with ``include:
["reasoning.encrypted_content"]``), so a stateless next turn carries its thinking back."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ...base.errors import InvalidRequest

SEAL_VERSION = "gguf-gateway/1"


def seal(thinking: str) -> str:
    """A reasoning item's ``encrypted_content``: its thinking as base64 of versioned JSON. Not
    secret (the caller saw the thinking); opaque, so clients carry it back unchanged."""
    return base64.b64encode(json.dumps({"v": SEAL_VERSION, "thinking": thinking}).encode()).decode("ascii")


def unseal(value: Any, where: str) -> str:
    """The thinking ``seal`` made, or a 400 naming ``where``: the value came back from a client."""
    problem = InvalidRequest(f"`{where}` is not reasoning this server sealed (a response's own `encrypted_content`, "
                             "unchanged)", where)
    if not isinstance(value, str):
        raise problem
    try:
        data = json.loads(base64.b64decode(value.encode("ascii"), validate=True))
    except (ValueError, UnicodeError, binascii.Error):
        raise problem from None
    if not isinstance(data, dict) or data.get("v") != SEAL_VERSION or not isinstance(data.get("thinking"), str):
        raise problem
    return data["thinking"]
