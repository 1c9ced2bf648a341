"""minicpm5: MiniCPM5's ``<function name="N"><param name="P">VALUE</param></function>``, one call
after another with no block around them; a value that holds ``<``, ``&`` or a newline may be
wrapped in ``<![CDATA[...]]>`` (the text inside is the value, ``</param>`` included). Each value
is typed by the tool's schema as in ``xmlcall``. Its thinking is ``<think>`` (``reasoning``).
Each call is held until its ``</function>`` (or the next call, or the answer's end) and read
whole, by ``minimax.Invokes``."""

from __future__ import annotations

import re
from typing import Any

from .gbnf import Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .minimax import Block, Invokes, named_parameters
from .scan import WS as SPACE
from .scan import loads, schema_types, typed

FUNCTION, FUNCTION_END = '<function name="', "</function>"
PARAM, PARAM_END = '<param name="', "</param>"
CDATA, CDATA_END = "<![CDATA[", "]]>"
MARKERS = ("<function", "</function>", "<param", "</param>")
TOKEN = None
EXAMPLE = '<function name="example_function_name"><param name="example_parameter">value</param></function>'
_NAME = re.compile(r'\s*([^"<>\n]{1,256})">')


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


class Parser(Invokes):
    """Each ``<function name="`` opens a call read whole once it ends; between calls is text."""

    OPENERS = (FUNCTION,)
    BEGIN, END, OPEN, CLOSE = FUNCTION, FUNCTION_END, FUNCTION, FUNCTION_END

    def _opened(self, marker: str) -> None:
        self._open(Block.INVOKE)
        self._body_at = len(self._new_call().raw)

    def _s_block(self, final: bool) -> bool:
        self._close_block()  # no block around the calls: what follows a call is text
        return True

    def _read_invoke(self, body: str, schema: dict[str, Any]) -> dict[str, Any]:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        assert isinstance(props, dict)
        out: dict[str, Any] = {}
        i = 0
        while True:
            i = len(body) - len(body[i:].lstrip(SPACE))
            if i == len(body):
                return out
            if not body.startswith(PARAM, i):
                raise ValueError("text between parameters")
            m = _NAME.match(body, i + len(PARAM))
            if m is None:
                raise ValueError("a malformed parameter")
            key, at = m.group(1), m.end()
            types = schema_types(props.get(key))
            if body.startswith(CDATA, at):  # the text inside is the value, as written
                end = body.find(CDATA_END, at)
                if end < 0 or not body.startswith(PARAM_END, end + len(CDATA_END)):
                    raise ValueError("a malformed CDATA value")
                value = body[at + len(CDATA):end]
                out[key] = value if types is None or "string" in types else loads(typed(value, types))
                i = end + len(CDATA_END) + len(PARAM_END)
                continue
            end = body.find(PARAM_END, at)
            if end < 0:
                raise ValueError("a malformed parameter")
            out[key] = loads(typed(body[at:end], types))
            i = end + len(PARAM_END)
