"""deepseek_dsml: DeepSeek V3.2 and V4 write calls in DSML, a block of invocations::

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="N">
    <｜DSML｜parameter name="P" string="true">VALUE</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

(V4 names the block ``tool_calls``; either name is read.) A parameter marked ``string="true"``
is text as written, any other is JSON (``scan.typed`` by the tool's schema). Their templates
list the tools and render calls themselves. V3/R1/V3.1's syntax is ``deepseek``'s."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, parameters, repeat, until
from .interface import history_as_is
from .jsoncall import JsonCalls
from .machine import Text
from .scan import BAD, MORE, escape, lead, read_name, schema_types, typed
from .scan import until as scan_until

DSML = "｜DSML｜"
BLOCK_NAMES = ("function_calls", "tool_calls")  # V3.2's, V4's
OPENS = tuple(f"<{DSML}{n}>" for n in BLOCK_NAMES)
CLOSES = tuple(f"</{DSML}{n}>" for n in BLOCK_NAMES)
INVOKE, INVOKE_END = f'<{DSML}invoke name="', f"</{DSML}invoke>"
PARAMETER, PARAMETER_END = f'<{DSML}parameter name="', f"</{DSML}parameter>"
MARKERS = (DSML,)
TOKEN = None
EXAMPLE = (f'<{DSML}function_calls>\n<{DSML}invoke name="example_function_name">\n'
           f'<{DSML}parameter name="example_parameter" string="true">value</{DSML}parameter>\n'
           f"</{DSML}invoke>\n</{DSML}function_calls>")


def shown_by(template: str) -> bool:
    return "dsml_token" in template and "DSML" in template and any(n in template for n in BLOCK_NAMES)


def example(chat_template: str | None) -> str:
    """V4's templates name the block ``tool_calls``, V3.2's ``function_calls``."""
    if chat_template and "function_calls" not in chat_template and "tool_calls" in chat_template:
        return EXAMPLE.replace("function_calls", "tool_calls")
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """A string argument (or one whose schema allows any value) is ``string="true"`` and raw text
    up to its closer; any other is ``string="false"`` and JSON of its schema."""
    text = rules.rule("dsml-text", until(PARAMETER_END))
    def item(pname: str, value: str, raw: bool) -> str:
        attr = lit(f'" string="{"true" if raw else "false"}">')
        return f'{lit(PARAMETER)} {lit(pname)} {attr} {value} {lit(PARAMETER_END)} {WS}'

    alts = [f'{lit(name)} "\\">" {WS} {body} {lit(INVOKE_END)}' for name, body in parameters(rules, tools, text, item)]
    invoke = rules.rule("tool-call", f'{lit(INVOKE)} ({" | ".join(alts)})')
    blocks = " | ".join(f"{lit(o)} {WS} {repeat(invoke, parallel)} {WS} {lit(c)}" for o, c in zip(OPENS, CLOSES))
    return f"({blocks})", tuple(re.escape(o) for o in OPENS)


history = history_as_is


class Dsml(Enum):
    BLOCK = "_s_block"  # inside the block, between invocations
    NAME = "_s_name"  # after <｜DSML｜invoke name=": the name up to ">
    INVOKE = "_s_invoke"  # inside an invocation, between parameters
    PNAME = "_s_pname"  # after <｜DSML｜parameter name=": its name and attributes up to >
    VALUE = "_s_value"  # a parameter's value up to its closer


_STRING = re.compile(r'\s*string\s*=\s*"(true|false)"\s*')
_JUNK = ((INVOKE_END, True), *((c, False) for c in CLOSES), (INVOKE, False))


class Parser(JsonCalls):
    OPENERS = OPENS
    STRAYS = (*CLOSES, INVOKE_END)
    BLOCKS = frozenset({Dsml.BLOCK})
    _count = 0  # parameters read in the invocation
    _prefix = ""  # the parameter's key as JSON text, written before its value
    _string = False  # the parameter's value is text
    _value = ""
    _types: set[str] | None = None

    def _opened(self, marker: str) -> None:
        self._open(Dsml.BLOCK)

    def _broken(self, error: str) -> None:
        self._junk(_JUNK, error)
        self._after = Dsml.BLOCK

    def _s_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (INVOKE, *CLOSES, *OPENS), final)
        if m == "":
            return False
        if m == INVOKE:
            self._take(len(m))
            self._new_call()
            self._go(Dsml.NAME)
        elif m in CLOSES:
            self._take(len(m))
            self._close_block()
        elif m in OPENS:  # another block opens: this one is over
            self._close_block()
        else:  # not an invocation: the rest of the block is its text
            self._new_call()
            self._junk(tuple((c, True) for c in CLOSES) + tuple((o, False) for o in OPENS), "not an invocation")
            self._after = Text.TEXT
        return True

    def _s_name(self, final: bool) -> bool:
        r = read_name(self._buf, ('">',), final, bad="<>\"\n")
        if r == MORE:
            return False
        if r == BAD or not isinstance(r, tuple):
            self._broken("a malformed invocation")
            return True
        call = self._current
        self._take(len(r[0]) + len(r[1]))
        self._name(call, r[0].strip())
        if call.error:
            self._broken(call.error)
            return True
        self._begin(call)
        self._count = 0
        self._go(Dsml.INVOKE)
        return True

    def _s_invoke(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        m = lead(self._buf, (PARAMETER, INVOKE_END), final)
        if m == "":
            return False
        if m == PARAMETER:
            self._take(len(m))
            self._go(Dsml.PNAME)
            return True
        if m == INVOKE_END:
            self._take(len(m))
            self._args(self._current, "}" if self._count else "{}")
            self._end_call()
            self._go(Dsml.BLOCK)
            return True
        self._broken("not a parameter")
        return True

    def _s_pname(self, final: bool) -> bool:
        r = read_name(self._buf, (">",), final, bad="<\n")
        if r == MORE:
            return False
        head = r[0].split('"', 1) if isinstance(r, tuple) else []
        flag = _STRING.fullmatch(head[1]) if len(head) == 2 else None
        if r == BAD or len(head) != 2 or (head[1].strip() and flag is None):
            self._broken("a malformed parameter")
            return True
        assert isinstance(r, tuple)
        self._take(len(r[0]) + len(r[1]))
        call, name = self._current, head[0].strip()
        schema = self.params.get(call.name or "", {}).get("properties")
        self._types = schema_types(schema.get(name)) if isinstance(schema, dict) else None
        self._string = flag.group(1) == "true" if flag else self._types == {"string"}
        self._prefix = ("{" if not self._count else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        self._count += 1
        self._value = ""
        if self._string:  # text: it streams as it comes
            self._args(call, self._prefix + '"')
        self._go(Dsml.VALUE)
        return True

    def _s_value(self, final: bool) -> bool:
        text, marker = scan_until(self._buf, (PARAMETER_END, INVOKE_END, *CLOSES), final)
        n = len(self._take(len(text)))
        call = self._current
        if self._string:
            self._args(call, escape(text))
        else:
            self._value += text
        if marker is None:
            return n > 0
        if marker != PARAMETER_END:  # the value was never closed
            self._broken("a parameter value left open")
            return True
        self._take(len(marker))
        self._args(call, '"' if self._string else self._prefix + typed(self._value, self._types))
        self._go(Dsml.INVOKE)
        return True

