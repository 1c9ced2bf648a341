"""harmony: gpt-oss's ``<|channel|>commentary to=functions.N <|constrain|>json<|message|>{...}<|call|>``,
the recipient also accepted in the role header (``<|start|>assistant to=functions.N<|channel|>...``)
and on the analysis channel.

gpt-oss's calls travel as messages whose header names a recipient, so message framing belongs
to ``reasoning.ReasoningSplitter``: with ``calls=True`` it yields ``("recipient", NAME)`` when
such a message's body begins and ``("call", text)`` for the body; the body ends at the next
segment of another kind, or at the end. This parser runs that splitter itself on the raw
answer (pass the prompt's tail, ``<|start|>assistant``, as ``prompt_tail``): analysis messages
come out as ``Piece("thinking", text)``, final and preamble messages as content, and a failed
call's body (the header is gone) as content. A call ends with its JSON object; anything after
it in the same message is dropped."""

from __future__ import annotations

from typing import Any

from ..reasoning import CALL, RECIPIENT
from .framed import Framed
from .gbnf import Grammar, Rules, lit, until
from .interface import history_as_is
from .items import Piece
from .jsoncall import JsonCalls
from .machine import Call, Text

MARKERS = ("<|constrain|>", "<|call|>")
TOKEN = "<|channel|>"
EXAMPLE = ("<|start|>assistant<|channel|>commentary to=functions.<function-name> <|constrain|>json"
           "<|message|><args-json-object><|call|>")


def shown_by(template: str) -> bool:
    return "<|channel|>" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """The call ends with its arguments: ``<|call|>`` is an end-of-generation token, which the
    grammar lets through once it is complete (a literal here would have to be spelled out).
    A required call may follow an analysis message (after the prompt's ``<|start|>assistant``)."""
    named = " | ".join(f'{lit(t["function"]["name"])} header-rest {rules.args(t, i)}' for i, t in enumerate(tools))
    rules.rule("header-rest", '[^<]* ("<|constrain|>" [^<]* | "<|channel|>" [^<]*)* "<|message|>"')
    root = f'"to=functions." ({named})'
    if required:
        analysis = f'"<|channel|>analysis<|message|>" {until("<|end|>")} "<|end|><|start|>assistant"'
        root = f'({analysis})? ("<|channel|>commentary " | " ") {root}'
    return root, (r"(to=functions\.)",)


history = history_as_is


class Parser(Framed, JsonCalls):
    """The splitter's segments in, items out: a recipient opens a call whose body is its
    arguments object alone; other segments pass through."""

    FRAMING = "harmony"

    def _segment(self, kind: str, text: str) -> None:
        if kind == CALL:
            if self._call is not None or self._buf:
                self._buf += text
                self._run(final=False)
            return
        self._end_input()
        if kind == RECIPIENT:
            call = Call()
            self._call = call
            self._name(call, text.removeprefix("functions."))
            self._args_only((), after=Text.TEXT)
            return
        self._flush_raw()
        self._emit(Piece(kind, text))
