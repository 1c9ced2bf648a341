"""glm: ``<tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`` (GLM 4.5 / 4.6 /
4.7; GLM 4.6 puts a newline after the name and around each pair, 4.7 none). Spark 2.5, Ling 3.0
and Laguna write the same syntax. A call with no arguments is ``<tool_call>N</tool_call>``. Each
value is typed by the tool's schema as llama.cpp does (``scan.typed``: a string-only parameter
stays text, any other is JSON where it parses as one of the schema's types)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, parameters, repeat, until
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import BAD, MORE, escape, lead, read_name, schema_types, typed
from .scan import until as scan_until

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
ARG_KEY, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE, ARG_VALUE_END = "<arg_value>", "</arg_value>"
MARKERS = (TOOL_CALL, TOOL_CALL_END, ARG_KEY, ARG_KEY_END, ARG_VALUE, ARG_VALUE_END)
TOKEN = None  # <tool_call> alone is hermes'
EXAMPLE = ("<tool_call>example_function_name\n<arg_key>example_parameter</arg_key>\n<arg_value>value</arg_value>\n"
           "</tool_call>")


def shown_by(template: str) -> bool:
    return TOOL_CALL in template and ARG_KEY in template and ARG_VALUE in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """A string argument (or one whose schema allows any value) is raw text up to
    ``</arg_value>``; any other is JSON of its schema."""
    text = rules.rule("arg-text", until(ARG_VALUE_END))
    def item(pname: str, value: str, raw: bool) -> str:
        return f'{lit(ARG_KEY)} {lit(pname)} {lit(ARG_KEY_END)} {WS} {lit(ARG_VALUE)} {value} {lit(ARG_VALUE_END)} {WS}'

    alts = [f'{lit(name)} {WS} {body}' for name, body in parameters(rules, tools, text, item)]
    call = rules.rule("tool-call", f'{lit(TOOL_CALL)} ({" | ".join(alts)}) {lit(TOOL_CALL_END)}')
    return repeat(call, parallel), (TOOL_CALL,)


history = history_as_is


class Glm(Enum):
    NAME = "_s_name"  # after <tool_call>: the name, up to the first <arg_key> or </tool_call>
    ARGS = "_s_args"  # between arguments
    KEY = "_s_key"  # after <arg_key>: the key up to </arg_key>
    VALUE_OPEN = "_s_value_open"  # after </arg_key>: whitespace, then <arg_value>
    VALUE = "_s_value"  # a value up to </arg_value>


_JUNK = ((TOOL_CALL_END, True), (TOOL_CALL, False))


class Parser(JsonCalls):
    OPENERS = (TOOL_CALL,)
    STRAYS = (TOOL_CALL_END,)
    _count = 0  # arguments read in the call
    _key = ""
    _types: set[str] | None = None

    def _opened(self, marker: str) -> None:
        self._open(Glm.NAME)
        self._new_call()

    def _broken(self, error: str) -> None:
        self._junk(_JUNK, error)
        self._after = Text.TEXT

    def _s_name(self, final: bool) -> bool:
        r = read_name(self._buf, (ARG_KEY, TOOL_CALL_END), final, bad="{}<>\"")
        if r == MORE:
            return False
        if r == BAD or not isinstance(r, tuple) or not r[0].strip():
            self._broken("a malformed call")
            return True
        call = self._current
        self._take(len(r[0]))
        self._name(call, r[0].strip())
        if call.error:
            self._broken(call.error)
            return True
        self._begin(call)
        self._count = 0
        self._go(Glm.ARGS)
        return True

    def _s_args(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (ARG_KEY, TOOL_CALL_END), final)
        if m == "":
            return False
        call = self._current
        if m == ARG_KEY:
            self._take(len(m))
            self._go(Glm.KEY)
        elif m == TOOL_CALL_END:
            self._take(len(m))
            self._args(call, "}" if self._count else "{}")
            self._end_call()
            self._go(Text.TEXT)
        else:
            self._broken("not an argument")
        return True

    def _s_key(self, final: bool) -> bool:
        r = read_name(self._buf, (ARG_KEY_END,), final, bad="<>")
        if r == MORE:
            return False
        if r == BAD or not isinstance(r, tuple):
            self._broken("a malformed argument name")
            return True
        self._take(len(r[0]) + len(r[1]))
        self._key = r[0].strip()
        schema = self.params.get(self._current.name or "", {}).get("properties")
        self._types = schema_types(schema.get(self._key)) if isinstance(schema, dict) else None
        self._go(Glm.VALUE_OPEN)
        return True

    def _s_value_open(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (ARG_VALUE,), final)
        if m == "":
            return False
        if m is None:
            self._broken("an argument without a value")
            return True
        self._take(len(m))
        call = self._current
        prefix = ("{" if not self._count else ", ") + json.dumps(self._key, ensure_ascii=False) + ": "
        self._count += 1
        if self._types == {"string"}:  # text: it streams as it comes
            self._args(call, prefix + '"')
        else:
            self._group_value = prefix
        self._value = ""
        self._go(Glm.VALUE)
        return True

    _group_value = ""  # the key's JSON text, written before a typed value once it is whole
    _value = ""

    def _s_value(self, final: bool) -> bool:
        text, marker = scan_until(self._buf, (ARG_VALUE_END,), final)  # a value ends only at its closer
        n = len(self._take(len(text)))
        call = self._current
        if self._types == {"string"}:
            self._args(call, escape(text))
        else:
            self._value += text
        if marker is None:
            return n > 0
        self._take(len(marker))
        if self._types == {"string"}:
            self._args(call, '"')
        else:
            self._args(call, self._group_value + typed(self._value, self._types))
        self._go(Glm.ARGS)
        return True
