"""kimi: Kimi K2 / K2-Instruct / K2-Thinking write
``<|tool_calls_section_begin|><|tool_call_begin|>functions.N:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``
(more calls, then ``<|tool_calls_section_end|>``); the call's id is ``functions.NAME:INDEX``.
As llama.cpp reads them, the section markers and ``<|tool_call_end|>`` may be left out: a bare
``<|tool_call_begin|>`` opens a call, and a call ends with its arguments object. Thinking is
``<think>`` (``reasoning``); K2-Thinking may write its calls before closing it."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, repeat
from .interface import Messages, Tools
from .jsoncall import Json, JsonCalls
from .scan import BAD, MORE, lead, read_name

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGS_BEGIN, CALL_END)
TOKEN = SECTION_BEGIN
EXAMPLE = f"{SECTION_BEGIN}{CALL_BEGIN}functions.<function-name>:0{ARGS_BEGIN}<args-json-object>{CALL_END}{SECTION_END}"


def shown_by(template: str) -> bool:
    return SECTION_BEGIN in template and CALL_BEGIN in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = [f'"functions." {lit(t["function"]["name"])} ":" [0-9]{{1,4}} {lit(ARGS_BEGIN)} {rules.args(t, i)}'
            for i, t in enumerate(tools)]
    one = rules.rule("tool-call", f'{lit(CALL_BEGIN)} ({" | ".join(alts)}) {lit(CALL_END)}')
    return (f'{lit(SECTION_BEGIN)}? {WS} {repeat(one, parallel)} {WS} {lit(SECTION_END)}?',
            (re.escape(SECTION_BEGIN), re.escape(CALL_BEGIN)))


def history(messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
    """Calls get the ids Kimi writes, ``functions.NAME:INDEX`` (the index within their message, as
    the K2 template numbers them; later templates number them themselves), and results the id of
    their call, so a template that writes a result's ``tool_call_id`` names the call it wrote."""
    ids: dict[str, str] = {}
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list) and calls:
            renamed = []
            for i, c in enumerate(calls):
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(c.get("id"), str):
                    ids[c["id"]] = f"functions.{fn.get('name')}:{i}"
                    c = dict(c, id=ids[c["id"]])
                renamed.append(c)
            m = dict(m, tool_calls=renamed)
        elif m.get("tool_call_id") in ids:
            m = dict(m, tool_call_id=ids[m["tool_call_id"]])
        out.append(m)
    return out, tools


class Kimi(Enum):
    BLOCK = "_s_block"  # inside the section (or after a bare call), between calls
    HEAD = "_s_head"  # after <|tool_call_begin|>: the id up to <|tool_call_argument_begin|>


_ENDS = (CALL_END, SECTION_END, CALL_BEGIN, SECTION_BEGIN)
_JUNK = ((CALL_END, True), (SECTION_END, False), (CALL_BEGIN, False), (SECTION_BEGIN, False))
_ID = re.compile(r"\s*(?:functions\.)?(.+?)(?::\d+)?\s*")


class Parser(JsonCalls):
    OPENERS = (SECTION_BEGIN, CALL_BEGIN)
    STRAYS = (SECTION_END, CALL_END, ARGS_BEGIN)
    BLOCKS = frozenset({Kimi.BLOCK})

    def _opened(self, marker: str) -> None:
        self._open(Kimi.BLOCK)
        if marker == CALL_BEGIN:
            self._new_call()
            self._go(Kimi.HEAD)

    def _s_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (CALL_BEGIN, SECTION_END, SECTION_BEGIN), final)
        if m == "":
            return False
        if m == CALL_BEGIN:
            self._take(len(m))
            self._new_call()
            self._go(Kimi.HEAD)
        elif m == SECTION_BEGIN:  # a new section: this one is over
            self._close_block()
        else:
            if m:
                self._take(len(m))
            self._close_block()
        return True

    def _s_head(self, final: bool) -> bool:
        r = read_name(self._buf, (ARGS_BEGIN,), final, bad="{}<>\"")
        if r == MORE:
            return False
        if r == BAD:
            self._junk(_JUNK, "a malformed call")
            self._after = Kimi.BLOCK
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        m = _ID.fullmatch(r[0])
        self._name(self._current, m.group(1) if m else r[0].strip())
        self._args_only(_ENDS, after=Kimi.BLOCK, end_at_json=False, tail=Json.TO_CLOSER)
        return True
