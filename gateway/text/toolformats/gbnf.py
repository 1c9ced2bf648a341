"""GBNF text shared by the formats' call grammars (llama.cpp's grammar syntax). A format's
``grammar`` writes the call's syntax around each tool's arguments; the rules for the arguments
come from ``Rules``, which the worker implements with llama-cpp-python's JSON-schema converter
(``worker/toolgrammar.py``), so nothing here loads llama.cpp."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from ..schemacheck import allows_any

WS = '[ \\t\\n]{0,4}'  # bounded: an unconstrained model would run away in whitespace
COMMA, SEMICOLON = f'{WS} "," {WS}', f'{WS} ";" {WS}'

Grammar = tuple[str, tuple[str, ...]]  # a format's root rule, and the trigger patterns that open a call


class Rules(Protocol):
    """The grammar being built: rules for a tool's arguments or a value's schema, and new rules."""

    def args(self, tool: dict[str, Any], i: int) -> str:
        """The rule for the arguments object of ``tool``, the ``i``-th of the request's tools."""
        ...

    def value(self, schema: dict[str, Any] | bool, name: str) -> str:
        """A rule, named after ``name``, for a value of ``schema``."""
        ...

    def rule(self, name: str, body: str) -> str:
        """Add a rule; returns its name."""
        ...


def lit(text: str) -> str:
    return json.dumps(text)  # a GBNF literal: JSON's escapes are GBNF's


def until(stop: str) -> str:
    """Any text without ``stop`` in it (a prefix of ``stop`` followed by a character that does
    not continue it; that character is then taken, so a stop that overlaps itself could slip
    through after a false start, which a model writing under the grammar does not do)."""
    def cls(c: str) -> str:
        return "[^" + ("\\" + c if c in "\\]^-[" else c) + "]"
    return "(" + " | ".join((lit(stop[:i]) + " " if i else "") + cls(stop[i]) for i in range(len(stop))) + ")*"


def json_call(rules: Rules, tools: list[dict[str, Any]], args_key: str) -> str:
    """``{"name": "NAME", "<args_key>": {...}}`` for any of the tools."""
    alts = []
    for i, tool in enumerate(tools):
        name = tool["function"]["name"]
        alts.append(f'{lit(json.dumps(name))} {WS} "," {WS} {lit(json.dumps(args_key))} {WS} ":" {WS} '
                    f'{rules.args(tool, i)}')
    return rules.rule("call", f'"{{" {WS} "\\"name\\"" {WS} ":" {WS} ({" | ".join(alts)}) {WS} "}}"')


def repeat(item: str, parallel: bool, sep: str = WS) -> str:
    return f"{item} ({sep} {item})*" if parallel else item


def string_or_any(schema: Any) -> bool:
    """A value written as raw text: its schema is a string's, or allows any value."""
    return allows_any(schema) or (isinstance(schema, dict) and schema.get("type") == "string")


def parameters(rules: Rules, tools: list[dict[str, Any]], text: str, item: Callable[[str, str, bool], str], *,
               raw: Callable[[Any], bool] = string_or_any) -> list[tuple[str, str]]:
    """The formats that write each argument as its own element: per tool, its name and the GBNF of
    its parameters in any order (``(P | P ...)*``, "" where it has none), each ``item(name, value,
    is_raw)``: a value whose schema ``raw`` takes is ``text`` (raw text up to its closer), any
    other JSON of its schema (a rule named ``tool{i}-p{j}``)."""
    out = []
    for i, tool in enumerate(tools):
        params = (tool["function"].get("parameters") or {}).get("properties") or {}
        items = []
        for j, (pname, schema) in enumerate(params.items()):
            schema = schema if isinstance(schema, dict | bool) else {}  # not a schema: one that says nothing
            is_raw = raw(schema)
            items.append(item(pname, text if is_raw else rules.value(schema, f"tool{i}-p{j}"), is_raw))
        out.append((tool["function"]["name"], f'({" | ".join(items)})*' if items else ""))
    return out
