"""gemma4: Gemma 4 writes ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, one call per pair
of markers, its arguments in Gemma's own notation: bare keys, strings between ``<|"|>`` (a
control token, no escapes inside), JSON numbers, ``true``/``false``/``null``, and ``{...}`` /
``[...]`` nested, as llama.cpp reads them (``common/parsers/gemma4.cpp``). The arguments stream
as JSON as they are read (``Notation``), a string as it is written. Its thinking is the
``channel`` format (``reasoning.py``); its template renders calls and results itself."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

from .gbnf import COMMA, WS, Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import MORE, escape, lead, read_name

TOOL_CALL, TOOL_CALL_END, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CALL_PREFIX = "call:"
MARKERS = (TOOL_CALL, TOOL_CALL_END, QUOTE)
TOKEN = TOOL_CALL
EXAMPLE = (f"{TOOL_CALL}call:<function-name>{{<arg-name>:{QUOTE}<string value>{QUOTE},<arg-name>:<number>}}"
           f"{TOOL_CALL_END}")
ARGS_LIMIT = 1 << 20  # arguments longer than this are not read (the call fails)


def shown_by(template: str) -> bool:
    return f"{TOOL_CALL}call:" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


_SCALAR = {"integer", "number", "boolean", "null"}


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """Each tool's declared arguments: a string one as a ``<|"|>`` string, a number, boolean or
    null one by its schema (JSON's spelling is Gemma's), any other as any Gemma value."""
    q = lit(QUOTE)
    string = rules.rule("gemma4-string", f"{q} {until(QUOTE)} {q}")
    number = rules.rule("gemma4-number", '"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?')
    rules.rule("gemma4-dict", f'"{{" {WS} ([^:}}<]{{1,64}} ":" {WS} gemma4-value ({COMMA} [^:}}<]{{1,64}} ":" {WS} '
                              f'gemma4-value)*)? {WS} "}}"')
    rules.rule("gemma4-array", f'"[" {WS} (gemma4-value ({COMMA} gemma4-value)*)? {WS} "]"')
    value = rules.rule("gemma4-value", f'{string} | gemma4-dict | gemma4-array | {number} | "true" | "false" | "null"')
    alts = []
    for i, tool in enumerate(tools):
        props = (tool["function"].get("parameters") or {}).get("properties") or {}
        items = []
        for j, (pname, schema) in enumerate(props.items()):
            schema = schema if isinstance(schema, dict) else {}
            t = schema.get("type")
            if t == "string" and "enum" not in schema and "const" not in schema:
                v = string
            elif isinstance(t, str) and t in _SCALAR:
                v = rules.value(schema, f"tool{i}-p{j}")
            else:
                v = value
            items.append(f'{lit(pname)} ":" {WS} {v}')
        arg = rules.rule(f"tool{i}-arg", " | ".join(items)) if items else ""
        body = f"({arg} ({COMMA} {arg})*)?" if arg else ""
        alts.append(f'{lit(tool["function"]["name"])} "{{" {WS} {body} {WS} "}}"')
    one = rules.rule("tool-call", f'{lit(TOOL_CALL + CALL_PREFIX)} ({" | ".join(alts)}) {lit(TOOL_CALL_END)}')
    return repeat(one, parallel), (r"<\|tool_call>",)


history = history_as_is


# --- Gemma's notation as JSON --------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_WORD = re.compile(r"true|false|null")
_ATOM = frozenset("-+.0123456789eEtruefalsn")
_CUTS = (TOOL_CALL_END, TOOL_CALL)  # markers that end a call's text wherever they come outside strings
DEPTH_LIMIT = 64


class Notation:
    """Arguments in Gemma's notation read as they come, written out as JSON text piece by piece:
    ``feed`` consumes what it can and returns the JSON it makes. It stops once the arguments'
    ``{...}`` is whole (``done``), at a broken spot (``error``), at a call marker outside a
    string, or where the text may end in a marker not yet whole."""

    def __init__(self) -> None:
        self.stack: list[str] = []  # the open "{" and "["
        self.mode = "value"  # what comes next: value, atom, str, key, bkey, kstr, colon, after
        self.token = ""  # the atom or key being read
        self.first = True  # the innermost open container has no member yet
        self.done = False
        self.error: str | None = None

    def _fail(self, error: str) -> None:
        self.error = error

    def _member(self, out: list[str]) -> None:
        out.append(("" if self.first else ", ") + json.dumps(self.token, ensure_ascii=False) + ": ")
        self.first = False
        self.mode = "value"

    def _close(self, c: str, out: list[str]) -> None:
        if not self.stack or self.stack[-1] != ("{" if c == "}" else "["):
            self._fail("a closer that closes nothing open")
            return
        self.stack.pop()
        out.append(c)
        self.first = False
        self.mode = "after"
        self.done = not self.stack

    def feed(self, buf: str, final: bool) -> tuple[int, str]:
        out: list[str] = []
        i = 0
        while i < len(buf) and not self.done and self.error is None:
            c = buf[i]
            if self.mode in ("str", "kstr"):  # no markers inside a string but its closing quote
                j = buf.find(QUOTE, i)
                stop = j if j >= 0 else len(buf) - (0 if final else partial_quote(buf[i:]))
                if self.mode == "str":
                    out.append(escape(buf[i:stop]))
                else:
                    self.token += buf[i:stop]
                i = stop
                if j < 0:
                    break
                i += len(QUOTE)
                if self.mode == "str":
                    out.append('"')
                    self.first, self.mode = False, "after"
                else:
                    self.mode = "colon"
                continue
            if c == "<":
                m = lead(buf[i:], (QUOTE, *_CUTS), final)
                if m == "" or m in _CUTS:
                    break  # a marker may be coming, or the call was cut off
            if self.mode == "atom":
                if c in _ATOM:
                    self.token += c
                    i += 1
                    continue
                if not (_NUMBER.fullmatch(self.token) or _WORD.fullmatch(self.token)):
                    self._fail("not a value")
                    break
                out.append(self.token)
                self.first, self.mode = False, "after"
                continue
            if self.mode == "bkey":
                if c == ":":
                    self.token = self.token.strip()
                    if not self.token:
                        self._fail("an empty key")
                        break
                    self._member(out)
                elif c == "}":
                    self._fail("a key without a value")
                else:
                    self.token += c
                i += 1
                continue
            if c in " \t\r\n":
                i += 1
                continue
            if self.mode == "value":
                if buf.startswith(QUOTE, i):
                    out.append('"')
                    self.mode = "str"
                    i += len(QUOTE)
                elif not self.stack and c != "{":
                    self._fail("the arguments are not a {...}")
                elif c in "{[":
                    if len(self.stack) >= DEPTH_LIMIT:
                        self._fail("nested too deep")
                        break
                    self.stack.append(c)
                    out.append(c)
                    self.first = True
                    self.mode = "key" if c == "{" else "value"
                    i += 1
                elif c == "]" and self.stack[-1] == "[" and self.first:
                    self._close(c, out)
                    i += 1
                elif c in _ATOM:
                    self.token, self.mode = "", "atom"
                else:
                    self._fail("not a value")
            elif self.mode == "key":
                if c == "}" and self.first:
                    self._close(c, out)
                    i += 1
                elif buf.startswith(QUOTE, i):
                    self.token, self.mode = "", "kstr"
                    i += len(QUOTE)
                elif c in ",}":
                    self._fail("a member without a key")
                else:
                    self.token, self.mode = "", "bkey"
            elif self.mode == "colon":
                if c != ":":
                    self._fail("a key without a value")
                else:
                    self._member(out)
                    i += 1
            else:  # after a value
                if c == ",":
                    if self.stack[-1] == "[":
                        out.append(", ")
                        self.mode = "value"
                    else:
                        self.mode = "key"
                    i += 1
                elif c in "}]":
                    self._close(c, out)
                    i += 1
                else:
                    self._fail("no separator after a value")
        return i, "".join(out)


def partial_quote(tail: str) -> int:
    """How much of the end of ``tail`` may still become ``<|"|>``."""
    for k in range(min(len(QUOTE) - 1, len(tail)), 0, -1):
        if tail.endswith(QUOTE[:k]):
            return k
    return 0


