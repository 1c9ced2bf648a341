"""How a model's answers are read: its thinking format and its tool-call format (``Formats``).

Both follow from the model's models.yaml settings (``reasoning``, ``tool_format``) and what
its backend reported at load (``info``: the chat template, the special tokens, ``tool_calls:
native`` for a server that parses calls itself), none of which changes while it stays loaded.
So they are settled once per load (``Formats.settle``, by the model's supervisor) and kept in
the backend's info under ``FORMATS``; each request only reads them (``answer.prepare``).
``reasoning_format`` and ``tool_format`` also answer for a model not loaded (its file's
template): ``gguf-gateway models``, Ollama's ``/api/show``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import toolformats
from .reasoning import detect

NATIVE = "native"  # a backend's ``tool_calls`` info, and its tool format: calls arrive parsed (CallDelta)
FORMATS = "formats"  # the key of a loaded backend's info that holds its ``Formats``


@dataclass(frozen=True)
class Formats:
    reasoning: str | None  # the thinking format to split by; None: thinking is not split out
    tools: str | None  # the call format of a request with tools; None: tools refused (tool_format: none)

    @classmethod
    def settle(cls, reasoning: str, tools: str, info: dict[str, Any]) -> Formats:
        """A model's formats, from its ``reasoning`` and ``tool_format`` settings and its
        backend's ``info``."""
        return cls(reasoning_format(reasoning, info) if reasoning else None, tool_format(tools, info))


def reasoning_format(configured: str, info: dict[str, Any]) -> str | None:
    """The marker format to split by: the model's ``reasoning`` setting, or for ``auto`` what its
    chat template and vocabulary show."""
    if configured == "none":
        return None
    if configured != "auto":
        return configured
    # no marker shown: an answer may still open with <think> written as text (some fine-tunes)
    return detect(info.get("chat_template"), info.get("special_tokens", [])) or "think_leading"


def tool_format(configured: str, info: dict[str, Any]) -> str | None:
    """The syntax the model writes calls in: the model's ``tool_format`` setting, or for ``auto``
    what its chat template and vocabulary show, ``plain`` (the tools described in a system
    message) for a template with no tool support; None for ``none`` (tools refused)."""
    if info.get("tool_calls") == NATIVE:  # the backend's server reads calls itself (an upstream)
        return NATIVE
    if configured == "none":
        return None
    if configured != "auto":
        return configured
    return toolformats.detect(info.get("chat_template"), info.get("special_tokens", [])) or "plain"
