"""minimax: MiniMax M2's ``<minimax:tool_call>\\n<invoke name="N">\\n<parameter name="P">VALUE</parameter>\\n
</invoke>\\n</minimax:tool_call>`` (several invokes per block), each invoke read as it streams,
each value typed by the tool's schema (``xmlcall``). Its thinking is ``<think>`` (``reasoning``).

``Invokes`` is the block of invokes, shared with the formats that write one: in ``Streamed``
(``minimax``, ``minimax_m3``, ``kimi_k3``) each invoke is read by ``xmlcall`` as it streams, its
markers those of an XML-style function; otherwise (``muse``, ``minicpm5``) each is held until its
closer (or the block's end, or the answer's) and then read whole by the format's ``_read_invoke``,
so its items leave at once."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any, ClassVar

from ..schemacheck import allows_any
from .gbnf import WS, Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import WS as SPACE
from .scan import lead, loads, schema_types, typed
from .scan import until as until_marker
from .xmlcall import Function, XmlCalls

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
    alts = []
    for i, tool in enumerate(tools):
        params = (tool["function"].get("parameters") or {}).get("properties") or {}
        items = []
        for j, (pname, schema) in enumerate(params.items()):
            schema = schema if isinstance(schema, dict | bool) else {}
            value = text if _raw(schema) else rules.value(schema, f"tool{i}-p{j}")
            items.append(f'{lit(opener)} {lit(pname)} "\\">" {value} {lit(closer)} {WS}')
        body = f'({" | ".join(items)})*' if items else ""
        alts.append(f'{lit(tool["function"]["name"])} "\\">" {WS} {body}')
    return alts


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    text = rules.rule("param-text", until(PARAMETER_END))
    alts = named_parameters(rules, tools, text, PARAMETER, PARAMETER_END)
    invoke = rules.rule("tool-call", f'{lit(INVOKE)} ({" | ".join(alts)}) {lit(INVOKE_END)}')
    return f'{lit(CALLS_BEGIN)} {WS} {repeat(invoke, parallel)} {WS} {lit(CALLS_END)}', (re.escape(CALLS_BEGIN),)


history = history_as_is


class Block(Enum):
    BLOCK = "_s_block"  # inside the block, between invokes
    INVOKE = "_s_invoke"  # inside an invoke, held until it ends


_NAME = re.compile(r'\s*([^"<>\n]{1,256})">')


class Invokes(JsonCalls):
    """A block of invokes, each read whole once it ends (``_read_invoke``) unless the format
    reads it another way (``_invoke``)."""

    BEGIN: ClassVar[str]
    END: ClassVar[str]
    OPEN: ClassVar[str]  # an invoke's opener, up to its name
    CLOSE: ClassVar[str]
    BLOCKS = frozenset({Block.BLOCK})
    _body_at = 0  # where the open invoke's text begins in its call's raw text

    def _opened(self, marker: str) -> None:
        self._open(Block.BLOCK)

    def _s_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (self.OPEN, self.END, self.BEGIN), final)
        if m == "":
            return False
        if m == self.END:
            self._take(len(m))
            self._close_block()
        elif m == self.BEGIN:  # a new block while this one is open: this one is over
            self._close_block()
        elif m == self.OPEN:
            self._take(len(m))
            self._invoke()
        else:
            self._new_call()
            self._junk(((self.END, True), (self.BEGIN, False)), "not a tool call")
            self._after = Text.TEXT
        return True

    def _invoke(self) -> None:
        """An invoke's opener was just read: hold its text until it ends."""
        self._body_at = len(self._new_call().raw)
        self._go(Block.INVOKE)

    def _s_invoke(self, final: bool) -> bool:
        text, marker = until_marker(self._buf, (self.CLOSE, self.END, self.OPEN, self.BEGIN), final)
        self._take(len(text))
        if marker is None:
            return bool(text)
        if marker == self.CLOSE:
            self._take(len(marker))
        self._finish(closed=marker == self.CLOSE)
        return True

    def _end_input(self) -> None:
        self._run(final=True)
        if self._call is not None and self._state == Block.INVOKE:
            self._finish(closed=False)  # the answer ended in it: whole if what came reads whole
        super()._end_input()

    def _finish(self, closed: bool) -> None:
        call = self._current
        body = call.raw[self._body_at:]
        if closed:
            body = body[:-len(self.CLOSE)]
        try:
            name, at = self._read_head(body)
            self._name(call, name)
            args = self._read_invoke(body[at:], self.params.get(call.name or "", {}))
        except ValueError as e:
            self._end_call(str(e) or "a malformed invoke")
        else:
            if not call.error:
                self._begin(call)
                self._args(call, json.dumps(args, ensure_ascii=False))
            self._end_call()
        self._go(Block.BLOCK)

    def _read_head(self, body: str) -> tuple[str, int]:
        """The name of an invoke whose text (after ``OPEN``) is ``body``, and where its arguments
        begin; ValueError when it does not read."""
        m = _NAME.match(body)
        if m is None:
            raise ValueError("a malformed invoke")
        return m.group(1).strip(), m.end()

    def _read_invoke(self, body: str, schema: dict[str, Any]) -> dict[str, Any]:
        """The arguments of an invoke whose body (after its name) is ``body``; ValueError when it
        does not read."""
        raise NotImplementedError


class Streamed(Invokes, XmlCalls):
    """A block of invokes, each read by ``xmlcall`` as it streams: the block's markers are
    ``FUNCTION_BLOCK``, an invoke's ``FUNCTION_MARKERS`` (as ``BEGIN`` ... ``CLOSE``)."""

    VALUE_NEWLINES = False  # the value is what lies between the parameter's markers

    def _invoke(self) -> None:
        self._new_call()
        self._function(bare=False, after=Block.BLOCK)

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


def read_parameters(body: str, schema: dict[str, Any], opener: str, closer: str) -> dict[str, Any]:
    """An invoke's ``opener NAME">VALUE closer`` parameters, nothing else between them but
    spaces, each value typed by the tool's schema (MiniMax M2's and muse's invokes). Raises
    ``ValueError`` for anything else."""
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    assert isinstance(props, dict)
    out: dict[str, Any] = {}
    i = 0
    while True:
        i = len(body) - len(body[i:].lstrip(SPACE))
        if i == len(body):
            return out
        if not body.startswith(opener, i):
            raise ValueError("text between parameters")
        m = _NAME.match(body, i + len(opener))
        end = body.find(closer, i)
        if m is None or end < m.end():
            raise ValueError("a malformed parameter")
        key, value = m.group(1), body[m.end():end]
        out[key] = loads(typed(value, schema_types(props.get(key))))
        i = end + len(closer)
