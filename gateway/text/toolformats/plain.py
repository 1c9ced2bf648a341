"""plain: the fallback for a template that has no tool syntax of its own. The gateway
describes the tools in a system message (``plain_system_prompt``) and does not hand them to
the template; the model is asked for hermes' syntax and parsed, and constrained, as hermes.
Earlier calls become ``<tool_call>`` text in the assistant's message, and tool results a user
message of ``<tool_response>`` blocks (consecutive results in one message, so roles still
alternate)."""

from __future__ import annotations

import json

from .hermes import EXAMPLE as HERMES_EXAMPLE
from .hermes import MARKERS, Parser, grammar
from .interface import Messages, Tools

__all__ = ["MARKERS", "TOKEN", "Parser", "example", "grammar", "history", "shown_by"]

TOKEN = None


def shown_by(template: str) -> bool:
    return False  # chosen when no other format is shown


def example(chat_template: str | None) -> str:
    return HERMES_EXAMPLE


def history(messages: Messages, tools: Tools) -> tuple[Messages, Tools]:
    if not tools:
        return messages, tools
    return _as_text(messages), None


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
