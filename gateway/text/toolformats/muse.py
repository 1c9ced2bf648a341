"""muse: Muse Glimmer's calls, messages to a tool: ``<|start|>assistant to=N<|message|>
<atem:function_calls>\\n<atem:invoke name="N">\\n<atem:parameter name="P">VALUE</atem:parameter>\\n
</atem:invoke>\\n</atem:function_calls>``, each value typed by the tool's schema as in ``xmlcall``.

Its messages are framed as gpt-oss's are (``reasoning``'s ``muse``: ``to=self`` is thinking,
``to=user`` content), so, as ``harmony`` does, this parser runs that splitter itself on the raw
answer (pass the prompt's tail, ``<|start|>assistant``, as ``prompt_tail``): only a message to a
recipient other than self and user is read for calls (markup in the thinking or the answer stays
text); its invokes are MiniMax M2's behind the ``atem:`` prefix, read as they stream by
``minimax.Streamed``: a call cut before its closer (the message or the answer ended inside it)
ends with an error, never as a call."""

from __future__ import annotations

from typing import Any

from ..reasoning import CALL, RECIPIENT
from .framed import Framed
from .gbnf import WS, Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .items import Piece
from .minimax import Streamed, named_parameters

CALLS_BEGIN, CALLS_END = "<atem:function_calls>", "</atem:function_calls>"
INVOKE, INVOKE_END = '<atem:invoke name="', "</atem:invoke>"
PARAMETER, PARAMETER_END = '<atem:parameter name="', "</atem:parameter>"
MARKERS = (CALLS_BEGIN, CALLS_END, "<atem:invoke", INVOKE_END, "<atem:parameter", PARAMETER_END)
TOKEN = None
EXAMPLE = (f' to=example_function_name<|message|>{CALLS_BEGIN}\n{INVOKE}example_function_name">\n'
           f'{PARAMETER}example_parameter">value{PARAMETER_END}\n{INVOKE_END}\n{CALLS_END}')


def shown_by(template: str) -> bool:
    return CALLS_BEGIN in template and "<|eom|>" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """From the recipient on (the prompt ends ``<|start|>assistant``); several calls are
    messages one after another; a required call may follow thinking messages."""
    text = rules.rule("param-text", until(PARAMETER_END))
    alts = named_parameters(rules, tools, text, PARAMETER, PARAMETER_END)
    call = rules.rule("tool-call", f'" to=" [^<]* "<|message|>" {lit(CALLS_BEGIN)} {WS} {lit(INVOKE)} '
                                   f'({" | ".join(alts)}) {lit(INVOKE_END)} {WS} {lit(CALLS_END)}')
    root = repeat(call, parallel, sep='"<|eom|><|start|>assistant"')
    if required:  # thinking messages may come first
        root = f'(" to=self<|message|>" {until("<|eom|>")} "<|eom|><|start|>assistant")* {root}'
    return root, (r"( to=(?!self<)(?!user<)[^<]*<\|message\|>)",)


history = history_as_is


class Parser(Framed, Streamed):
    """The splitter's segments in, items out: a call message's body is read for invoke blocks;
    thinking and content pass through."""

    OPENERS = (CALLS_BEGIN,)
    STRAYS = (CALLS_END,)
    BEGIN, END, OPEN, CLOSE = CALLS_BEGIN, CALLS_END, INVOKE, INVOKE_END
    FUNCTION_BLOCK, FUNCTION_MARKERS, PARAMETER_MARKERS = (BEGIN, END), (OPEN, CLOSE), (PARAMETER, PARAMETER_END)
    NAME_END = PARAMETER_NAME_END = '">'
    NAME_BAD = PARAMETER_NAME_BAD = '\n<>"'

    FRAMING = "muse"

    def _segment(self, kind: str, text: str) -> None:
        if kind == CALL:
            self._buf += text
            self._run(final=False)
            return
        self._end_input()
        if kind != RECIPIENT:
            self._flush_raw()
            self._emit(Piece(kind, text))

