"""functionary_v31: ``<function=N>{...}</function>``, the arguments a JSON object right after
the name, one call after another (Functionary medium v3.1, on Llama 3.1's template). Unlike
qwen3_coder's ``<function=N>``, no ``<parameter=`` follows the name."""

from __future__ import annotations

from enum import Enum
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, repeat
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import BAD, MORE, lead, read_name
from .xmlcall import FUNCTION, FUNCTION_END, PARAMETER

EOM, EOT = "<|eom_id|>", "<|eot_id|>"
MARKERS = ()
TOKEN = None
EXAMPLE = '<function=example_function_name>{"example_name": "example_value"}</function>'


def shown_by(template: str) -> bool:
    return FUNCTION in template and FUNCTION_END in template and PARAMETER not in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = " | ".join(f'{lit(t["function"]["name"])} ">" {rules.args(t, i)}' for i, t in enumerate(tools))
    call = rules.rule("tool-call", f'"{FUNCTION}" ({alts}) "{FUNCTION_END}"')
    return repeat(call, parallel, sep=WS), (r"<function=",)


history = history_as_is


class Functionary(Enum):
    NAME = "_s_name"  # after <function=: the name up to >
    ARGS = "_s_args"  # after the name: the arguments object
    TAIL = "_s_tail"  # after the arguments: </function>, or the call ends without it


class Parser(JsonCalls):
    OPENERS = (FUNCTION,)
    STRAYS = (FUNCTION_END, EOM, EOT)

    def _opened(self, marker: str) -> None:
        self._open(Functionary.NAME)
        self._new_call()

    def _s_name(self, final: bool) -> bool:
        call = self._current
        r = read_name(self._buf, (">",), final, bad="\n<{}\"")
        if r == MORE:
            return False
        if r == BAD:
            self._junk(((FUNCTION_END, True), (FUNCTION, False)), "a malformed function name")
            self._after = Text.TEXT
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + 1)
        self._name(call, r[0].strip())
        self._go(Functionary.ARGS)
        return True

    def _s_args(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "{":
            self._args_only((FUNCTION_END, FUNCTION), after=Text.TEXT, end_at_json=False, tail=Functionary.TAIL)
        else:
            self._junk(((FUNCTION_END, True), (FUNCTION, False)), "the arguments are not an object")
            self._after = Text.TEXT
        return True

    def _s_tail(self, final: bool) -> bool:
        m = lead(self._buf, (FUNCTION_END,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
        self._end_call()
        self._go(Text.TEXT)
        return True
