"""minimax_m3: MiniMax M3, every tag behind the namespace token ``]<]minimax[>[`` (``NS``):
``NS<tool_call>\\nNS<invoke name="N">NS<P>VALUE NS</P>NS</invoke>\\nNS</tool_call>``. A parameter's tag
is its name; objects and arrays are written out as elements (an object's keys as tags, an
array's values as ``NS<item>``), read by the parameter's schema as llama.cpp reads them: a value
whose schema allows a string is the raw text up to its closing tag, a union tries its
alternatives in order, an object or array is read as elements, anything else is JSON. Its
thinking is ``<mm:think>...</mm:think>`` (``reasoning``; a turn without thinking opens with a
bare ``</mm:think>``). Invokes are read by ``minimax.Streamed`` as they stream: a value that is
raw text streams as it is written, any other is read whole at its closing tag."""

from __future__ import annotations

import json
import re
from typing import Any

from ..schemacheck import allows_any
from .gbnf import WS, Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .minimax import Streamed, _raw
from .scan import WS as SPACE
from .scan import loads, typed
from .xmlcall import Function

NS = "]<]minimax[>["
CALLS_BEGIN, CALLS_END = NS + "<tool_call>", NS + "</tool_call>"
INVOKE, INVOKE_END = NS + '<invoke name="', NS + "</invoke>"
ITEM = "item"
MARKERS = (NS,)
TOKEN = NS
EXAMPLE = (f'{CALLS_BEGIN}\n{INVOKE}example_function_name">{NS}<example_parameter>value{NS}</example_parameter>'
           f"{INVOKE_END}\n{CALLS_END}")
DEPTH = 8  # deeper schemas are written as raw text in the grammar


def shown_by(template: str) -> bool:
    return NS in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def _alternatives(schema: Any) -> list[Any]:
    if not isinstance(schema, dict):
        return []
    return [s for key in ("anyOf", "oneOf") for s in schema.get(key) or []]


def _properties(schema: Any) -> dict[str, Any] | None:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) and props else None


