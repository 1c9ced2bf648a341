"""command_r_plus: Command R+ (its ``tool_use`` template) writes its calls as one JSON list in a
fenced block after the word ``Action:``::

    Action:
    ```json
    [
        {"tool_name": "N", "parameters": {...}}, ...
    ]```

The call objects are Command R7B's (``command_r.CallObjects`` reads them: a call starts once its
``tool_name`` is read, and its arguments stream as they come); the frame is not, and
neither is its grammar's trigger, so it is a format of its own. Its answer's text is wrapped in
``<|CHATBOT_TOKEN|>...<|END_OF_TURN_TOKEN|>``: both are dropped, tools or not (``FRAMES``), as
llama.cpp's parser of the template does. ``Action:`` not followed by a fence or a list is text.
The template lists the tools and renders calls and results."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

from .command_r import CallObjects
from .gbnf import WS, Grammar, Rules, lit, repeat
from .interface import history_as_is
from .machine import Text
from .scan import lead

ACTION, FENCE, LANG = "Action:", "```", "json"
CHATBOT, END_OF_TURN = "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
MARKERS = (CHATBOT, END_OF_TURN)
TOKEN = None  # "Action:" is words, not a token: the template decides
EXAMPLE = 'Action:\n```json\n[\n    {"tool_name": <function-name>, "parameters": <args-json-object>}\n]```'


def shown_by(template: str) -> bool:
    # Command R7B's templates say "Action:" too, but open their list with <|START_ACTION|>
    return f"{ACTION}\\n{FENCE}{LANG}" in template and "tool_name" in template and "<|START_ACTION|>" not in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


# the template writes each call over lines, its keys indented by eight spaces
PAD = '[ \\t\\n]{0,16}'


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = []
    for i, tool in enumerate(tools):
        name = json.dumps(tool["function"]["name"])
        alts.append(f'{lit(name)} {WS} "," {PAD} "\\"parameters\\"" {WS} ":" {WS} {rules.args(tool, i)}')
    call = rules.rule("tool-call", f'"{{" {PAD} "\\"tool_name\\"" {WS} ":" {WS} ({" | ".join(alts)}) {PAD} "}}"')
    calls = repeat(call, parallel, f'{WS} "," {PAD}')
    root = f'{lit(ACTION)} {WS} {lit(FENCE + LANG)} {WS} "[" {PAD} {calls} {PAD} "]" {WS} {lit(FENCE)}'
    # "Action:" in prose is words: only the fence after it opens the grammar
    return root, (re.escape(ACTION) + WS + re.escape(FENCE),)


history = history_as_is


class Plus(Enum):
    FENCE = "_s_fence"  # after Action: the fence's ``` (or the list itself)
    LANG = "_s_lang"  # after ```: its json
    LIST = "_s_list"  # the list's [
    ITEMS = "_s_items"  # inside the list, between calls
    CALL = "_s_call"  # one call's object, up to its closing }
    TAIL = "_s_tail"  # after the list's ]: the closing ```


class Parser(CallObjects):
    OPENERS = (ACTION,)
    STRAYS = (CHATBOT, END_OF_TURN)
    BLOCKS = frozenset({Plus.ITEMS, Plus.TAIL})
    LEADS = frozenset({Plus.FENCE, Plus.LANG, Plus.LIST})  # no list yet: the words are text
    FRAMES = True
    ITEMS = Plus.ITEMS
    CLOSERS = (FENCE, END_OF_TURN)

    def _opened(self, marker: str) -> None:
        self._open(Plus.FENCE)

    def _not_a_call(self) -> None:
        """``Action:`` and what followed it so far are text."""
        self._content(self._group)
        self._group = ""
        self._go(Text.TEXT)

    def _s_fence(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (FENCE,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
            self._go(Plus.LANG)
        else:
            self._go(Plus.LIST)
        return True

    def _s_lang(self, final: bool) -> bool:
        m = lead(self._buf, (LANG,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
        self._go(Plus.LIST)
        return True

    def _s_list(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        c = self._buf[0]
        if c == "[":
            self._take(1)
            self._go(Plus.ITEMS)
        elif c == "{":  # one call, not in a list
            self._go(Plus.ITEMS)
        else:
            self._not_a_call()
        return True

    def _s_items(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        c = self._buf[0]
        if c == "{":
            self._call_object(Plus.CALL)
        elif c == "]":
            self._take(1)
            self._go(Plus.TAIL)
        else:  # the list ends here (or its one call did): its closing fence, if any, then text
            self._go(Plus.TAIL)
        return True

    def _s_tail(self, final: bool) -> bool:
        return self._end_block(FENCE, final)
