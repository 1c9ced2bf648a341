"""The grammar that makes a model's tool calls parse: built from the request's tools in the
model's call format, switched on when the model opens a call (llama.cpp's lazy grammar:
``llama_sampler_init_grammar_lazy_patterns``), or from the first token when a call is required.

A format's grammar (its module in ``text/toolformats``) starts at its trigger (the text that
opens a call) and holds the call's syntax around each tool's arguments, which llama-cpp-python's
JSON-schema converter writes (``Converter`` here). Where a format comes in variants (Mistral's
JSON array or ``name[ARGS]``; DeepSeek R1's fenced JSON or V3.1's bare object) the grammar
allows each, and the model takes the one it was trained on. Imported by the worker only: it
loads llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..text.toolformats import TABLE
from ..text.toolformats.gbnf import WS, until


@dataclass(frozen=True)
class ToolGrammar:
    gbnf: str
    triggers: tuple[str, ...]  # regular expressions (llama.cpp's trigger patterns); empty when not lazy
    lazy: bool


class Converter:
    """llama-cpp-python's JSON-schema converter, holding every tool's argument rules (the
    ``gbnf.Rules`` the formats write their grammars through)."""

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


def build(fmt: str, tools: list[dict[str, Any]], *, required: bool, names: tuple[str, ...] | None = None,
          parallel: bool = True, think: str | None = None) -> ToolGrammar:
    """The grammar for calls in ``fmt`` to ``tools`` (only those ``names`` names, if given:
    a named tool choice or ``allowed_tools``).
    A required call (constrained from the first token) may follow the model's thinking:
    ``think`` is ``"optional"`` for a ``<think>`` block the model may open, ``"open"`` when the
    prompt already opened it (the answer starts inside it); gpt-oss's analysis message is always
    allowed first. A lazy grammar starts at its trigger, after any thinking, so needs neither.
    Raises ``ValueError`` for a format without a grammar and whatever the converter raises for
    a schema it cannot follow."""
    if names is not None:
        tools = [t for t in tools if t["function"]["name"] in names]
    if fmt not in TABLE:
        raise ValueError(f"no tool-call grammar for the format {fmt!r}")
    conv = Converter()
    root, triggers = TABLE[fmt].grammar(conv, tools, required=required, parallel=parallel)
    if required and think == "optional":
        root = f'("<think>" {until("</think>")} "</think>" {WS})? {root}'
    elif required and think == "open":
        root = f'{until("</think>")} "</think>" {WS} {root}'
    conv.rule("root", root)
    return ToolGrammar(conv.grammar(), () if required else triggers, not required)
