"""Scanning shared by the formats' parsers: pure functions over the text not yet consumed
(markers that may still be arriving, names, JSON call heads), the JSON depth scan a call's
arguments are read with, and the typing of a text value by its tool's JSON schema."""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import Enum
from typing import Any

from ...base import strictjson

WS = " \t\r\n"
NAME_LIMIT = 256  # a tool or parameter name longer than this is not one
HEAD_LIMIT = 2048  # a JSON call's text before its arguments longer than this is not read as a head


class Status(Enum):
    """How a scan stopped: it needs more text, it is done, or a marker cut it."""

    MORE = "more"
    DONE = "done"
    CUT = "cut"


MORE, DONE, CUT = Status.MORE, Status.DONE, Status.CUT
BAD = "bad"  # read_name: the text cannot be a name


def loads(text: str) -> Any:
    """Strict JSON, as ``base/strictjson`` reads every JSON text from outside: NaN and Infinity
    are not JSON, nor is a text nested past its bound (a ``ValueError``, never a
    ``RecursionError``)."""
    return strictjson.loads(text)


def is_object(text: str) -> bool:
    try:
        return isinstance(loads(text), dict)
    except ValueError:
        return False


def escape(text: str) -> str:
    """``text`` as the inside of a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def find(buf: str, markers: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest full marker in ``buf`` (the longest one when two begin at once)."""
    best: tuple[int, str] | None = None
    for m in markers:
        i = buf.find(m, start)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(m) > len(best[1]))):
            best = (i, m)
    return best


def partial(buf: str, markers: Sequence[str]) -> int:
    """Length of the longest tail of ``buf`` that may still grow into a marker."""
    keep = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), keep, -1):
            if buf.endswith(m[:k]):
                keep = k
                break
    return keep


def lead(buf: str, markers: Sequence[str], final: bool) -> str | None:
    """The marker ``buf`` begins with; "" while it may still become one; None if not."""
    for m in markers:
        if buf.startswith(m):
            return m
    if not final and any(m.startswith(buf) for m in markers):
        return ""
    return None


def until(buf: str, markers: Sequence[str], final: bool) -> tuple[str, str | None]:
    """Text before the first marker (or all that cannot begin one), and that marker."""
    hit = find(buf, markers)
    if hit:
        return buf[:hit[0]], hit[1]
    return buf[:len(buf) - (0 if final else partial(buf, markers))], None


def read_name(buf: str, ends: Sequence[str], final: bool, bad: str) -> tuple[str, str] | Status | str:
    """A name ended by one of ``ends``: (name, end); ``MORE`` while it may still come; ``BAD``
    when the text cannot be a name (too long, a character in ``bad``, or no end at all)."""
    text, end = until(buf, ends, final)
    if len(text) > NAME_LIMIT or any(c in bad for c in text):
        return BAD
    if end is None:
        return BAD if final else MORE
    return text, end


class JsonScan:
    """Where a scan of JSON text stands: nesting depth and whether inside a string; ``text``
    is what it consumed."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_str = self.esc = False
        self.text = ""

    def step(self, c: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self.in_str = False
        elif c == '"':
            self.in_str = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1


_SPACE, _STR = object(), object()  # head pattern tokens: optional whitespace, a JSON string (the name)


def _match_seq(buf: str, tokens: Sequence[object]) -> tuple[str, int] | Status | None:
    pos, name = 0, None
    for tok in tokens:
        if tok is _SPACE:
            while pos < len(buf) and buf[pos] in WS:
                pos += 1
            if pos == len(buf):
                return MORE
        elif tok is _STR:
            if pos == len(buf):
                return MORE
            if buf[pos] != '"':
                return None
            j = pos + 1
            while j < len(buf) and buf[j] != '"':
                j += 2 if buf[j] == "\\" else 1
            if j >= len(buf):
                return MORE
            try:
                value = loads(buf[pos:j + 1])
            except ValueError:
                return None
            name, pos = value, j + 1
        else:
            assert isinstance(tok, str)
            avail = buf[pos:pos + len(tok)]
            if not tok.startswith(avail):
                return None
            if len(avail) < len(tok):
                return MORE
            pos += len(tok)
    assert isinstance(name, str)
    return name, pos


def match_head(buf: str, arg_keys: Sequence[str]) -> tuple[str, int] | Status | None:
    """``{"name": "N", "<arg key>":`` (``"type": "function",`` may come first) at the start of
    ``buf``: (N, its length), ``MORE`` while ``buf`` ends before that is decided, or None."""
    more = False
    for typed in (False, True):
        for key in arg_keys:
            head: list[object] = ["{", _SPACE]
            if typed:
                head += ['"type"', _SPACE, ":", _SPACE, '"function"', _SPACE, ",", _SPACE]
            head += ['"name"', _SPACE, ":", _SPACE, _STR, _SPACE, ",", _SPACE, f'"{key}"', _SPACE, ":"]
            r = _match_seq(buf, head)
            if isinstance(r, tuple):
                return r
            more = more or r == MORE
    return MORE if more else None


def schema_types(schema: Any) -> set[str] | None:
    """The JSON types a parameter's schema allows; None when it does not say."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)} or None
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            sub_types = schema_types(sub)
            if sub_types is None:
                return None
            types |= sub_types
    values = schema.get("enum", [schema["const"]] if "const" in schema else [])
    for v in values if isinstance(values, list) else []:
        types.add(_json_type(v))
    return types or None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def typed(raw: str, types: set[str] | None) -> str:
    """The JSON text of a value written as text (an XML-style parameter): JSON when it parses as
    a type the schema allows (any JSON when the schema does not say), a string otherwise."""
    if types != {"string"}:
        try:
            value = loads(raw.strip())
        except ValueError:
            pass
        else:
            kind = _json_type(value)
            allowed = types is None or kind in types or (kind == "integer" and "number" in types)
            if allowed or (types is not None and "string" not in types):
                return json.dumps(value, ensure_ascii=False)
    return json.dumps(raw, ensure_ascii=False)


def tool_params(tools: Sequence[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Each tool's name -> its parameters schema (``{}`` when it has none)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, dict) else {}
    return out
