"""A request's messages and tools as the model's chat template should see them.

Most templates list the tools and render calls and results themselves (Hugging Face's
convention, which the wire layer already speaks). A format's module says how its history is
shaped (its ``history``: ``plain`` writes calls and results as text and keeps the tools from
the template; ``mistral`` maps call ids to the 9 characters its templates accept); here, when
the template does not get the tools or does not list them (DeepSeek's), the tools are also
described in a system message (``toolformats.plain_system_prompt``).

``for_template`` returns the candidates to render, best first: when the description was added
as a system message, the second puts it at the start of the first user message instead, for
templates that refuse a system role (Gemma 2).
"""

from __future__ import annotations

from ..text.toolformats import TABLE, describes_tools, plain_system_prompt
from ..text.toolformats.interface import Messages, Tools


def for_template(messages: Messages, tools: Tools, fmt: str | None, template: str) -> list[tuple[Messages, Tools]]:
    if fmt is None or fmt not in TABLE:  # None: no tools in the request
        return [(messages, tools)]
    history, listed = TABLE[fmt].history(messages, tools)
    if not tools or (listed is not None and describes_tools(template)):
        return [(history, listed)]
    described = plain_system_prompt(tools, fmt, template)
    return [(_with_system(history, described), listed), (_with_preamble(history, described), listed)]


def _with_system(messages: Messages, described: str) -> Messages:
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [dict(first, content=f"{first.get('content') or ''}\n\n{described}".lstrip()), *messages[1:]]
    return [{"role": "system", "content": described}, *messages]


def _with_preamble(messages: Messages, described: str) -> Messages:
    """The description at the start of the first user message (a system message folded in too)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        described = f"{out.pop(0).get('content') or ''}\n\n{described}".lstrip()
    for m in out:
        if m.get("role") == "user":
            m["content"] = f"{described}\n\n{m.get('content') or ''}"
            return out
    return [{"role": "user", "content": described}, *out]
