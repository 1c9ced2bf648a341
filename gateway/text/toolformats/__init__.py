"""Tool calls in a model's answer: which syntax a model writes them in, and an incremental
parser for each syntax in use.

One module per format (``FORMATS``; the real templates that detect as each are in
tests/test_toolcalls.py): ``hermes``, ``qwen3_coder``, ``llama3``, ``mistral``, ``harmony``,
``deepseek``, ``deepseek_dsml``, ``glm``, ``command_r``, ``command_r_plus``, ``minimax``,
``minimax_m3``, ``kimi``, ``kimi_k3``, ``lfm2``, ``gemma4``, ``nemotron_v2``, ``apriel``,
``apertus``, ``seed_oss``, ``functionary_v31``, ``functionary_v32``, ``firefunction_v2``, and
``plain`` (the fallback: the tools described in a system message, hermes'
syntax asked for). Each says what detects it, its markers, its parser, its call grammar (GBNF
text; ``worker/toolgrammar.py`` adds llama.cpp's argument rules) and its history shape
(``worker/toolhistory.py``), as ``interface.Format`` lists; ``TABLE`` below holds them, in the
order detection tries them. Adding a format is adding its module and its line there.
Shared: ``items`` (what an answer is read into, up to the wires), ``machine`` (the call being
read, the driving loop), ``jsoncall`` and ``xmlcall`` (call bodies several formats write),
``scan`` (pure scanning), ``gbnf``.

``detect(chat_template, special_tokens)`` returns a format's name, or None when the template
shows no tool support at all. ``describes_tools(chat_template)`` says whether the template
itself lists the tools: DeepSeek's templates render calls but never the tools, so the caller
adds ``plain_system_prompt(tools, fmt)`` for them.

``ToolCallParser(fmt, tools, stream=True)``: ``feed(text)`` takes the answer's content in any
cuts (a marker may arrive one character at a time, a call be cut anywhere; a marker written as
one control token or as several ordinary ones is the same text) and returns items; ``flush()``
ends the answer and returns the rest. Items (``items``), in order:
- ``Piece("content", text)``: free text. Markers never reach it; a partial marker is held back until
  it is known and released as text if it turns out not to be one. Text before, between and
  after calls is content; whitespace that only separates a call from the text around it is
  dropped (before the call's opening marker and after its end).
- ``CallStart(index, id, name)``: once the name is known and is one of ``tools``, and (for
  JSON formats) its arguments have begun as an object. ``index`` counts the answer's calls
  from 0, ``id`` is ``call_`` and 24 random letters and digits, unique in the parser.
- ``CallArgs(index, text)``: the arguments, in pieces as they are generated; the pieces of one
  call join into one JSON object (raw control characters inside strings are escaped on the way).
- ``CallEnd(index, error=None)``.

Failures. A call is emitted only once its name is known and valid, so a call whose name is not
one of the tools, whose syntax is broken before its arguments begin, or whose text ends before
its arguments begin is never emitted: its raw text (markers included) goes out as content and
``failed`` gets a reason. What happens to a call that fails after its start went out depends on
``stream``:
- ``stream=True`` (streamed answers): pieces leave as soon as they are known. If the arguments
  then turn out broken (the answer ends inside them, or they do not parse as one JSON object)
  the call still ends, with ``CallEnd(index, error=REASON)``, and ``failed`` records it; the
  caller should tell the client the call is unusable (or drop it when it buffers).
- ``stream=False`` (whole answers): each call is held until it ends and is emitted only once
  its arguments parsed as a JSON object; otherwise its raw text is content. So a whole answer
  never carries a broken call.
A call whose arguments are complete is accepted even when its closing marker never came (the
answer ended): gpt-oss's ``<|call|>`` and Llama's ``<|eom_id|>`` are end-of-generation tokens
the worker does not render, and models drop closers at the end.

``AnswerParser(tool_format, tools, reasoning=..., prompt_tail=..., stream=...)`` is what a
caller uses: the raw answer in, ``Piece("thinking", text)`` / ``Piece("content", text)`` / call items out,
for every pair of formats (for harmony the tool parser owns the splitting; otherwise thinking is
split first and only content reaches the tool parser).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ..reasoning import CONTENT, THINKING, ReasoningSplitter
from . import (
    apertus,
    apriel,
    command_r,
    command_r_plus,
    deepseek,
    deepseek_dsml,
    firefunction_v2,
    functionary_v31,
    functionary_v32,
    gemma4,
    gigachat,
    glm,
    harmony,
    hermes,
    kimi,
    kimi_k3,
    lfm2,
    llama3,
    minicpm5,
    minimax,
    minimax_m3,
    mistral,
    muse,
    nemotron_v2,
    plain,
    qwen3_coder,
    seed_oss,
)
from .framed import Framed
from .interface import Format
from .items import CallArgs, CallEnd, CallStart, Item, Piece

__all__ = ["FORMATS", "MARKER_TOKENS", "TABLE", "AnswerParser", "CallArgs", "CallEnd", "CallStart", "Item",
           "Piece", "ToolCallParser", "describes_tools", "detect", "frames_answers", "plain_system_prompt"]

# In the order detection tries them: the first whose template check passes wins, then the
# first whose token the vocabulary has; plain is the fallback.
TABLE: dict[str, Format] = {
    "harmony": harmony,
    "deepseek": deepseek,
    "deepseek_dsml": deepseek_dsml,
    "command_r": command_r,
    "command_r_plus": command_r_plus,
    "minimax": minimax,
    "minimax_m3": minimax_m3,
    "kimi": kimi,
    "kimi_k3": kimi_k3,
    "mistral": mistral,
    "apriel": apriel,
    "apertus": apertus,
    "seed_oss": seed_oss,
    "nemotron_v2": nemotron_v2,
    "qwen3_coder": qwen3_coder,
    "functionary_v31": functionary_v31,
    "functionary_v32": functionary_v32,
    "glm": glm,
    "lfm2": lfm2,
    "gemma4": gemma4,
    "minicpm5": minicpm5,
    "muse": muse,
    "gigachat": gigachat,
    "firefunction_v2": firefunction_v2,
    "llama3": llama3,
    "hermes": hermes,
    "plain": plain,
}
FORMATS = tuple(TABLE)

# Markers that are single (special) tokens in some vocabulary: the worker must render them as text.
MARKER_TOKENS = tuple(dict.fromkeys(m for fmt in TABLE.values() for m in fmt.MARKERS))

_JINJA_CODE = re.compile(r"\{[{%](.*?)[%}]\}", re.S)


def _code(template: str) -> str:
    """The text inside the template's Jinja tags (``{{ }}``, ``{% %}``), joined by newlines: a
    tag runs from its opener to the first closer after it. A template is a stranger's text,
    scanned on the event loop, so the scan stops at the last closer: no match runs past it, and
    before it every opener has a closer after it, so no attempt scans to the end in vain (from
    each of many unclosed openers that was quadratic) and the scan is linear."""
    last = max(template.rfind("%}"), template.rfind("}}"))
    return "\n".join(_JINJA_CODE.findall(template, 0, last + 2)) if last >= 0 else ""


def describes_tools(chat_template: str | None) -> bool:
    """Whether the template itself renders the request's ``tools`` (reads the variable)."""
    return bool(chat_template) and re.search(r"\btools\b", _code(chat_template or "")) is not None


