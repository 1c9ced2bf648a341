"""qwen3_coder: ``<tool_call>\\n<function=N>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
(Qwen3-Coder, Qwen 3.5, Nemotron 3 Nano, StepFun 3.5); the function is read by ``xmlcall``,
each value typed by the tool's schema. Qwen3-Coder sometimes leaves out ``<tool_call>``, so a
bare ``<function=N>`` opens a call too when N is one of the request's tools. Inside
``<tool_call>`` this format and hermes read either syntax (JSON object or ``<function=``)."""

from __future__ import annotations

from typing import Any

from .gbnf import WS, Grammar, Rules, lit, parameters, repeat, until
from .hermes import TOOL_CALL, TOOL_CALL_END
from .hermes import Parser as HermesParser
from .interface import history_as_is
from .machine import Text
from .xmlcall import FUNCTION, PARAMETER, Xml

MARKERS = (TOOL_CALL, TOOL_CALL_END)
TOKEN = None
EXAMPLE = ("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter>\nvalue\n"
           "</parameter>\n</function>\n</tool_call>")


def shown_by(template: str) -> bool:
    return TOOL_CALL in template and FUNCTION in template and PARAMETER in template


def example(chat_template: str | None) -> str:
    return EXAMPLE


def grammar(rules: Rules, tools: list[dict[str, Any]], *, required: bool, parallel: bool) -> Grammar:
    """A string argument is raw text up to ``</parameter>``, and so is one whose schema allows
    any value (the parser reads it as JSON where it parses, a string otherwise); any other is
    JSON of its schema."""
    text = rules.rule("param-text", until("</parameter>"))
    def item(pname: str, value: str, raw: bool) -> str:
        return f'"<parameter=" {lit(pname)} ">" "\\n"? {value} "\\n"? "</parameter>" {WS}'

    alts = [f'{lit(name)} ">" {WS} {body}' for name, body in parameters(rules, tools, text, item)]
    call = rules.rule("tool-call", f'"<tool_call>" {WS} "<function=" ({" | ".join(alts)}) "</function>" {WS} '
                                   '"</tool_call>"')
    return repeat(call, parallel), (r"<tool_call>",)


history = history_as_is


class Parser(HermesParser):
    OPENERS = (TOOL_CALL, FUNCTION)
    THINKING_ENDS = (TOOL_CALL,)  # as llama.cpp reads Qwen 3.5: a call ends thinking left open

    def _opened(self, marker: str) -> None:
        if marker == FUNCTION:  # a bare <function=NAME>
            self._open(Xml.NAME)
            self._new_call()
            self._function(bare=True, after=Text.TEXT)
        else:
            super()._opened(marker)
