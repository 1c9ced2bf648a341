"""apertus: ``<|tools_prefix|>[{"N": {...}}, ...]<|tools_suffix|>``, a JSON array of objects
each keyed by the function's name, its value the arguments (Swiss AI Apertus). The block is
read as nemotron_v2's array; only its items differ."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

from .gbnf import COMMA, WS, Grammar, Rules, lit, repeat
from .interface import history_as_is
from .nemotron_v2 import Array, ArrayParser
from .scan import HEAD_LIMIT

TOOLS_PREFIX, TOOLS_SUFFIX = "<|tools_prefix|>", "<|tools_suffix|>"
MARKERS = (TOOLS_PREFIX, TOOLS_SUFFIX)
TOKEN = TOOLS_PREFIX
EXAMPLE = '<|tools_prefix|>[{"<function-name>": <args-json-object>}]<|tools_suffix|>'


def shown_by(template: str) -> bool:
    return TOOLS_PREFIX in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = " | ".join(f'"{{" {WS} {lit(json_name(t))} {WS} ":" {WS} {rules.args(t, i)} {WS} "}}"'
                      for i, t in enumerate(tools))
    call = rules.rule("tool-call", f"({alts})")
    calls = repeat(call, parallel, sep=COMMA)
    return f'"{TOOLS_PREFIX}" {WS} "[" {WS} {calls} {WS} "]" {WS} "{TOOLS_SUFFIX}"', (re.escape(TOOLS_PREFIX),)


def json_name(tool: dict[str, Any]) -> str:
    """The tool's name as a JSON string (the key it is called by)."""
    return json.dumps(tool["function"]["name"], ensure_ascii=False)


history = history_as_is

_KEY = re.compile(r'\{\s*"((?:[^"\\\n]|\\.)*)"\s*:\s*')
_KEY_SO_FAR = re.compile(r'\{\s*(?:"(?:[^"\\\n]|\\.)*(?:\\|"\s*)?)?')  # what may still become _KEY


class Apertus(Enum):
    ITEM_END = "_s_item_end"  # after a call's arguments: the item's closing }


class Parser(ArrayParser):
    OPENERS = (TOOLS_PREFIX,)
    STRAYS = (TOOLS_SUFFIX,)
    CLOSE = TOOLS_SUFFIX

    def _item(self, final: bool) -> bool:
        m = _KEY.match(self._buf)
        if m is None:
            if not final and len(self._buf) < HEAD_LIMIT and _KEY_SO_FAR.fullmatch(self._buf):
                return False
            self._new_call()
            self._junk(((self.CLOSE, False),), "not a call")
            self._after = Array.ITEMS
            return True
        call = self._new_call()
        self._take(m.end())
        try:
            name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            name = m.group(1)
        self._name(call, name)
        self._args_only((self.CLOSE,), after=Array.ITEMS, end_at_json=False, tail=Apertus.ITEM_END)
        return True

    def _s_item_end(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "}":
            self._take(1)
        self._end_call()
        self._go(Array.ITEMS)
        return True