def detect(chat_template: str | None, special_tokens: Sequence[str] = ()) -> str | None:
    """The tool-call format of a model, from its chat template's source and the markers its
    vocabulary has as single tokens; None when the template shows no tool support (no
    ``tools`` and no ``tool_calls`` in its Jinja code): whether such a model gets ``plain`` or
    a 400 is the caller's choice. A template that handles tools in a syntax not listed
    (Granite 3, ...) detects as ``plain`` unless its vocabulary has one of the formats' tokens."""
    src = chat_template or ""
    code = _code(src)
    if not (re.search(r"\btools\b", code) or "tool_calls" in code):
        return None
    for name, fmt in TABLE.items():
        if fmt.shown_by(src):
            return name
    tokens = set(special_tokens)
    for name, fmt in TABLE.items():
        if fmt.TOKEN in tokens:
            return name
    return "plain"


def frames_answers(fmt: str | None) -> bool:
    """Whether every answer of a model whose calls are in ``fmt`` is framed in it, calls or not
    (``Machine.FRAMES``): its parser reads an answer without tools too."""
    return fmt in TABLE and TABLE[fmt].Parser.FRAMES


def plain_system_prompt(tools: Sequence[dict[str, Any]], fmt: str = "plain", chat_template: str | None = None) -> str:
    """A system message that describes ``tools`` and the syntax of ``fmt`` to call them in, for a
    template that does not render the tools itself (``plain``, or ``describes_tools`` False)."""
    example = TABLE[fmt].example(chat_template)
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
            "</tools>\n\nTo call a function, write the call in exactly this format, with arguments that follow "
            f"the function's JSON schema:\n{example}\nWrite a call only for a function listed above.")


