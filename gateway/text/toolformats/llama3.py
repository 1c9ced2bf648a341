"""llama3: Llama 3.1-3.3's ``{"name": N, "parameters": {...}}`` (``"arguments"`` is read too),
with or without a leading ``<|python_tag|>``. Without the tag a call is read only at the start
of the answer or right after another call (separated by spaces or ``;``), as llama.cpp does,
so an answer that merely contains JSON stays content. It ends with the JSON (``<|eom_id|>`` /
``<|eot_id|>`` end the answer and are dropped)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from .gbnf import SEMICOLON, WS, Grammar, Rules, json_call, repeat
from .hermes import shown_by as hermes_shown_by
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import lead
from .xmlcall import FUNCTION

PYTHON_TAG, EOM, EOT = "<|python_tag|>", "<|eom_id|>", "<|eot_id|>"
MARKERS = (PYTHON_TAG, EOM)
TOKEN = PYTHON_TAG
EXAMPLE = '{"name": <function-name>, "parameters": <args-json-object>}'


def shown_by(template: str) -> bool:
    """Llama 3's ipython role, unless the template writes hermes' calls (Hermes fine-tunes of
    Llama 3 keep the role)."""
    return ("<|start_header_id|>ipython<|end_header_id|>" in template and FUNCTION not in template
            and not hermes_shown_by(template))


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    calls = repeat(json_call(rules, tools, "parameters"), parallel, sep=SEMICOLON)
    return f'"<|python_tag|>"? {WS} {calls}', (r"<\|python_tag\|>", r'^\s*(\{\s*"name")[\s\S]*$')


history = history_as_is


class Llama3(Enum):
    START = "_s_start"  # at the start of the answer or right after a call: a JSON call may come
    TAG = "_s_tag"  # after <|python_tag|>


_ENDS = (EOM, EOT, PYTHON_TAG)


class Parser(JsonCalls):
    OPENERS = (PYTHON_TAG,)
    STRAYS = (EOM, EOT)
    START = Llama3.START
    BLOCKS = frozenset({Llama3.TAG})
    LEADS = frozenset({Llama3.START})

    def _opened(self, marker: str) -> None:
        self._open(Llama3.TAG)

    def _s_start(self, final: bool) -> bool:
        if self._skip_ws(";" if self._drop_ws else ""):
            return True
        m = lead(self._buf, (PYTHON_TAG,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
            self._open(Llama3.TAG)
            return True
        if self._buf[0] == "{":
            self._new_call()
            self._json_call(_ENDS, after=Llama3.START, strict=True)
            return True
        self._content(self._group)
        self._group = ""
        self._go(Text.TEXT)
        return True

    def _s_tag(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        self._new_call()
        if self._buf[0] == "{":
            self._json_call(_ENDS, after=Llama3.START)
        else:  # a built-in tool's call (python, brave_search, ...): not one of the request's tools
            self._junk(((EOM, True), (EOT, True), (PYTHON_TAG, False)), "not a JSON call")
            self._after = Llama3.START
        return True
