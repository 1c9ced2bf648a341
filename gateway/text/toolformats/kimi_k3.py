"""kimi_k3: Kimi K3's tags, each ``<|open|>TAG ATTRS<|sep|>`` ... ``<|close|>TAG<|sep|>``: an answer
is a think section, a response section, then the calls in a tools section,
``<|open|>tools<|sep|><|open|>call tool="N" index="1"<|sep|><|open|>argument key="P" type="T"<|sep|>VALUE
<|close|>argument<|sep|>...<|close|>call<|sep|><|close|>tools<|sep|>``, and ``<|close|>message<|sep|>``.
A value is typed by the tool's schema (a string where it names no type), as
llama.cpp reads it; arguments written as one ``<|open|>json<|sep|>`` object are read too. The
think and response markers are the thinking format's (``reasoning``'s ``kimi_k3``); when thinking
is not split they, and the message's end, are dropped here, tools or not (``FRAMES``: every answer
is read by this parser, as llama.cpp reads K3's). Calls are read by
``minimax.Streamed`` as they stream; a ``json`` element is read whole at its end."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

from .gbnf import WS, Grammar, Rules, lit, repeat, until
from .interface import history_as_is
from .minimax import Streamed, _raw
from .scan import loads
from .scan import until as until_marker
from .xmlcall import Xml

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

class K3(Enum):
    JSON = "_s_json"  # a call's json element, up to its closer


class Parser(Streamed):
    OPENERS = (TOOLS_START,)
    STRAYS = (TOOLS_END, *SECTIONS)
    BEGIN, END, OPEN, CLOSE = TOOLS_START, TOOLS_END, CALL_START, CALL_END
    FUNCTION_BLOCK, FUNCTION_MARKERS, PARAMETER_MARKERS = (BEGIN, END), (OPEN, CLOSE), (ARG_START, ARG_END)
    NAME_END = PARAMETER_NAME_END = '"'
    ATTRS_END = SEP  # index="N" after a call's name, type="T" after an argument's: the schema types the value
    NAME_BAD = PARAMETER_NAME_BAD = '\n<>"'
    INNER = (JSON_START,)
    # every answer is a message of sections, tools or not: read without tools too (the sections'
    # markers dropped), as llama.cpp's parser of K3 reads it whatever the request
    FRAMES = True

    def _types(self, schema: Any) -> set[str] | None:
        # as llama.cpp: the schema's type, a string where it names none
        kind = schema.get("type") if isinstance(schema, dict) else None
        return {kind if isinstance(kind, str) else "string"}

    def _inner(self, marker: str) -> None:
        self._take(len(marker))
        self._fn.value = ""
        self._go(K3.JSON)

    def _s_json(self, final: bool) -> bool:
        """The arguments as one JSON object, ``<|open|>json ATTRS<|sep|>{...}<|close|>json<|sep|>``,
        its members added to the arguments."""
        fn = self._fn
        text, marker = until_marker(self._buf, (JSON_END, CALL_END, TOOLS_END), final)
        fn.value += self._take(len(text))
        if marker is None:
            return bool(text)
        attrs, sep, body = fn.value.partition(SEP)
        try:
            args = loads(body) if sep and marker == JSON_END and not set(attrs) & set("<>") else None
        except ValueError:
            args = None
        if not isinstance(args, dict):
            self._broken("a malformed json element")
            return True
        self._take(len(marker))
        for key, value in args.items():
            self._member(key, json.dumps(value, ensure_ascii=False))
        self._go(Xml.FUNC)
        return True
