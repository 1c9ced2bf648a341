"""lfm2: Liquid's LFM2 and LFM2.5 write ``<|tool_call_start|>[name(arg="v", n=1), other()]<|tool_call_end|>``:
a Python-style list of calls, each argument ``key=value`` with a Python literal or JSON value
(``'text'``, ``"text"``, ``True``, ``null``, ``[1, 2]``, ``{"k": None}``), as llama.cpp reads them
(``common/parsers/lfm2.cpp``). A value is read once it is whole, JSON first (double-quoted
escapes are JSON's), else as a Python literal; a name may hold dots (``Calendar.create_event``).
LFM2 templates list the tools between ``<|tool_list_start|>`` and ``<|tool_list_end|>``,
LFM2.5 ones after a plain ``List of tools: [``. Only some of them render a message's
``tool_calls``, so the history writes earlier calls into the message's text, as the
templates that do render them write them."""

from __future__ import annotations

import ast
import json
from enum import Enum
from typing import Any

from .gbnf import COMMA, WS, Grammar, Rules, lit, repeat
from .interface import Messages, Tools
from .jsoncall import JsonCalls
from .machine import Text
from .scan import MORE, escape, lead, loads, read_name

TOOL_CALL_START, TOOL_CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"
MARKERS = (TOOL_CALL_START, TOOL_CALL_END)
TOKEN = TOOL_CALL_START
EXAMPLE = f'{TOOL_CALL_START}[<function-name>(<arg-name>="<string value>", <arg-name>=<JSON value>)]{TOOL_CALL_END}'
VALUE_LIMIT = 1 << 20  # an argument's value longer than this is not read (the call fails)


def shown_by(template: str) -> bool:
    return ("<|tool_list_start|>" in template and "<|tool_list_end|>" in template) or (
        "List of tools: [" in template)


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """Each argument ``key=`` and a JSON value of its schema (JSON is one of the spellings the
    model writes), in any order, as llama.cpp's grammar allows."""
    alts = []
    for i, tool in enumerate(tools):
        props = (tool["function"].get("parameters") or {}).get("properties") or {}
        items = []
        for j, (pname, schema) in enumerate(props.items()):
            schema = schema if isinstance(schema, dict | bool) else {}  # not a schema: one that says nothing
            items.append(f'{lit(pname)} "=" {rules.value(schema, f"tool{i}-p{j}")}')
        arg = rules.rule(f"tool{i}-arg", " | ".join(items)) if items else ""
        args = f"({arg} ({COMMA} {arg})*)?" if arg else ""
        alts.append(f'{lit(tool["function"]["name"])} "(" {WS} {args} {WS} ")"')
    one = rules.rule("tool-call", " | ".join(alts))
    root = f'{lit(TOOL_CALL_START)} "[" {WS} {repeat(one, parallel, sep=COMMA)} {WS} "]" {lit(TOOL_CALL_END)}'
    return root, (r"<\|tool_call_start\|>",)


# --- history -------------------------------------------------------------------------------------

def history(messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
    return [_calls_as_text(m) for m in messages], tools


def call_text(calls: list[dict[str, Any]]) -> str:
    """Calls as the model writes them (each value as JSON, which it reads as well)."""
    out = []
    for c in calls:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {}
        items = args.items() if isinstance(args, dict) else ()
        out.append(f"{fn.get('name')}(" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in items) + ")")
    return f"{TOOL_CALL_START}[{', '.join(out)}]{TOOL_CALL_END}"


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return message
    content = message.get("content")
    text = (content if isinstance(content, str) else "") + call_text(message["tool_calls"])
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": text}


# --- values --------------------------------------------------------------------------------------