def args_json(text: str) -> str | None:
    """The JSON text of arguments written as one Gemma dict (``{...}``), or None."""
    n, out = (conv := Notation()).feed(text.strip(), final=True)
    return out if conv.done and conv.error is None and not text.strip()[n:].strip() else None


# --- the parser ----------------------------------------------------------------------------------

class Gemma4(Enum):
    HEAD = "_s_head"  # after <|tool_call>: call:NAME up to {
    ARGS = "_s_args"  # the arguments, up to the } that closes them
    TAIL = "_s_tail"  # after the arguments: <tool_call|>


_NAME_BAD = " \t\r\n[](){}\"'<>=,;"


class Parser(JsonCalls):
    OPENERS = (TOOL_CALL,)
    STRAYS = (TOOL_CALL_END,)
    _conv: Notation  # the open call's arguments
    _read = 0  # the arguments' length so far

    def _opened(self, marker: str) -> None:
        self._open(Gemma4.HEAD)
        self._new_call()

    def _broken(self, error: str) -> None:
        self._junk(((TOOL_CALL_END, True), (TOOL_CALL, False)), error)
        self._after = Text.TEXT

    def _s_head(self, final: bool) -> bool:
        call = self._current
        r = read_name(self._buf, ("{",), final, bad=_NAME_BAD)
        if r == MORE:
            return False
        if not isinstance(r, tuple) or not r[0].removeprefix(CALL_PREFIX):
            self._broken("a malformed call")
            return True
        self._take(len(r[0]))
        self._name(call, r[0].removeprefix(CALL_PREFIX))
        if not call.error:
            self._begin(call)
        self._conv, self._read = Notation(), 0
        self._go(Gemma4.ARGS)
        return True

    def _s_args(self, final: bool) -> bool:
        conv = self._conv
        n, out = conv.feed(self._buf, final)
        self._read += len(self._take(n))
        self._args(self._current, out)
        if conv.error or self._read > ARGS_LIMIT:
            self._broken(f"the arguments are not Gemma's notation: {conv.error or 'too long'}")
            return True
        if conv.done:
            self._current.complete = True
            self._go(Gemma4.TAIL)
            return True
        if self._buf.startswith(_CUTS):
            self._end_call("the call was cut off")
            self._go(Text.TEXT)
            return True
        return n > 0

    def _s_tail(self, final: bool) -> bool:
        m = lead(self._buf.lstrip(" \t\r\n"), (TOOL_CALL_END,), final)
        if m == "":
            return False
        if m:
            self._take(self._buf.index(m) + len(m))
        self._end_call()
        self._go(Text.TEXT)
        return True
