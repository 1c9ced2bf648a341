"""A request's messages and tools as the model's chat template should see them.

Most templates list the tools and render calls and results themselves (Hugging Face's
convention, which the wire layer already speaks). Three cases need more:
- ``plain``: the template has no tool syntax. The tools are described in a system message
  (``toolcalls.plain_system_prompt``) and not handed to the template; earlier calls become
  ``<tool_call>`` text in the assistant's message, and tool results become a user message of
  ``<tool_response>`` blocks (consecutive results in one message, so roles still alternate).
- a template that renders calls but never lists the tools (DeepSeek's): the tools go to the
  template and the system message describes them too.
- ``mistral``: its templates refuse call ids that are not 9 letters and digits, so each id in
  the history is mapped to one that is, the same way every time.

``for_template`` returns the candidates to render, best first: when the description was added
as a system message, the second puts it at the start of the first user message instead, for
templates that refuse a system role (Gemma 2).
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Any

from .. import toolcalls

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None

_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_ALNUM = string.ascii_letters + string.digits


def for_template(messages: Messages, tools: Tools, fmt: str | None, template: str) -> list[tuple[Messages, Tools]]:
    if fmt == "mistral":
        messages = [_mistral_ids(m) for m in messages]
    if not tools or not fmt:
        return [(messages, tools)]
    if fmt == "plain":
        history, listed = _as_text(messages), None
    elif not toolcalls.describes_tools(template):
        history, listed = messages, tools
    else:
        return [(messages, tools)]
    described = toolcalls.plain_system_prompt(tools, fmt, template)
    return [(_with_system(history, described), listed), (_with_preamble(history, described), listed)]


def mistral_id(call_id: str) -> str:
    """A 9-character id for ``call_id``: itself when it is one, else one derived from it."""
    if _MISTRAL_ID.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, r = divmod(n, len(_ALNUM))
        out.append(_ALNUM[r])
    return "".join(out)


def _mistral_ids(message: dict[str, Any]) -> dict[str, Any]:
    if message.get("tool_calls"):
        calls = [dict(c, id=mistral_id(c["id"])) if isinstance(c.get("id"), str) else c for c in message["tool_calls"]]
        message = dict(message, tool_calls=calls)
    if isinstance(message.get("tool_call_id"), str):
        message = dict(message, tool_call_id=mistral_id(message["tool_call_id"]))
    return message


def _as_text(messages: Messages) -> Messages:
    """Calls and results written out in hermes' syntax, for a template that knows neither."""
    out: Messages = []
    for m in messages:
        if m.get("role") == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_results": True})
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function") or {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError:
                        pass
                calls.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args},
                                                          ensure_ascii=False) + "\n</tool_call>")
            text = "\n".join(part for part in (m.get("content") or "", *calls) if part)
            m = {k: v for k, v in m.items() if k != "tool_calls"} | {"content": text}
        out.append(dict(m))
    return [{k: v for k, v in m.items() if k != "_results"} for m in out]


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