_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _literal(node: ast.AST) -> Any:
    """A Python literal's value; raises ValueError for anything else."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str | int | float | bool)):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values, strict=True):
            key = _literal(k) if k is not None else None
            if not isinstance(key, str):
                raise ValueError("a key that is not a string")
            out[key] = _literal(v)
        return out
    raise ValueError("not a literal")


def value_json(text: str) -> str | None:
    """The JSON text of an argument's value written as JSON or as a Python literal; None when it
    is neither."""
    text = text.strip()
    try:
        value = loads(text)
    except ValueError:
        try:
            value = _literal(ast.parse(text, mode="eval").body)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)  # 1e999 is no JSON number
    except (ValueError, RecursionError):
        return None


# --- the parser ----------------------------------------------------------------------------------

class Lfm2(Enum):
    BLOCK = "_s_block"  # after <|tool_call_start|>: the list's [
    LIST = "_s_list"  # inside the list, between calls
    NAME = "_s_name"  # a call's name, up to (
    ARGS = "_s_args"  # inside a call's parentheses, between arguments
    VALUE = "_s_value"  # an argument's value, up to , or ) outside strings and brackets
    CLOSE = "_s_close"  # after the list's ]: <|tool_call_end|>


_NAME_BAD = " \t\r\n[](){}\"'<>=,;"
_BROKEN = ((TOOL_CALL_END, True),)


class Parser(JsonCalls):
    OPENERS = (TOOL_CALL_START,)
    STRAYS = (TOOL_CALL_END,)
    BLOCKS = frozenset({Lfm2.BLOCK, Lfm2.LIST, Lfm2.CLOSE})
    _args_read = 0  # the open call's arguments read so far
    _value = ""  # the value being read
    _quote = ""  # the quote of the string it is inside ("" outside strings)
    _esc = False
    _depth = 0  # brackets open in it

    def _opened(self, marker: str) -> None:
        self._open(Lfm2.BLOCK)

    def _broken(self, error: str) -> None:
        self._junk(_BROKEN, error)
        self._after = Text.TEXT

    def _s_block(self, final: bool) -> bool:
        if self._skip_ws():
            return True
        if self._buf[0] == "[":
            self._take(1)
            self._go(Lfm2.LIST)
            return True
        self._new_call()
        self._broken("not a list of calls")
        return True

    def _s_list(self, final: bool) -> bool:
        if self._skip_ws(","):
            return True
        if self._buf[0] == "]":
            self._take(1)
            self._go(Lfm2.CLOSE)
            return True
        m = lead(self._buf, (TOOL_CALL_END,), final)
        if m == "":
            return False
        if m:
            self._take(len(m))
            self._close_block()
            return True
        self._new_call()
        self._go(Lfm2.NAME)
        return True

    def _s_name(self, final: bool) -> bool:
        call = self._current
        r = read_name(self._buf, ("(",), final, bad=_NAME_BAD)
        if r == MORE:
            return False
        if not isinstance(r, tuple) or not r[0]:
            self._broken("a malformed call")
            return True
        self._take(len(r[0]) + 1)
        self._name(call, r[0])
        if not call.error:
            self._begin(call)
        self._args_read = 0
        self._go(Lfm2.ARGS)
        return True

    def _s_args(self, final: bool) -> bool:
        call = self._current
        if self._skip_ws(","):
            return True
        if self._buf[0] == ")":
            self._take(1)
            self._args(call, "}" if self._args_read else "{}")
            self._end_call()
            self._go(Lfm2.LIST)
            return True
        r = read_name(self._buf, ("=",), final, bad=_NAME_BAD)
        if r == MORE:
            return False
        if not isinstance(r, tuple) or not r[0]:
            self._broken("a malformed argument")
            return True
        self._take(len(r[0]) + 1)
        self._args(call, ("{" if not self._args_read else ", ") + f'"{escape(r[0])}": ')
        self._args_read += 1
        self._value, self._quote, self._esc, self._depth = "", "", False, 0
        self._go(Lfm2.VALUE)
        return True

    def _s_value(self, final: bool) -> bool:
        buf = self._buf
        i, end = 0, False
        while i < len(buf):
            c = buf[i]
            if self._quote:
                if self._esc:
                    self._esc = False
                elif c == "\\":
                    self._esc = True
                elif c == self._quote:
                    self._quote = ""
            elif c == "<" and buf.startswith(TOOL_CALL_END, i) or not final and TOOL_CALL_END.startswith(buf[i:]):
                break
            elif c in "\"'":
                self._quote = c
            elif c in "[{(":
                self._depth += 1
            elif c in "]})":
                if not self._depth:
                    if c == ")":
                        end = True
                        break
                    self._depth = 1  # a stray closer: the value will not parse
                self._depth -= 1
            elif c == "," and not self._depth:
                end = True
                break
            i += 1
        self._value += self._take(i)
        if len(self._value) > VALUE_LIMIT:
            self._broken("an argument's value is too long")
            return True
        if end:
            value = value_json(self._value)
            if value is None:
                self._broken("an argument's value is not a literal")
                return True
            self._args(self._current, value)
            self._go(Lfm2.ARGS)
            return True
        if self._buf.startswith(TOOL_CALL_END):  # the call was cut off: the list is over
            self._end_call("the call was cut off")
            self._go(Lfm2.CLOSE)
            return True
        return i > 0  # more to come (the end of the answer ends the call)

    def _s_close(self, final: bool) -> bool:
        return self._end_block(TOOL_CALL_END, final)
