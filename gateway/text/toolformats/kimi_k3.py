"""kimi_k3: Kimi K3's tags, each ``<|open|>TAG ATTRS<|sep|>`` ... ``<|close|>TAG<|sep|>``: an answer
is a think section, a response section, then the calls in a tools section,
``<|open|>tools<|sep|><|open|>call tool="N" index="1"<|sep|><|open|>argument key="P" type="T"<|sep|>VALUE
<|close|>argument<|sep|>...<|close|>call<|sep|><|close|>tools<|sep|>``, and ``<|close|>message<|sep|>``.
A value is typed by the tool's schema (a string where it names no type), as
llama.cpp reads it; arguments written as one ``<|open|>json<|sep|>`` object are read too. The
think and response markers are the thinking format's (``reasoning``'s ``kimi_k3``); when thinking
is not split they, and the message's end, are dropped here. Calls are read whole by
``minimax.Invokes``."""

from __future__ import annotations

import re
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .minimax import Invokes, _raw
from .scan import WS as SPACE
from .scan import loads, typed

TAG_OPEN, TAG_CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
TOOLS_START, TOOLS_END = f"{TAG_OPEN}tools{SEP}", f"{TAG_CLOSE}tools{SEP}"
CALL_START, CALL_END = f'{TAG_OPEN}call tool="', f"{TAG_CLOSE}call{SEP}"
ARG_START, ARG_END = f'{TAG_OPEN}argument key="', f"{TAG_CLOSE}argument{SEP}"
JSON_START, JSON_END = f"{TAG_OPEN}json", f"{TAG_CLOSE}json{SEP}"
# the sections around the calls: the thinking format's markers, dropped here when it is not split
SECTIONS = (f"{TAG_OPEN}think{SEP}", f"{TAG_CLOSE}think{SEP}", f"{TAG_OPEN}response{SEP}", f"{TAG_CLOSE}response{SEP}",
            f"{TAG_CLOSE}message{SEP}", EOM)
MARKERS = (TAG_OPEN, TAG_CLOSE, SEP, EOM)
TOKEN = None  # its markers are generic tags: the template shows the format
EXAMPLE = (f'{TOOLS_START}{CALL_START}example_function_name" index="1"{SEP}{ARG_START}example_parameter" type="string"'
           f"{SEP}value{ARG_END}{CALL_END}{TOOLS_END}")


def shown_by(template: str) -> bool:
    return TAG_OPEN in template and TAG_CLOSE in template and "open_tag('call'" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    alts = []
    for i, tool in enumerate(tools):
        params = (tool["function"].get("parameters") or {}).get("properties") or {}
        items = []
        for j, (pname, schema) in enumerate(params.items()):
            schema = schema if isinstance(schema, dict | bool) else {}
            raw = _raw(schema) or not (isinstance(schema, dict) and isinstance(schema.get("type"), str))
            value = rules.rule(f"tool{i}-p{j}-text", until(ARG_END)) if raw else rules.value(schema, f"tool{i}-p{j}")
            items.append(f'{lit(ARG_START)} {lit(pname)} "\\" type=\\"" [a-z]+ "\\"" {lit(SEP)} {value} {lit(ARG_END)}')
        body = f'({" | ".join(items)})*' if items else ""
        alts.append(f'{lit(tool["function"]["name"])} "\\" index=\\"" [0-9]{{1,4}} "\\"" {lit(SEP)} {body}')
    call = rules.rule("tool-call", f'{lit(CALL_START)} ({" | ".join(alts)}) {lit(CALL_END)}')
    return (f'{lit(TOOLS_START)} {repeat(call, parallel)} {lit(TOOLS_END)} {lit(f"{TAG_CLOSE}message{SEP}")}? {WS}',
            (re.escape(TOOLS_START),))


history = history_as_is

_HEAD = re.compile(r'([^"<>\n]{1,256})"[^<>]{0,256}?' + re.escape(SEP))


class Parser(Invokes):
    OPENERS = (TOOLS_START,)
    STRAYS = (TOOLS_END, *SECTIONS)
    BEGIN, END, OPEN, CLOSE = TOOLS_START, TOOLS_END, CALL_START, CALL_END

    def _read_head(self, body: str) -> tuple[str, int]:
        m = _HEAD.match(body)
        if m is None:
            raise ValueError("a malformed call")
        return m.group(1).strip(), m.end()

    def _read_invoke(self, body: str, schema: dict[str, Any]) -> dict[str, Any]:
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        assert isinstance(props, dict)
        out: dict[str, Any] = {}
        i = 0
        while True:
            i = len(body) - len(body[i:].lstrip(SPACE))
            if i == len(body):
                return out
            if body.startswith(JSON_START, i):  # the arguments as one JSON object
                start, end = body.find(SEP, i), body.find(JSON_END, i)
                if start < 0 or end < start:
                    raise ValueError("a malformed json element")
                args = loads(body[start + len(SEP):end])
                if not isinstance(args, dict):
                    raise ValueError("the arguments are not an object")
                out.update(args)
                i = end + len(JSON_END)
                continue
            if not body.startswith(ARG_START, i):
                raise ValueError("text between arguments")
            m = _HEAD.match(body, i + len(ARG_START))
            end = body.find(ARG_END, i)
            if m is None or end < m.end():
                raise ValueError("a malformed argument")
            key, value = m.group(1), body[m.end():end]
            # as llama.cpp: the schema's type, a string where it names none
            prop = props.get(key)
            kind = prop.get("type") if isinstance(prop, dict) else None
            out[key] = loads(typed(value, {kind if isinstance(kind, str) else "string"}))
            i = end + len(ARG_END)
