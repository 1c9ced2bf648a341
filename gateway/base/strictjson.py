"""The one JSON parser for text from outside the gateway: a request's body (``api/body.py``), a
JSON text a caller sends inside a string (tool calls' ``arguments``, a Responses
``function_call``'s), what a model writes as a call, and an upstream server's answers.

Strict and bounded alike everywhere: no ``NaN``/``Infinity`` (unless a caller of ``loads``
asks for them: an upstream's logprobs), numbers Python can hold, at most ``MAX_DEPTH`` levels
of nesting, and no lone UTF-16 surrogate in any string or key (``"\\ud800"`` is valid JSON but
not text: it cannot be encoded, tokenized or logged). Python's own parser recurses: a text
nested thousands deep raises ``RecursionError`` inside it, and a text under that but deeper than
the code after it can walk fails later; both are refused here, as what they are.

A refusal is a ``JSONRefused``: a 400 (``InvalidRequest``) naming the field the text came in
(``where``), or the place inside the body, and a ``ValueError`` for the callers that read a
model's or an upstream's text and treat bad JSON as no JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidRequest

MAX_DEPTH = 100  # JSON nesting; a chat request needs about 6, a JSON schema rarely 30
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONRefused(InvalidRequest, ValueError):
    """JSON this gateway does not read: a 400 naming where it came, and a ``ValueError``."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str | bytes, where: str | None = None, *, constants: bool = False) -> Any:
    """``text`` parsed and checked as the module says; raises ``JSONRefused``. ``where`` names
    the field whose string held the text (``input[2].arguments``); None: the request body,
    whose refusals name the place inside it. ``constants`` lets NaN and Infinity through."""
    what = f"`{where}`" if where is not None else "The request body"
    try:
        if not text:
            raise ValueError("it is empty")
        value = json.loads(text) if constants else json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise JSONRefused(f"{what} is nested more than {MAX_DEPTH} levels deep", where, "invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:  # also NaN, Infinity, integers of more than 4300 digits
        raise JSONRefused(f"{what} is not valid JSON: {str(e)[:200]}", where, "invalid_json") from None
    check_tree(value, where)
    return value


def check_tree(value: Any, where: str | None = None) -> None:
    """Depth and lone surrogates, without recursion. The refusal names ``where`` or, for the
    body itself, the offending place (``messages[0].content``), built only when there is one."""
    stack: list[tuple[Any, Any, Any, int]] = [(value, None, None, 0)]  # (value, parent entry, key, depth)
    while stack:
        entry = stack.pop()
        v, _, _, depth = entry
        if isinstance(v, str):
            if _lone_surrogate(v):
                raise JSONRefused(f"{_place(entry, where)} holds a lone UTF-16 surrogate (such as \\ud800): not "
                                  "valid Unicode text", where or _path(entry), "invalid_unicode")
            continue
        if isinstance(v, dict):
            items: Any = v.items()
        elif isinstance(v, list):
            items = enumerate(v)
        else:
            continue
        if depth >= MAX_DEPTH:
            what = f"`{where}`" if where is not None else "The request body"
            raise JSONRefused(f"{what} is nested more than {MAX_DEPTH} levels deep",
                              where if where is not None else _path(entry) or None, "invalid_json")
        for k, x in items:
            if isinstance(k, str) and _lone_surrogate(k):
                raise JSONRefused(f"A key in {_place(entry, where)} holds a lone UTF-16 surrogate: not valid Unicode "
                                  "text", where or _path(entry) or None, "invalid_unicode")
            if isinstance(x, (str, dict, list)):
                stack.append((x, entry, k, depth + 1))


def _lone_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def _place(entry: tuple[Any, Any, Any, int], where: str | None) -> str:
    """Where ``entry`` is, as a refusal shows it: its path in the body, or in the field ``where``."""
    inner = _path(entry)
    if where is None:
        return f"`{inner}`" if inner else "the body"
    return f"`{where}` (at `{inner}`)" if inner else f"`{where}`"


def _path(entry: tuple[Any, Any, Any, int]) -> str:
    parts = []
    while entry[1] is not None:
        _, parent, key, _ = entry
        parts.append(f"[{key}]" if isinstance(key, int) else f".{_printable(key)}")
        entry = parent
    return "".join(reversed(parts)).lstrip(".")


def _printable(key: str) -> str:
    return _SURROGATE.sub("\ufffd", key[:64])
