"""minimax: MiniMax M2's ``<minimax:tool_call>\\n<invoke name="N">\\n<parameter name="P">VALUE</parameter>\\n
</invoke>\\n</minimax:tool_call>`` (several invokes per block), each invoke read as it streams,
each value typed by the tool's schema (``xmlcall``). Its thinking is ``<think>`` (``reasoning``).

The block of invokes is ``xmlcall.Invokes``, shared with the formats that write one; in ``Streamed``
(``minimax``, ``minimax_m3``, ``kimi_k3``, ``muse``) each invoke is read by ``xmlcall`` as it
streams, its markers those of an XML-style function: a call is whole only at its closer (or at
what a missing closer is forgiven at), so one the answer cut off ends with an error."""

from __future__ import annotations

import re
from typing import Any, ClassVar

from ..schemacheck import allows_any
from .gbnf import WS, Grammar, Rules, lit, parameters, repeat, until
from .interface import history_as_is
from .scan import schema_types
from .xmlcall import Function, Invokes

CALLS_BEGIN, CALLS_END = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE, INVOKE_END = '<invoke name="', "</invoke>"
PARAMETER, PARAMETER_END = '<parameter name="', "</parameter>"
MARKERS = (CALLS_BEGIN, CALLS_END)
TOKEN = CALLS_BEGIN
EXAMPLE = (f'{CALLS_BEGIN}\n<invoke name="example_function_name">\n<parameter name="example_parameter">value'
           f"</parameter>\n</invoke>\n{CALLS_END}")


def shown_by(template: str) -> bool:
    return CALLS_BEGIN in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def _raw(schema: Any) -> bool:
    """A value written as raw text: its schema allows a string (or anything)."""
    types = schema_types(schema)
    return allows_any(schema) or (types is not None and "string" in types)


def named_parameters(rules: Rules, tools: list[dict[str, Any]], text: str, opener: str, closer: str) -> list[str]:
    """Per tool, the GBNF of ``NAME">`` and its parameters, each ``opener P">VALUE closer`` in any
    order: a value whose schema allows a string is ``text`` (raw text up to the closer), any
    other JSON of its schema (MiniMax M2's, muse's and MiniCPM5's calls)."""
    def item(pname: str, value: str, raw: bool) -> str:
        return f'{lit(opener)} {lit(pname)} "\\">" {value} {lit(closer)} {WS}'

    return [f'{lit(name)} "\\">" {WS} {body}' for name, body in parameters(rules, tools, text, item, raw=_raw)]


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    text = rules.rule("param-text", until(PARAMETER_END))
    alts = named_parameters(rules, tools, text, PARAMETER, PARAMETER_END)
    invoke = rules.rule("tool-call", f'{lit(INVOKE)} ({" | ".join(alts)}) {lit(INVOKE_END)}')
    return f'{lit(CALLS_BEGIN)} {WS} {repeat(invoke, parallel)} {WS} {lit(CALLS_END)}', (re.escape(CALLS_BEGIN),)


history = history_as_is


class Streamed(Invokes):
    """A block of invokes, each read by ``xmlcall`` as it streams: the block's markers are
    ``FUNCTION_BLOCK``, an invoke's ``FUNCTION_MARKERS`` (as ``BEGIN`` ... ``CLOSE``)."""

    CLOSE: ClassVar[str]
    VALUE_NEWLINES = False  # the value is what lies between the parameter's markers

    def _value_ends(self, fn: Function) -> tuple[str, ...]:
        # a value runs to its closer (a parameter's opener inside it is its text), as llama.cpp reads it
        return (fn.close, self.FUNCTION_MARKERS[1], self.FUNCTION_BLOCK[1])


class Parser(Streamed):
    OPENERS = (CALLS_BEGIN,)
    STRAYS = (CALLS_END,)
    BEGIN, END, OPEN, CLOSE = CALLS_BEGIN, CALLS_END, INVOKE, INVOKE_END
    FUNCTION_BLOCK, FUNCTION_MARKERS, PARAMETER_MARKERS = (BEGIN, END), (OPEN, CLOSE), (PARAMETER, PARAMETER_END)
    NAME_END = PARAMETER_NAME_END = '">'
    NAME_BAD = PARAMETER_NAME_BAD = '\n<>"'
