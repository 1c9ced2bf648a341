"""The grammar that makes a model's tool calls parse: built from the request's tools in the
model's call format, switched on when the model opens a call (llama.cpp's lazy grammar:
``llama_sampler_init_grammar_lazy_patterns``), or from the first token when a call is required.

A format's grammar starts at its trigger (the text that opens a call) and holds the call's
syntax around each tool's arguments, which llama-cpp-python's JSON-schema converter writes.
Where a format comes in variants (Mistral's JSON array or ``name[ARGS]``; DeepSeek R1's
fenced JSON or V3.1's bare object) the grammar allows each, and the model takes the one it
was trained on. Imported by the worker only: it loads llama_cpp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..schemacheck import allows_any

WS = '[ \\t\\n]{0,4}'  # bounded: an unconstrained model would run away in whitespace
COMMA, SEMICOLON = f'{WS} "," {WS}', f'{WS} ";" {WS}'
AGAIN = f'{WS} "[TOOL_CALLS]"'  # Mistral's name[ARGS] form repeats the marker before each call


@dataclass(frozen=True)
class ToolGrammar:
    gbnf: str
    triggers: tuple[str, ...]  # regular expressions (llama.cpp's trigger patterns); empty when not lazy
    lazy: bool


class Converter:
    """llama-cpp-python's JSON-schema converter, holding every tool's argument rules."""

    def __init__(self) -> None:
        from .schemagrammar import Converter as SchemaConverter

        self._c = SchemaConverter()  # integer bounds enforced

    def args(self, tool: dict[str, Any], i: int) -> str:
        """A tool's arguments: always an object (a parameters schema without a ``type`` is one)."""
        schema = {"type": "object", **(tool["function"].get("parameters") or {})}
        return self._c.visit(self._c.resolve_refs(schema, f"tool{i}"), f"tool{i}-args")

    def value(self, schema: dict[str, Any] | bool, name: str) -> str:
        return self._c.visit(schema, name)

    def rule(self, name: str, body: str) -> str:
        return self._c._add_rule(name, body)

    def grammar(self) -> str:
        return self._c.format_grammar()


def lit(text: str) -> str:
    return json.dumps(text)  # a GBNF literal: JSON's escapes are GBNF's


def until(stop: str) -> str:
    """Any text without ``stop`` in it (a prefix of ``stop`` followed by a character that does
    not continue it; that character is then taken, so a stop that overlaps itself could slip
    through after a false start, which a model writing under the grammar does not do)."""
    def cls(c: str) -> str:
        return "[^" + ("\\" + c if c in "\\]^-[" else c) + "]"
    return "(" + " | ".join((lit(stop[:i]) + " " if i else "") + cls(stop[i]) for i in range(len(stop))) + ")*"


def _json_call(conv: Converter, tools: list[dict[str, Any]], args_key: str) -> str:
    """``{"name": "NAME", "<args_key>": {...}}`` for any of the tools."""
    alts = []
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        alts.append(f'{lit(json.dumps(name))} {WS} "," {WS} {lit(json.dumps(args_key))} {WS} ":" {WS} '
                    f'{conv.args(tool, i)}')
    return conv.rule("call", f'"{{" {WS} "\\"name\\"" {WS} ":" {WS} ({" | ".join(alts)}) {WS} "}}"')


def _repeat(item: str, parallel: bool, sep: str = WS) -> str:
    return f"{item} ({sep} {item})*" if parallel else item


