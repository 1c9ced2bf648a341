"""nemotron_v2: ``<TOOLCALL>[{"name": N, "arguments": {...}}, ...]</TOOLCALL>``, a JSON array
of call objects between two markers (NVIDIA Nemotron Nano v2). ``ArrayParser`` reads any such
array block, its markers named by a subclass (apriel writes the same inside ``<tool_calls>``)."""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

from .gbnf import COMMA, WS, Grammar, Rules, json_call, repeat
from .interface import history_as_is
from .jsoncall import JsonCalls
from .scan import lead, until

TOOLCALL, TOOLCALL_END = "<TOOLCALL>", "</TOOLCALL>"
MARKERS = (TOOLCALL, TOOLCALL_END)
TOKEN = TOOLCALL
EXAMPLE = '<TOOLCALL>[{"name": <function-name>, "arguments": <args-json-object>}]</TOOLCALL>'


def shown_by(template: str) -> bool:
    return TOOLCALL in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def array_grammar(rules: Rules, tools: list[dict[str, Any]], opener: str, closer: str, *,
                  parallel: bool) -> str:
    """``opener [call, ...] closer`` for any of the tools."""
    calls = repeat(json_call(rules, tools, "arguments"), parallel, sep=COMMA)
    return f'"{opener}" {WS} "[" {WS} {calls} {WS} "]" {WS} "{closer}"'


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    return array_grammar(rules, tools, TOOLCALL, TOOLCALL_END, parallel=parallel), (r"<TOOLCALL>",)


history = history_as_is


class Array(Enum):
    START = "_s_a_start"  # after the opener: the array's [
    ITEMS = "_s_a_items"  # inside the array, between calls
    END = "_s_a_end"  # after the array's ]: the closer
    SKIP = "_s_a_skip"  # a block that is not an array of calls: its text, up to its closer


class ArrayParser(JsonCalls):
    """A block ``OPEN [call objects] CLOSE``; a block that holds no call is text. A subclass
    names its two markers in ``OPENERS`` and ``STRAYS``, and ``CLOSE`` is the latter."""

    CLOSE: ClassVar[str]
    BLOCKS = frozenset({Array.START, Array.ITEMS, Array.END, Array.SKIP})

    def _opened(self, marker: str) -> None:
        self._open(Array.START)

    def _s_a_start(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "[":
            self._take(1)
            self._go(Array.ITEMS)
        else:
            self._go(Array.SKIP)
        return True

    def _s_a_items(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        c = self._buf[0]
        if c == "{":
            return self._item(final)
        if c == "]":
            self._take(1)
            self._go(Array.END)
            return True
        return self._closer(final)

    def _item(self, final: bool) -> bool:
        """A call, from the ``{`` that begins it; here a call object."""
        self._new_call()
        self._json_call((self.CLOSE,), after=Array.ITEMS)
        return True

    def _s_a_end(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        return self._closer(final)

    def _closer(self, final: bool) -> bool:
        m = lead(self._buf, (self.CLOSE,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
            self._close_block()
        else:
            self._go(Array.SKIP)
        return True

    def _s_a_skip(self, final: bool) -> bool:
        text, marker = until(self._buf, (self.CLOSE, *self.OPENERS), final)
        self._take(len(text))
        if marker is None:
            return bool(text)
        if marker == self.CLOSE:
            self._take(len(marker))
        self._close_block()
        return True


class Parser(ArrayParser):
    OPENERS = (TOOLCALL,)
    STRAYS = (TOOLCALL_END,)
    CLOSE = TOOLCALL_END
