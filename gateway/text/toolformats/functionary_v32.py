"""functionary_v32: Functionary medium v3.2's recipients: each part of the answer begins with
``>>>RECIPIENT\\n``, ``all`` for text to the user (``>>>all\\nTEXT``) and a function's name for
a call (``>>>N\\n{...}``, the arguments a JSON object). The prompt ends with ``>>>``, so the
answer's first part starts right at its recipient. A recipient that is neither ``all`` nor one
of the tools is text, as written."""

from __future__ import annotations

from enum import Enum
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, repeat
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import BAD, MORE, read_name

PART = ">>>"
ALL = "all"
MARKERS = (">>>all",)
TOKEN = None
EXAMPLE = '>>>example_function_name\n{"example_name": "example_value"}'


def shown_by(template: str) -> bool:
    return ">>>all" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """The first call's ``>>>`` is the prompt's; later ones write their own."""
    alts = " | ".join(f'{lit(t["function"]["name"])} "\\n" {rules.args(t, i)}' for i, t in enumerate(tools))
    call = rules.rule("tool-call", f"({alts})")
    return f'"{PART}"? {repeat(call, parallel, sep=f"{WS} {lit(PART)}")}', (r">>>(?!all)",)


history = history_as_is


class Part(Enum):
    RECIPIENT = "_s_recipient"  # after >>>: the recipient up to its newline
    ARGS = "_s_args"  # after a function's name: its arguments object


class Parser(JsonCalls):
    OPENERS = (PART,)
    LEADS = frozenset({Part.RECIPIENT})
    FRAMES = True  # text too goes to a recipient (>>>all)

    def __init__(self, tools: Any = None, *, stream: bool = True, prompt_tail: str = ""):
        super().__init__(tools, stream=stream, prompt_tail=prompt_tail)
        if prompt_tail.endswith(PART):  # the answer begins with its first recipient
            self._go(Part.RECIPIENT)

    def _opened(self, marker: str) -> None:
        self._open(Part.RECIPIENT)

    def _s_recipient(self, final: bool) -> bool:
        r = read_name(self._buf, ("\n",), final, bad=" \t<>{}[]\"")
        if r == MORE:
            return False
        if r == BAD or (isinstance(r, tuple) and r[0] != ALL and r[0] not in self.params):
            self._content(self._group)  # not a recipient: text
            self._group = ""
            self._go(Text.TEXT)
            return True
        assert isinstance(r, tuple)
        if r[0] == ALL:
            self._take(len(r[0]) + 1)
            self._group = ""
            self._go(Text.TEXT)
            return True
        call = self._new_call()
        self._take(len(r[0]) + 1)
        self._name(call, r[0])
        self._go(Part.ARGS)
        return True

    def _s_args(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "{":
            self._args_only((PART,), after=Text.TEXT)
        else:
            self._junk(((PART, False),), "the arguments are not an object")
            self._after = Text.TEXT
        return True