def build(fmt: str, tools: list[dict[str, Any]], *, required: bool, name: str | None = None,
          parallel: bool = True, think: str | None = None) -> ToolGrammar:
    """The grammar for calls in ``fmt`` to ``tools`` (only the one named ``name``, if given).
    A required call (constrained from the first token) may follow the model's thinking:
    ``think`` is ``"optional"`` for a ``<think>`` block the model may open, ``"open"`` when the
    prompt already opened it (the answer starts inside it); gpt-oss's analysis message is always
    allowed first. A lazy grammar starts at its trigger, after any thinking, so needs neither.
    Raises ``ValueError`` for a format without a grammar and whatever the converter raises for
    a schema it cannot follow."""
    if name is not None:
        tools = [t for t in tools if t["function"]["name"] == name]
    conv = Converter()
    triggers: tuple[str, ...]
    if fmt in ("hermes", "plain"):
        call = _json_call(conv, tools, "arguments")
        one = conv.rule("tool-call", f'"<tool_call>" {WS} {call} {WS} "</tool_call>"')
        root, triggers = _repeat(one, parallel), (r"<tool_call>",)
    elif fmt == "qwen3_coder":
        root, triggers = _repeat(_xml_call(conv, tools), parallel), (r"<tool_call>",)
    elif fmt == "llama3":
        call = _json_call(conv, tools, "parameters")
        root = f'"<|python_tag|>"? {WS} {_repeat(call, parallel, sep=SEMICOLON)}'
        triggers = (r"<\|python_tag\|>", r'^\s*(\{\s*"name")[\s\S]*$')
    elif fmt == "mistral":
        calls = _repeat(_json_call(conv, tools, "arguments"), parallel, sep=COMMA)
        array = conv.rule("call-array", f'"[" {WS} {calls} {WS} "]"')
        named = conv.rule("call-named", " | ".join(
            f'{lit(t["function"]["name"])} ("[CALL_ID]" [a-zA-Z0-9]+)? "[ARGS]" {conv.args(t, i)}'
            for i, t in enumerate(tools)))
        root = f'"[TOOL_CALLS]" ({array} | {_repeat(named, parallel, sep=AGAIN)})'
        triggers = (r"\[TOOL_CALLS\]",)
    elif fmt == "harmony":
        # The call ends with its arguments: <|call|> is an end-of-generation token, which the
        # grammar lets through once it is complete (a literal here would have to be spelled out).
        named = " | ".join(f'{lit(t["function"]["name"])} header-rest {conv.args(t, i)}' for i, t in enumerate(tools))
        conv.rule("header-rest", '[^<]* ("<|constrain|>" [^<]* | "<|channel|>" [^<]*)* "<|message|>"')
        root, triggers = f'"to=functions." ({named})', (r"(to=functions\.)",)
        if required:  # after the prompt's "<|start|>assistant": optional analysis, then the recipient
            analysis = f'"<|channel|>analysis<|message|>" {until("<|end|>")} "<|end|><|start|>assistant"'
            root = f'({analysis})? ("<|channel|>commentary " | " ") {root}'
    elif fmt == "deepseek":
        sep, begin, end = "<｜tool▁sep｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"
        alts = []
        for i, t in enumerate(tools):
            n, args = lit(t["function"]["name"]), conv.args(t, i)
            alts.append(f'"function" {lit(sep)} {n} "\\n```json\\n" {args} "\\n```"')  # R1, V3
            alts.append(f'{n} {lit(sep)} {args}')  # V3.1 and later
        one = conv.rule("tool-call", f'{lit(begin)} ({" | ".join(alts)}) {lit(end)}')
        root = f'"<｜tool▁calls▁begin｜>" {_repeat(one, parallel)} "<｜tool▁calls▁end｜>"'
        triggers = (r"<｜tool▁calls▁begin｜>",)
    else:
        raise ValueError(f"no tool-call grammar for the format {fmt!r}")
    if required and think == "optional":
        root = f'("<think>" {until("</think>")} "</think>" {WS})? {root}'
    elif required and think == "open":
        root = f'{until("</think>")} "</think>" {WS} {root}'
    conv.rule("root", root)
    return ToolGrammar(conv.grammar(), () if required else triggers, not required)


def _xml_call(conv: Converter, tools: list[dict[str, Any]]) -> str:
    """Qwen3-Coder's ``<function=NAME>`` with one ``<parameter=P>`` per argument; a string
    argument is raw text up to ``</parameter>``, and so is one whose schema allows any value
    (the parser reads it as JSON where it parses, a string otherwise); any other is JSON of its
    schema."""
    text = conv.rule("param-text", until("</parameter>"))
    alts = []
    for i, tool in enumerate(tools):
        params = (tool["function"].get("parameters") or {}).get("properties") or {}
        items = []
        for j, (pname, schema) in enumerate(params.items()):
            schema = schema if isinstance(schema, dict | bool) else {}  # not a schema: one that says nothing
            raw = allows_any(schema) or (isinstance(schema, dict) and schema.get("type") == "string")
            value = text if raw else conv.value(schema, f"tool{i}-p{j}")
            items.append(f'"<parameter=" {lit(pname)} ">" "\\n"? {value} "\\n"? "</parameter>" {WS}')
        body = f'({" | ".join(items)})*' if items else ""
        alts.append(f'{lit(tool["function"]["name"])} ">" {WS} {body}')
    return conv.rule("tool-call", f'"<tool_call>" {WS} "<function=" ({" | ".join(alts)}) "</function>" {WS} '
                                  '"</tool_call>"')
