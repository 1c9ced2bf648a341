"""minicpm5: MiniCPM5's ``<function name="N"><param name="P">VALUE</param></function>``, one call
after another with no block around them; a value that holds ``<``, ``&`` or a newline may be
wrapped in ``<![CDATA[...]]>`` (the text inside is the value, ``</param>`` included). Each value
is typed by the tool's schema as in ``xmlcall``. Its thinking is ``<think>`` (``reasoning``).
Each call is read by ``xmlcall`` as it streams, up to its ``</function>`` (or the next call's
opener): a call cut before it (the answer ended inside it) ends with an error, never as a call."""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from .gbnf import Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .machine import Text
from .minimax import named_parameters
from .scan import lead
from .xmlcall import Function, Xml, XmlCalls

FUNCTION, FUNCTION_END = '<function name="', "</function>"
PARAM, PARAM_END = '<param name="', "</param>"
CDATA, CDATA_END = "<![CDATA[", "]]>"
MARKERS = ("<function", "</function>", "<param", "</param>")
TOKEN = None
EXAMPLE = '<function name="example_function_name"><param name="example_parameter">value</param></function>'


def shown_by(template: str) -> bool:
    return FUNCTION in template and PARAM in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """A value whose schema allows a string is raw text up to ``</param>``, or CDATA; any other
    is JSON of its schema. Calls follow one another, whitespace between them."""
    text = rules.rule("param-text", f'{lit(CDATA)} {until(CDATA_END)} {lit(CDATA_END)} | {until(PARAM_END)}')
    alts = named_parameters(rules, tools, text, PARAM, PARAM_END)
    call = rules.rule("tool-call", f'{lit(FUNCTION)} ({" | ".join(alts)}) {lit(FUNCTION_END)}')
    return repeat(call, parallel), (re.escape(FUNCTION),)


history = history_as_is


class Cdata(Enum):
    CLOSE = "_s_cdata_close"  # after a CDATA value's ``]]>``: its parameter's closer


class Parser(XmlCalls):
    """Each ``<function name="`` opens a call, read by ``xmlcall`` as it streams; between calls
    is text. A value that opens with ``<![CDATA[`` runs to its ``]]>``, which ``</param>`` must
    follow. A string-only value streams as it is written, and so does CDATA where its schema
    allows a string or names no type (its text is the value, as llama.cpp reads it); any other
    is typed by the schema at its end."""

    OPENERS = (FUNCTION,)
    # no block around the calls: a function is its own (the next one's opener ends it too)
    FUNCTION_BLOCK = FUNCTION_MARKERS = (FUNCTION, FUNCTION_END)
    PARAMETER_MARKERS = (PARAM, PARAM_END)
    NAME_END = PARAMETER_NAME_END = '">'
    NAME_BAD = PARAMETER_NAME_BAD = '\n<>"'
    VALUE_NEWLINES = False  # the value is what lies between the parameter's markers
    _cdata = False  # the value being read is a CDATA section's text (set as each value begins)

    def _opened(self, marker: str) -> None:
        self._open(Xml.NAME)
        self._new_call()
        self._function(bare=False, after=Text.TEXT)

    def _text_value(self, fn: Function) -> bool:
        return False  # known once the value's start shows whether it is CDATA (``_s_x_value``)

    def _value_ends(self, fn: Function) -> tuple[str, ...]:
        # a value runs to its closer (a parameter's opener inside it is its text), as llama.cpp
        # reads it; CDATA's to its ``]]>``, whatever it holds
        return (CDATA_END,) if self._cdata else (fn.close, FUNCTION_END)

    def _s_x_value(self, final: bool) -> bool:
        fn = self._fn
        if not fn.value_begun:
            m = lead(self._buf, (CDATA,), final)
            if m == "":
                return False
            self._cdata = m == CDATA
            if self._cdata:
                self._take(len(CDATA))
            fn.text = fn.types == {"string"} or (self._cdata and (fn.types is None or "string" in fn.types))
            if fn.text:
                self._args(self._current, self._key(fn.name) + '"')
        moved = super()._s_x_value(final)
        if self._cdata and self._state == Xml.FUNC:  # the value ended at its ]]>
            self._go(Cdata.CLOSE)
        return moved

    def _s_cdata_close(self, final: bool) -> bool:
        m = lead(self._buf, (CDATA_END + PARAM_END,), final)
        if m == "":
            return False
        self._cdata = False
        if m is None:
            self._broken("a malformed CDATA value")
        else:
            self._take(len(m))
            self._go(Xml.FUNC)
        return True
