"""hermes: ``<tool_call>{"name": N, "arguments": {...}}</tool_call>``, several per answer
(Hermes 2 Pro / 3, Qwen 2.5, Qwen 3, QwQ, MiMo-VL, Granite 4, Bielik, Reka Edge). Inside
``<tool_call>`` a Qwen3-Coder function (``<function=N>...``) is read too, as qwen3_coder reads
this JSON object: models of one family write either."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from .gbnf import WS, Grammar, Rules, json_call, repeat
from .interface import history_as_is
from .xmlcall import FUNCTION, Block, Invokes

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
MARKERS = (TOOL_CALL, TOOL_CALL_END)
TOKEN = TOOL_CALL
EXAMPLE = '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'

_ARGUMENTS_KEY = re.compile(r'\\?"arguments\\?"')
# other syntaxes inside <tool_call> (GLM, MiniMax, Kimi): not this format
_OTHERS = ("<arg_key>", "<invoke name=", "<tool_calls>")


def shown_by(template: str) -> bool:
    return TOOL_CALL in template and bool(_ARGUMENTS_KEY.search(template)) and not any(m in template for m in _OTHERS)


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    one = rules.rule("tool-call", f'"<tool_call>" {WS} {json_call(rules, tools, "arguments")} {WS} "</tool_call>"')
    return repeat(one, parallel), (r"<tool_call>",)


history = history_as_is


class Parser(Invokes):
    OPENERS: ClassVar[tuple[str, ...]] = (TOOL_CALL,)
    STRAYS = (TOOL_CALL_END,)
    BEGIN, END, OPEN = TOOL_CALL, TOOL_CALL_END, FUNCTION
    FUNCTION_BLOCK = (TOOL_CALL, TOOL_CALL_END)

    def _s_block(self, final: bool) -> bool:
        """A call as a JSON object too, and a closer the answer ended inside of."""
        if self._skip_ws():
            return True
        if self._buf[0] == "{":
            self._new_call()
            self._json_call((TOOL_CALL_END, TOOL_CALL), after=Block.BLOCK)
            return True
        if final and TOOL_CALL_END.startswith(self._buf):
            # the answer ended inside the closer (max_tokens): the calls before it stand, and the
            # closer's beginning is neither text nor a failed call
            self._take(len(self._buf))
            self._close_block()
            return True
        return super()._s_block(final)
