"""Reader of a call written as Qwen3-Coder's XML-style function, shared by the formats that
write or read it: ``<function=N>`` then ``<parameter=P>\\nVALUE\\n</parameter>`` per argument,
then ``</function>``, inside a block whose markers the format names (``FUNCTION_BLOCK``).

The arguments object is built here, each value typed by the tool's JSON schema as llama.cpp
does: a string-only parameter stays text (and streams as it is written), any other is read as
JSON when it parses as one of the schema's types, and is a string otherwise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from .jsoncall import JsonCalls
from .machine import Text
from .scan import BAD, MORE, escape, read_name, schema_types, typed, until

FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


class Xml(Enum):
    NAME = "_s_x_name"  # after <function=: the name up to >
    FUNC = "_s_x_func"  # between parameters
    PNAME = "_s_x_pname"  # after <parameter=: its name up to >
    VALUE = "_s_x_value"  # a parameter's value up to </parameter>


@dataclass
class _Function:
    """The function being read."""

    bare: bool  # opened by <function= alone, outside a block: a bad name makes it text
    after: Enum  # where to go once it is over
    params: int = 0  # parameters read so far
    # the parameter being read
    prefix: str = ""  # its key's JSON text, written before a value typed at its end
    types: set[str] | None = None
    value: str = ""
    value_begun: bool = False
    held_nl: bool = False  # a newline held back: the last one before </parameter> is not the value's


class XmlCalls(JsonCalls):
    """The function reader; a format enters it with ``_function`` once ``<function=`` is read."""

    FUNCTION_BLOCK: ClassVar[tuple[str, str]]  # the markers that open and close the block around calls
    # a newline right after <parameter=P> and one right before </parameter> are the format's, not the value's
    VALUE_NEWLINES: ClassVar[bool] = True
    _fn: _Function

    def _function(self, bare: bool, after: Enum) -> None:
        self._fn = _Function(bare, after)
        self._go(Xml.NAME)

    def _function_ends(self) -> tuple[tuple[str, bool], ...]:
        """Where the rest of a malformed function ends (True: the marker is part of it)."""
        opener, closer = self.FUNCTION_BLOCK
        return ((FUNCTION_END, True), (closer, False), (opener, False))

    def _s_x_name(self, final: bool) -> bool:
        call, fn = self._current, self._fn
        r = read_name(self._buf, (">",), final, bad="\n<{}\"")
        if r == MORE:
            return False
        if r == BAD or (fn.bare and isinstance(r, tuple) and r[0].strip() not in self.params):
            if fn.bare:  # not a call: the text stays text
                self._call = None
                if isinstance(r, tuple):
                    self._content(call.raw + self._buf[:len(r[0]) + 1])
                    self._buf = self._buf[len(r[0]) + 1:]
                else:
                    self._content(call.raw)
                self._go(Text.TEXT)
                return True
            self._junk(self._function_ends(), "a malformed function name")
            self._after = fn.after
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + 1)
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

    def _s_x_func(self, final: bool) -> bool:
        opener, closer = self.FUNCTION_BLOCK
        junk, marker = until(self._buf, (PARAMETER, FUNCTION_END, closer, FUNCTION, opener), final)
        self._take(len(junk))  # text between parameters carries nothing
        if marker is None:
            return bool(junk)
        if marker == PARAMETER:
            self._take(len(marker))
            self._go(Xml.PNAME)
            return True
        if marker == FUNCTION_END:
            self._take(len(marker))
        self._end_function()  # a missing </function> is forgiven when the call goes on to something else
        return True

    def _s_x_pname(self, final: bool) -> bool:
        call, fn = self._current, self._fn
        r = read_name(self._buf, (">",), final, bad="\n<")
        if r == MORE:
            return False
        if r == BAD:
            self._junk(self._function_ends(), "a malformed parameter")
            self._after = fn.after
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + 1)
        name = r[0].strip()
        schema = self.params.get(call.name or "", {}).get("properties")
        fn.types = schema_types(schema.get(name)) if isinstance(schema, dict) else None
        fn.prefix = ("{" if not fn.params else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        fn.value, fn.value_begun, fn.held_nl = "", False, False
        if fn.types == {"string"}:
            self._args(call, fn.prefix + '"')
        self._go(Xml.VALUE)
        return True

    def _s_x_value(self, final: bool) -> bool:
        call, fn = self._current, self._fn
        if not fn.value_begun:
            fn.value_begun = True
            if self._buf.startswith("\n") and self.VALUE_NEWLINES:
                self._take(1)
            return True
        text, marker = until(self._buf, (PARAMETER_END, PARAMETER, FUNCTION_END, self.FUNCTION_BLOCK[1]), final)
        n = len(self._take(len(text)))
        if fn.types == {"string"}:
            text = ("\n" if fn.held_nl else "") + text
            fn.held_nl = text.endswith("\n") and self.VALUE_NEWLINES
            self._args(call, escape(text[:-1] if fn.held_nl else text))
        else:
            fn.value += text
        if marker is None:
            return n > 0
        if fn.types == {"string"}:
            self._args(call, '"')
        else:
            value = fn.value[:-1] if fn.value.endswith("\n") and self.VALUE_NEWLINES else fn.value
            self._args(call, fn.prefix + typed(value, fn.types))
        fn.params += 1
        if marker == PARAMETER_END:
            self._take(len(marker))
        self._go(Xml.FUNC)
        return True
