"""What a model reads of a hosted tool's result: its text, bounded and defanged. Pure.

A result is untrusted text (a web page, a search backend's snippets, an MCP server's answer).
It reaches the prompt as a tool message's content, which a chat template renders as data,
never as template code; but the worker reads the rendered prompt with special tokens parsed
(as llama.cpp's server does), so a result that spells a model's control tokens or the
gateway's own markers (``<tool_call>``, ``<think>``, ``[TOOL_CALLS]``, ``<|im_end|>``,
DeepSeek's ``<｜...｜>``) would be read as them. ``defang`` puts a word joiner (U+2060, which
no tokenizer merges into a marker) inside every such marker, so each stays text: the model
still reads it, and none of it can close the tool message, open a call or end a turn."""

from __future__ import annotations

import json
import re
from typing import Any

from .hosted import CallOutcome, Page, SearchResult

JOINER = "\u2060"
# a marker: <|...|>, <｜...｜> (full-width bars), <tag> / </tag> of a word (the formats' markers are
# words, maybe with _ : or -), [WORD] / [/WORD] in capitals (Mistral's), and Llama's <<SYS>>
_MARKER = re.compile(r"<(?=[|｜])|<(?=/?[A-Za-z_][A-Za-z0-9_:.-]{0,40}>)|\[(?=/?[A-Z][A-Z0-9_]{1,40}\])|<<(?=[A-Z])")


def defang(text: str) -> str:
    """``text`` with a word joiner after the opening of every marker-like run (see the module)."""
    return _MARKER.sub(lambda m: m.group(0) + JOINER, text)


def defang_json(value: Any) -> Any:
    """A JSON value (an MCP tool's input schema) with ``defang`` applied to every string in it:
    defanged as its JSON text, where a marker can only stand inside a string (JSON's own ``[``
    is never followed by a capital letter, nor ``<`` met outside a string)."""
    text = json.dumps(value, ensure_ascii=False)
    fanged = defang(text)
    return value if fanged == text else json.loads(fanged)


def cut_bytes(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (at a character's boundary), and whether it was cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


CUT_NOTE = "\n[the result was cut here: it was longer than this server gives a model]"


def search_text(results: list[SearchResult]) -> str:
    if not results:
        return "No results."
    return "\n\n".join(f"{i}. {r.title}\n{r.url}\n{r.content}".rstrip() for i, r in enumerate(results, 1))


def page_text(page: Page) -> str:
    return f"{page.title}\n{page.url}\n\n{page.text}" if page.title else f"{page.url}\n\n{page.text}"


def for_model(output: object, error: str | None) -> str:
    """A result's text as the model reads it (before the bounds): an error as ``Error: reason``."""
    if error is not None:
        return f"Error: {error}"
    if isinstance(output, list):
        return search_text(output)
    if isinstance(output, Page):
        return page_text(output)
    if isinstance(output, CallOutcome):
        return f"Error: {output.text}" if output.is_error else output.text
    return str(output)
