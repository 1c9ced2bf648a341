"""gigachat: GigaChat 3's call, one per answer, a JSON ``{"name": N, "arguments": {...}}`` in a
message of the ``function call`` role: ``<|message_sep|>\\n\\nfunction call<|role_sep|>\\n{...}``
(GigaChat 3), or after ``<|function_call|>`` (GigaChat 3.1); the text before it is content. No
closer: the call ends with its object."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from .gbnf import Grammar, Rules, json_call, lit
from .interface import history_as_is
from .jsoncall import JsonCalls

V3_OPEN = "<|message_sep|>\n\nfunction call<|role_sep|>\n"
V31_OPEN = "<|function_call|>"
MARKERS = ("<|message_sep|>", "<|role_sep|>", V31_OPEN)
TOKEN = None
EXAMPLE = '{"name": <function-name>, "arguments": <args-json-object>}'


def shown_by(template: str) -> bool:
    return "<|message_sep|>" in template and "<|role_sep|>" in template


def example(chat_template: str | None) -> str:
    return (V31_OPEN if chat_template and V31_OPEN in chat_template else V3_OPEN) + EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """One call (as llama.cpp: GigaChat does not write several), after either model's opener."""
    call = rules.rule("tool-call", f'({lit(V3_OPEN)} | {lit(V31_OPEN)}) {json_call(rules, tools, "arguments")}')
    return call, (re.escape(V3_OPEN), re.escape(V31_OPEN))


history = history_as_is


class Giga(Enum):
    CALL = "_s_call"  # after an opener: the call's object, once


class Parser(JsonCalls):
    OPENERS = (V3_OPEN, V31_OPEN)
    BLOCKS = frozenset({Giga.CALL})

    def _opened(self, marker: str) -> None:
        self._open(Giga.CALL)

    def _s_call(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf.startswith("{") and not self._block_calls:
            self._new_call()
            self._json_call(self.OPENERS, after=Giga.CALL)
            return True
        self._close_block()  # what follows the call (or an opener without one) is text
        return True
