"""seed_oss: ``<seed:tool_call>\\n<function=N>\\n<parameter=P>VALUE</parameter>\\n</function>\\n</seed:tool_call>``
(ByteDance Seed-OSS), one function per block; the function is read by ``xmlcall``, each value
typed by the tool's schema, as qwen3_coder's. Its thinking is the ``seed`` reasoning format."""

from __future__ import annotations

from typing import Any

from .gbnf import WS, Grammar, Rules, lit, parameters, repeat, until
from .interface import history_as_is
from .xmlcall import FUNCTION, PARAMETER, Invokes

TOOL_CALL, TOOL_CALL_END = "<seed:tool_call>", "</seed:tool_call>"
MARKERS = (TOOL_CALL, TOOL_CALL_END)
TOKEN = TOOL_CALL
EXAMPLE = ("<seed:tool_call>\n<function=example_function_name>\n<parameter=example_parameter>value</parameter>\n"
           "</function>\n</seed:tool_call>")


def shown_by(template: str) -> bool:
    return TOOL_CALL in template and FUNCTION in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """As qwen3_coder's: a string argument (or one whose schema allows any value) is raw text up
    to ``</parameter>``, any other JSON of its schema."""
    text = rules.rule("param-text", until("</parameter>"))
    def item(pname: str, value: str, raw: bool) -> str:
        return f'"{PARAMETER}" {lit(pname)} ">" {value} "</parameter>" {WS}'

    alts = [f'{lit(name)} ">" {WS} {body}' for name, body in parameters(rules, tools, text, item)]
    call = rules.rule("tool-call", f'"{TOOL_CALL}" {WS} "{FUNCTION}" ({" | ".join(alts)}) "</function>" {WS} '
                                   f'"{TOOL_CALL_END}"')
    return repeat(call, parallel), (r"<seed:tool_call>",)


history = history_as_is


class Parser(Invokes):
    OPENERS = (TOOL_CALL,)
    STRAYS = (TOOL_CALL_END,)
    BEGIN, END, OPEN = TOOL_CALL, TOOL_CALL_END, FUNCTION
    FUNCTION_BLOCK = (TOOL_CALL, TOOL_CALL_END)
    VALUE_NEWLINES = False  # its template writes <parameter=P>VALUE</parameter>: every newline is the value's
