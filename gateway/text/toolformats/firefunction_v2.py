"""firefunction_v2: FireFunction v2 (on Llama 3's template) writes its calls as one JSON list
after the word ``functools``, with no closing marker::

    functools[{"name": "N", "arguments": {...}}, ...]

read as nemotron_v2's array of call objects (the arguments stream as they come). ``functools``
is a word, not a token, and a Python answer may well say it: only ``functools`` then ``[``
then a ``{`` opens calls, anything else is text. The list ends at its ``]`` (or where a call
is followed by anything but another one); what follows is text. The template does not list the
tools (it reads a ``functions`` text no caller gives): the gateway describes them in a system
message; it renders calls and results itself."""

from __future__ import annotations

from enum import Enum
from typing import Any

from .gbnf import COMMA, WS, Grammar, Rules, json_call, repeat
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import lead

FUNCTOOLS = "functools"
EOT, EOM = "<|eot_id|>", "<|eom_id|>"  # Llama 3's ends, where a worker renders them
MARKERS = ()
TOKEN = None
EXAMPLE = 'functools[{"name": <function-name>, "arguments": <args-json-object>}]'


def shown_by(template: str) -> bool:
    return f"{FUNCTOOLS}[" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    calls = repeat(json_call(rules, tools, "arguments"), parallel, sep=COMMA)
    return f'"{FUNCTOOLS}" {WS} "[" {WS} {calls} {WS} "]"', (FUNCTOOLS + WS + r"\[",)


history = history_as_is


class Fire(Enum):
    OPEN = "_s_open"  # after functools: the list's [
    FIRST = "_s_first"  # after [: the first call's {
    ITEMS = "_s_items"  # after a call: another one, or the list's end


class Parser(JsonCalls):
    OPENERS = (FUNCTOOLS,)
    STRAYS = (EOT, EOM)
    LEADS = frozenset({Fire.OPEN, Fire.FIRST})  # no call begun: the words are text

    def _opened(self, marker: str) -> None:
        self._open(Fire.OPEN)

    def _not_a_call(self) -> None:
        self._content(self._group)
        self._group = ""
        self._go(Text.TEXT)

    def _s_open(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "[":
            self._take(1)
            self._go(Fire.FIRST)
        else:
            self._not_a_call()
        return True

    def _s_first(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "{":
            self._next_call()
        else:
            self._not_a_call()
        return True

    def _next_call(self) -> None:
        self._new_call()
        self._json_call((EOT, EOM), after=Fire.ITEMS)

    def _s_items(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        m = lead(self._buf, ("{", "]"), final)
        if m == "{":
            self._next_call()
            return True
        if m == "]":
            self._take(1)
        self._close_block()
        return True
