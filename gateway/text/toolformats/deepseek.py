"""deepseek: DeepSeek V3 / R1 and the R1 distills write
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>N\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
(more calls, then ``<｜tool▁calls▁end｜>``), V3.1 ``<｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``;
the two are told apart by what follows ``<｜tool▁sep｜>``. Their templates render calls but never
list the tools (``describes_tools`` is False), so the caller describes them too."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from .gbnf import Grammar, Rules, lit, repeat
from .interface import history_as_is
from .jsoncall import Json, JsonCalls
from .scan import BAD, MORE, WS, lead, read_name

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
# spellings of the block opener that DeepSeek models are known to write (llama.cpp accepts them too)
CALLS_BEGIN_VARIANTS = (CALLS_BEGIN, "<｜tool_calls_begin｜>", "<｜tool calls begin｜>",
                        "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>")
CALLS_END, CALL_BEGIN = "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>"
CALL_END, SEP = "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)
TOKEN = CALLS_BEGIN
EXAMPLE = f"{CALLS_BEGIN}{CALL_BEGIN}<function-name>{SEP}<args-json-object>{CALL_END}{CALLS_END}"
EXAMPLE_R1 = (f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}<function-name>\n```json\n<args-json-object>\n```"
              f"{CALL_END}{CALLS_END}")


def shown_by(template: str) -> bool:
    return "dsml_token" not in template and ("tool▁calls▁begin" in template or "tool▁call▁begin" in template)


def example(chat_template: str | None) -> str:
    """The template tells R1's fenced shape from V3.1's."""
    return EXAMPLE_R1 if chat_template and "```json" in chat_template else EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """Either shape: the model takes the one it was trained on."""
    alts = []
    for i, t in enumerate(tools):
        n, args = lit(t["function"]["name"]), rules.args(t, i)
        alts.append(f'"function" {lit(SEP)} {n} "\\n```json\\n" {args} "\\n```"')  # R1, V3
        alts.append(f'{n} {lit(SEP)} {args}')  # V3.1 and later
    one = rules.rule("tool-call", f'{lit(CALL_BEGIN)} ({" | ".join(alts)}) {lit(CALL_END)}')
    return f'"{CALLS_BEGIN}" {repeat(one, parallel)} "{CALLS_END}"', (r"<｜tool▁calls▁begin｜>",)


history = history_as_is


class DeepSeek(Enum):
    BLOCK = "_s_block"  # inside the block, between calls
    HEAD = "_s_head"  # after <｜tool▁call▁begin｜>: up to <｜tool▁sep｜>
    SEP = "_s_sep"  # after <｜tool▁sep｜>: V3.1's arguments, or R1's name
    NAME = "_s_name"  # R1: the name
    FENCE = "_s_fence"  # R1: the opening fence


_ENDS = (CALL_END, CALLS_END, CALL_BEGIN)
_JUNK = ((CALL_END, True), (CALLS_END, False), (CALL_BEGIN, False))


class Parser(JsonCalls):
    OPENERS = (*CALLS_BEGIN_VARIANTS, CALL_BEGIN)
    STRAYS = (CALLS_END, CALL_END, SEP)
    BLOCKS = frozenset({DeepSeek.BLOCK})
    _head = ""  # the text before <｜tool▁sep｜>: V3.1's name, or R1's call type

    def _opened(self, marker: str) -> None:
        if marker == CALL_BEGIN:
            self._open(DeepSeek.HEAD)
            self._new_call()
        else:
            self._open(DeepSeek.BLOCK)

    def _arguments(self) -> None:
        self._args_only(_ENDS, after=DeepSeek.BLOCK, end_at_json=False, tail=Json.TO_CLOSER)

    def _broken(self) -> None:
        self._junk(_JUNK, "a malformed call")
        self._after = DeepSeek.BLOCK

    def _s_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (CALL_BEGIN, CALLS_END), final)
        if m == "":
            return False
        if m == CALL_BEGIN:
            self._take(len(m))
            self._new_call()
            self._go(DeepSeek.HEAD)
        else:
            if m:
                self._take(len(m))
            self._close_block()
        return True

    def _s_head(self, final: bool) -> bool:
        r = read_name(self._buf, (SEP,), final, bad="{}<>\"")
        if r == MORE:
            return False
        if r == BAD:
            self._broken()
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        self._head = r[0]
        self._go(DeepSeek.SEP)
        return True

    def _s_sep(self, final: bool) -> bool:
        if self._buf.lstrip(WS).startswith("{"):  # V3.1: NAME<｜tool▁sep｜>{...}
            self._name(self._current, self._head.strip())
            self._arguments()
            return True
        if not self._buf.strip(WS) and not final:
            return False
        self._go(DeepSeek.NAME)  # R1: TYPE<｜tool▁sep｜>NAME\n```json\n{...}\n```
        return True

    def _s_name(self, final: bool) -> bool:
        r = read_name(self._buf, ("\n", "`", "{"), final, bad="<>\"")
        if r == MORE:
            return False
        if r == BAD:
            self._broken()
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]))
        self._name(self._current, r[0].strip())
        self._go(DeepSeek.FENCE)
        return True

    def _s_fence(self, final: bool) -> bool:
        fence = re.match(r"\s*(?:```(?:json)?)?\s*", self._buf)
        assert fence is not None
        rest = self._buf[fence.end():]
        if rest.startswith("{"):
            self._take(fence.end())
            self._arguments()
            return True
        if not final and (not rest or "```json".startswith(rest) or "json".startswith(rest)):
            return False
        self._junk(_JUNK, "the arguments are not an object")
        self._after = DeepSeek.BLOCK
        return True