def _is_array(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "array"


def _value_rule(rules: Rules, schema: Any, name: str, close: str, depth: int) -> str:
    end = lit(close)
    if _raw(schema) or depth > DEPTH:
        # NS begins with "]" and holds one more: text ending in "]" (a JSON array) or "]<" is
        # cut from ``until``'s reach, which would take that "]" with the close's first one
        return f'{rules.rule(name + "-text", until(close))} ("]" | "]<")* {end}'
    alts = _alternatives(schema)
    if alts:
        return "(" + " | ".join(_value_rule(rules, a, f"{name}-{k}", close, depth + 1)
                                for k, a in enumerate(alts)) + ")"
    props = _properties(schema)
    if props is not None:
        return f"{_members_rule(rules, props, name, depth + 1)} {WS} {end}"
    if _is_array(schema):
        item = _value_rule(rules, schema.get("items", {}), name + "-item", f"{NS}</{ITEM}>", depth + 1)
        return f'({WS} {lit(f"{NS}<{ITEM}>")} {item})* {WS} {end}'
    return f"{rules.value(schema, name)} {end}"


def _members_rule(rules: Rules, props: dict[str, Any], name: str, depth: int) -> str:
    items = []
    for j, (key, schema) in enumerate(props.items()):
        schema = schema if isinstance(schema, dict | bool) else {}
        value = _value_rule(rules, schema, f"{name}-{j}", f"{NS}</{key}>", depth)
        items.append(rules.rule(f"{name}-{j}-el", f"{lit(f'{NS}<{key}>')} {value}"))
    return f'({WS} ({" | ".join(items)}))*' if items else ""


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = []
    for i, tool in enumerate(tools):
        props = (tool["function"].get("parameters") or {}).get("properties") or {}
        body = _members_rule(rules, props, f"tool{i}", 0) if isinstance(props, dict) else ""
        alts.append(f'{lit(tool["function"]["name"])} "\\">" {body} {WS}')
    invoke = rules.rule("tool-call", f'{lit(INVOKE)} ({" | ".join(alts)}) {lit(INVOKE_END)}')
    return f'{lit(CALLS_BEGIN)} {WS} {repeat(invoke, parallel)} {WS} {lit(CALLS_END)}', (re.escape(CALLS_BEGIN),)


history = history_as_is

_TAG = re.compile(r"([^\s<>/]{1,256})>")


def _skip(s: str, i: int) -> int:
    return len(s) - len(s[i:].lstrip(SPACE))


def _close_at(s: str, i: int, close: str) -> int:
    j = s.find(close, i)
    if j < 0:
        raise ValueError(f"no {close}")
    return j


def _element(s: str, i: int) -> tuple[str, int] | None:
    """The tag of the element opening at ``s[i]`` and where its value begins, or None."""
    if not s.startswith(NS + "<", i) or s.startswith(NS + "</", i):
        return None
    m = _TAG.match(s, i + len(NS) + 1)
    if m is None:
        raise ValueError("a malformed element")
    return m.group(1), m.end()


def _members(s: str, i: int, props: dict[str, Any] | None, close: str) -> tuple[dict[str, Any], int]:
    """An object's elements up to ``close`` (consumed); ``props`` None: a schema that says nothing."""
    out: dict[str, Any] = {}
    while True:
        i = _skip(s, i)
        if s.startswith(close, i):
            return out, i + len(close)
        el = _element(s, i)
        if el is None:
            raise ValueError("text between elements")
        key, i = el
        if props is not None and key not in props:
            raise ValueError(f"an unknown element {key!r}")
        out[key], i = _value(s, i, props.get(key) if props is not None else None, f"{NS}</{key}>")


def _items(s: str, i: int, schema: Any, close: str) -> tuple[list[Any], int]:
    out: list[Any] = []
    while True:
        i = _skip(s, i)
        if s.startswith(close, i):
            return out, i + len(close)
        if not s.startswith(f"{NS}<{ITEM}>", i):
            raise ValueError("an array element that is not an item")
        value, i = _value(s, i + len(f"{NS}<{ITEM}>"), schema, f"{NS}</{ITEM}>")
        out.append(value)


def _value(s: str, i: int, schema: Any, close: str) -> tuple[Any, int]:
    """The value at ``s[i]`` up to ``close`` (consumed), read by ``schema`` (None: unknown)."""
    if schema is None or allows_any(schema):  # by what is written: elements, items, or text (JSON where it parses)
        j = _skip(s, i)
        if s.startswith(f"{NS}<{ITEM}>", j):
            return _items(s, j, None, close)
        if _element(s, j) is not None:
            return _members(s, j, None, close)
        end = _close_at(s, i, close)
        return loads(typed(s[i:end], None)), end + len(close)
    if _raw(schema):
        end = _close_at(s, i, close)
        return s[i:end], end + len(close)
    alts = _alternatives(schema)
    if alts:
        for alt in alts:
            try:
                return _value(s, i, alt, close)
            except ValueError:
                continue
        raise ValueError("no alternative of the union reads")
    props = _properties(schema)
    if props is not None:
        return _members(s, i, props, close)
    if _is_array(schema):
        return _items(s, i, schema.get("items"), close)
    end = _close_at(s, i, close)
    return loads(s[i:end].strip()), end + len(close)


class Parser(Streamed):
    OPENERS = (CALLS_BEGIN,)
    STRAYS = (CALLS_END,)
    BEGIN, END, OPEN, CLOSE = CALLS_BEGIN, CALLS_END, INVOKE, INVOKE_END
    FUNCTION_BLOCK, FUNCTION_MARKERS, PARAMETER_MARKERS = (BEGIN, END), (OPEN, CLOSE), (NS + "<", "")
    NAME_END = '">'
    NAME_BAD = '\n<>"'
    PARAMETER_NAME_END, PARAMETER_NAME_BAD = ">", SPACE + "<>/"

    def _parameter_end(self, name: str) -> str:
        return f"{NS}</{name}>"

    def _props(self) -> dict[str, Any] | None:
        """The call's tool's parameters (None: it names none, any element is taken)."""
        return _properties(self.params.get(self._current.name or "", {}))

    def _text_value(self, fn: Function) -> bool:
        return fn.schema is not None and not allows_any(fn.schema) and _raw(fn.schema)

    def _inside(self, fn: Function) -> bool:
        return fn.value.count(f"{NS}<{fn.name}>") > fn.value.count(fn.close)

    def _value_json(self, fn: Function, value: str) -> str:
        props = self._props()
        if props is not None and fn.name not in props:
            raise ValueError(f"an unknown element {fn.name!r}")
        got, end = _value(value + fn.close, 0, fn.schema if props is not None else None, fn.close)
        if end != len(value) + len(fn.close):
            raise ValueError("text after the value")
        return json.dumps(got, ensure_ascii=False)
