"""apriel: ``<tool_calls>[{"name": N, "arguments": {...}}, ...]</tool_calls>`` (ServiceNow
Apriel 1.5 and 1.6), read as nemotron_v2's array. Apriel's thinking ends at
``[BEGIN FINAL RESPONSE]`` (the ``apriel`` reasoning format)."""

from __future__ import annotations

from typing import Any

from .gbnf import Grammar, Rules
from .interface import history_as_is
from .nemotron_v2 import ArrayParser, array_grammar

TOOL_CALLS, TOOL_CALLS_END = "<tool_calls>", "</tool_calls>"
MARKERS = (TOOL_CALLS, TOOL_CALLS_END)
TOKEN = None
EXAMPLE = '<tool_calls>[{"name": <function-name>, "arguments": <args-json-object>}]</tool_calls>'


def shown_by(template: str) -> bool:
    return f"{TOOL_CALLS}[" in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    return array_grammar(rules, tools, TOOL_CALLS, TOOL_CALLS_END, parallel=parallel), (r"<tool_calls>",)


history = history_as_is


class Parser(ArrayParser):
    OPENERS = (TOOL_CALLS,)
    STRAYS = (TOOL_CALLS_END,)
    CLOSE = TOOL_CALLS_END
