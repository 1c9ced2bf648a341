"""Reader of a call written as an XML-style function, shared by the formats that write one: the
function's opener and name, each argument as a parameter (its opener, name, value and closer),
then the function's closer, inside a block whose markers the format names (``FUNCTION_BLOCK``;
``Invokes`` reads such a block, a function after another).
Qwen3-Coder's markers are the defaults (``<function=N>``, ``<parameter=P>\\nVALUE\\n</parameter>``,
``</function>``); a format names its own (``FUNCTION_MARKERS``, ``PARAMETER_MARKERS``, what ends a
name and the attributes after it: MiniMax's ``<invoke name="N">``, Kimi K3's tags).

The arguments object is built here and streams as it is read: a parameter's key once its name is
read, a value typed as text (a string-only parameter, by default) as it is written, any other
once its parameter ends, typed by the tool's JSON schema as llama.cpp does: JSON when it parses
as one of the schema's types, a string otherwise. A format may type values its own way
(``_types``, ``_text_value``, ``_value_json``). The call is whole only once its function ends:
an answer that ends inside it ends the call with an error."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from .jsoncall import JsonCalls
from .machine import Text
from .scan import MORE, Status, escape, lead, read_name, schema_types, typed, until

FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


class Xml(Enum):
    NAME = "_s_x_name"  # after the function's opener: its name (and attributes)
    FUNC = "_s_x_func"  # between parameters
    PNAME = "_s_x_pname"  # after a parameter's opener: its name (and attributes)
    VALUE = "_s_x_value"  # a parameter's value up to its closer


@dataclass
class Function:
    """The function being read."""

    bare: bool  # opened by its opener alone, outside a block: a bad name makes it text
    after: Enum  # where to go once it is over
    params: int = 0  # members of the arguments object written so far
    # the parameter being read
    name: str = ""
    schema: Any = None  # its schema in the tool's (None: the tool names no such parameter)
    types: set[str] | None = None
    close: str = ""  # the marker that ends it
    text: bool = False  # its value streams as a JSON string
    value: str = ""
    value_begun: bool = False
    held_nl: bool = False  # a newline held back: the last one before the closer is not the value's


def until_longest(buf: str, markers: tuple[str, ...], final: bool) -> tuple[str, str | None]:
    """``scan.until``, but a marker found is not taken while a longer one it begins may still be
    arriving there (MiniMax M3's parameter opener begins its invoke's closer)."""
    text, marker = until(buf, markers, final)
    rest = buf[len(text):]
    if marker is not None and not final and any(len(m) > len(rest) and m.startswith(rest) for m in markers):
        return text, None
    return text, marker


class XmlCalls(JsonCalls):
    """The function reader; a format enters it with ``_function`` once the function's opener is read."""

    FUNCTION_BLOCK: ClassVar[tuple[str, str]]  # the markers that open and close the block around calls
    FUNCTION_MARKERS: ClassVar[tuple[str, str]] = (FUNCTION, FUNCTION_END)  # a function's opener and closer
    PARAMETER_MARKERS: ClassVar[tuple[str, str]] = (PARAMETER, PARAMETER_END)
    NAME_END: ClassVar[str] = ">"  # what ends a function's name
    PARAMETER_NAME_END: ClassVar[str] = ">"
    ATTRS_END: ClassVar[str] = ""  # when set, attributes follow a name's end up to this marker
    NAME_BAD: ClassVar[str] = '\n<{}"'  # characters a function's name cannot hold
    PARAMETER_NAME_BAD: ClassVar[str] = "\n<"
    INNER: ClassVar[tuple[str, ...]] = ()  # markers of the format's own between parameters (``_inner``)
    # a newline right after the parameter's opener and one right before its closer are the format's, not the value's
    VALUE_NEWLINES: ClassVar[bool] = True
    _fn: Function

    def _function(self, bare: bool, after: Enum) -> None:
        self._fn = Function(bare, after)
        self._go(Xml.NAME)

    def _function_ends(self) -> tuple[tuple[str, bool], ...]:
        """Where the rest of a malformed function ends (True: the marker is part of it)."""
        opener, closer = self.FUNCTION_BLOCK
        return ((self.FUNCTION_MARKERS[1], True), (closer, False), (opener, False))

    def _broken(self, error: str) -> None:
        """The function is malformed: its text up to where it ends is the failed call's."""
        self._junk(self._function_ends(), error)
        self._after = self._fn.after

    def _head(self, final: bool, end: str, bad: str) -> tuple[str, int] | Status | str:
        """The name at the start of ``_buf`` up to ``end`` (then any attributes up to
        ``ATTRS_END``): (name, the length of both), ``MORE`` while it may still come, or ``BAD``."""
        r = read_name(self._buf, (end,), final, bad=bad)
        if not isinstance(r, tuple):
            return r
        at = len(r[0]) + len(r[1])
        if not self.ATTRS_END:
            return r[0], at
        attrs = read_name(self._buf[at:], (self.ATTRS_END,), final, bad="<>")
        if not isinstance(attrs, tuple):
            return attrs
        return r[0], at + len(attrs[0]) + len(attrs[1])

    def _s_x_name(self, final: bool) -> bool:
        call, fn = self._current, self._fn
        r = self._head(final, self.NAME_END, self.NAME_BAD)
        if r == MORE:
            return False
        if not isinstance(r, tuple) or (fn.bare and r[0].strip() not in self.params):
            if fn.bare:  # not a call: the text stays text
                self._call = None
                n = r[1] if isinstance(r, tuple) else 0
                self._content(call.raw + self._buf[:n])
                self._buf = self._buf[n:]
                self._go(Text.TEXT)
                return True
            self._broken("a malformed function name")
            return True
        self._take(r[1])
        self._name(call, r[0].strip())
        if not call.error:
            self._begin(call)
        self._go(Xml.FUNC)
        return True

    def _end_function(self) -> None:
        call = self._current
        self._args(call, "}" if self._fn.params else "{}")
        self._end_call()
        self._go(self._fn.after)

    def _member(self, key: str, value: str) -> None:
        """One member of the arguments object, its value's JSON text whole."""
        self._args(self._current, self._key(key) + value)
        self._fn.params += 1

    def _key(self, key: str) -> str:
        return ("{" if not self._fn.params else ", ") + json.dumps(key, ensure_ascii=False) + ": "

    def _s_x_func(self, final: bool) -> bool:
        (opener, closer), (function, function_end) = self.FUNCTION_BLOCK, self.FUNCTION_MARKERS
        markers = (self.PARAMETER_MARKERS[0], function_end, closer, function, opener, *self.INNER)
        junk, marker = until_longest(self._buf, markers, final)
        self._take(len(junk))  # text between parameters carries nothing
        if marker is None:
            return bool(junk)
        if marker == self.PARAMETER_MARKERS[0]:
            self._take(len(marker))
            self._go(Xml.PNAME)
            return True
        if marker in self.INNER:
            self._inner(marker)
            return True
        if marker == function_end:
            self._take(len(marker))
        self._end_function()  # a missing closer is forgiven when the call goes on to something else
        return True

    def _inner(self, marker: str) -> None:
        """One of ``INNER``, not consumed yet, met between parameters."""
        raise NotImplementedError

    def _s_x_pname(self, final: bool) -> bool:
        call, fn = self._current, self._fn
        r = self._head(final, self.PARAMETER_NAME_END, self.PARAMETER_NAME_BAD)
        if r == MORE:
            return False
        if not isinstance(r, tuple):
            self._broken("a malformed parameter")
            return True
        self._take(r[1])
        fn.name = r[0].strip()
        props = self.params.get(call.name or "", {}).get("properties")
        fn.schema = props.get(fn.name) if isinstance(props, dict) else None
        fn.types = self._types(fn.schema)
        fn.close = self._parameter_end(fn.name)
        fn.value, fn.value_begun, fn.held_nl = "", False, False
        fn.text = self._text_value(fn)
        if fn.text:
            self._args(call, self._key(fn.name) + '"')
        self._go(Xml.VALUE)
        return True

    def _types(self, schema: Any) -> set[str] | None:
        """The JSON types a parameter's value may take (None: any)."""
        return schema_types(schema)

    def _parameter_end(self, name: str) -> str:
        """The marker that ends the parameter ``name``."""
        return self.PARAMETER_MARKERS[1]

    def _text_value(self, fn: Function) -> bool:
        """Whether the parameter's value is text, streamed as a JSON string as it is written."""
        return fn.types == {"string"}

    def _value_ends(self, fn: Function) -> tuple[str, ...]:
        """The markers that end a value: its closer, and those a missing closer is forgiven at."""
        return (fn.close, self.PARAMETER_MARKERS[0], self.FUNCTION_MARKERS[1], self.FUNCTION_BLOCK[1])

    def _inside(self, fn: Function) -> bool:
        """Whether the closer just met belongs to the value read so far (an element nested in it)."""
        return False

    def _value_json(self, fn: Function, value: str) -> str:
        """The JSON text of a value read whole; ValueError when it does not read."""
        return typed(value, fn.types)

    def _s_x_value(self, final: bool) -> bool:
        call, fn = self._current, self._fn
        if not fn.value_begun:
            fn.value_begun = True
            if self._buf.startswith("\n") and self.VALUE_NEWLINES:
                self._take(1)
            return True
        text, marker = until_longest(self._buf, self._value_ends(fn), final)
        n = len(self._take(len(text)))
        if fn.text:
            text = ("\n" if fn.held_nl else "") + text
            fn.held_nl = text.endswith("\n") and self.VALUE_NEWLINES
            self._args(call, escape(text[:-1] if fn.held_nl else text))
        else:
            fn.value += text
        if marker is None:
            return n > 0
        if marker == fn.close and not fn.text and self._inside(fn):
            fn.value += self._take(len(marker))
            return True
        if fn.text:
            self._args(call, '"')
            fn.params += 1
        else:
            value = fn.value[:-1] if fn.value.endswith("\n") and self.VALUE_NEWLINES else fn.value
            try:
                value = self._value_json(fn, value)
            except ValueError as e:
                self._broken(str(e) or "a malformed value")
                return True
            self._member(fn.name, value)
        if marker == fn.close:
            self._take(len(marker))
        self._go(Xml.FUNC)
        return True


class Block(Enum):
    BLOCK = "_s_block"  # inside the block, between its calls


class Invokes(XmlCalls):
    """A block of functions (``BEGIN`` ... ``END``), each opened by ``OPEN`` and read as it
    streams (its name follows ``OPEN``): hermes', seed_oss', and MiniMax's invokes
    (``minimax.Streamed``). In the block, another ``BEGIN`` ends it; anything that is not a
    function is a failed call up to the block's end."""

    BEGIN: ClassVar[str]
    END: ClassVar[str]
    OPEN: ClassVar[str]  # a function's opener, up to its name
    BLOCKS = frozenset({Block.BLOCK})

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
            self._new_call()
            self._function(bare=False, after=Block.BLOCK)
        else:
            self._new_call()
            self._junk(((self.END, True), (self.BEGIN, False)), "not a tool call")
            self._after = Text.TEXT
        return True