class ToolCallParser:
    """Incremental tool-call parser for one answer in ``fmt``, which drives that format's
    parser; see above for the items. Raises ``ValueError`` for an unknown format."""

    def __init__(self, fmt: str, tools: Sequence[dict[str, Any]] | None = None, *, stream: bool = True,
                 prompt_tail: str = ""):
        if fmt not in TABLE:
            raise ValueError(f"unknown tool-call format {fmt!r}")
        self.fmt = fmt
        self.stream = stream
        self._parser = TABLE[fmt].Parser(tools, stream=stream, prompt_tail=prompt_tail)

    @property
    def failed(self) -> list[str]:
        """Why each failed call failed, with the start of its text."""
        return self._parser.failed

    @property
    def thinking(self) -> bool:
        """Inside thinking now (harmony, whose parser splits the thinking itself)."""
        return self._parser.thinking

    def feed(self, text: str) -> list[Item]:
        return self._parser.feed(text)

    def flush(self) -> list[Item]:
        return self._parser.flush()


class AnswerParser:
    """The raw answer in, thinking, content and call items out: ``ReasoningSplitter`` (for
    ``reasoning``, a reasoning format or None) and ``ToolCallParser`` (for ``tool_format``, or
    None for an answer without tools) composed. For harmony the tool parser does the splitting
    itself, whatever ``reasoning`` says. ``prompt_tail``: the end of the rendered prompt."""

    def __init__(self, tool_format: str | None, tools: Sequence[dict[str, Any]] | None = None, *,
                 reasoning: str | None = None, prompt_tail: str = "", stream: bool = True):
        # a format whose parser frames the messages splits the thinking itself
        harmony = tool_format in TABLE and issubclass(TABLE[tool_format].Parser, Framed)
        self.stream = stream
        self.tools = ToolCallParser(tool_format, tools, stream=stream, prompt_tail=prompt_tail) if tool_format else None
        ends = TABLE[tool_format].Parser.THINKING_ENDS if tool_format in TABLE else ()
        self.splitter = None if harmony or not reasoning else ReasoningSplitter(reasoning, prompt_tail, ends=ends)

    @property
    def thinking(self) -> bool:
        """Inside thinking now (for counting reasoning tokens)."""
        if self.splitter is not None:
            return self.splitter.thinking
        return self.tools is not None and self.tools.thinking

    @property
    def failed(self) -> list[str]:
        return self.tools.failed if self.tools is not None else []

    def _route(self, segments: list[tuple[str, str]], out: list[Item]) -> None:
        for kind, text in segments:
            if kind == THINKING or self.tools is None:
                out.append(Piece(kind, text))
            else:
                out += self.tools.feed(text)

    def feed(self, text: str) -> list[Item]:
        if self.splitter is None:
            return self.tools.feed(text) if self.tools is not None else [Piece(CONTENT, text)] if text else []
        out: list[Item] = []
        self._route(self.splitter.feed(text), out)
        return out

    def flush(self) -> list[Item]:
        out: list[Item] = []
        if self.splitter is not None:
            self._route(self.splitter.flush(), out)
        if self.tools is not None:
            out += self.tools.flush()
        return out
