"""Anthropic's Messages shape: validate requests, build messages and stream events.

Field names and limits follow Anthropic's API: ``max_tokens`` is required, ``temperature``
is 0..1, ``stop_sequences`` replaces ``stop``, ``thinking: {"type": "disabled"}`` turns
thinking off where the chat template allows (``enable_thinking``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..answer import Call, Finish, Piece
from ..engine.protocol import GenerationRequest
from ..errors import InvalidRequest
from . import tools as wire_tools
from .params import SAMPLING, Param, Parsed, read_sampling, read_stops, require_model, shown

ANTHROPIC_SAMPLING = {"temperature": Param(float, 0, 1), "top_p": Param(float, 0, 1), "top_k": SAMPLING["top_k"]}


@dataclass
class _Blocks:
    text: str = ""
    thinking: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)  # tool_use blocks (assistant)
    results: list[dict[str, Any]] = field(default_factory=list)  # tool_result blocks (user), as tool messages


def _blocks(value: Any, where: str, *, role: str, ledger: wire_tools.CallLedger | None = None) -> _Blocks:
    """A string or a list of content blocks, read by kind."""
    if isinstance(value, str):
        return _Blocks(value)
    if not isinstance(value, list):
        raise InvalidRequest(f"{where}: must be a string or a list of content blocks", where)
    out, text, thinking = _Blocks(), [], []
    for j, block in enumerate(value):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking" and role == "assistant":
            continue
        elif kind in ("text", "thinking"):
            raise InvalidRequest(f"{at}: a {kind} block needs a string `{kind}`", at)
        elif kind == "tool_use" and role == "assistant" and ledger is not None:
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise InvalidRequest(f"{at}: a tool_use block needs a string `id` and `name`", at)
            if not isinstance(block.get("input", {}), dict):
                raise InvalidRequest(f"{at}.input: must be an object", f"{at}.input")
            out.calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": block.get("input", {})}})
        elif kind == "tool_result" and role == "user" and ledger is not None:
            name = ledger.name_of(block.get("tool_use_id"), f"{at}.tool_use_id")
            content = _blocks(block.get("content", ""), f"{at}.content", role="tool").text
            is_error = block.get("is_error", False)
            if not isinstance(is_error, bool):
                raise InvalidRequest(f"{at}.is_error: must be true or false", f"{at}.is_error")
            out.results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "name": name,
                                "content": f"Error: {content}" if is_error else content})
        else:
            raise InvalidRequest(f"{at}.type: {kind!r} blocks are not supported here by this server", f"{at}.type")
    out.text, out.thinking = "".join(text), "".join(thinking)
    return out


def parse(body: dict[str, Any]) -> Parsed:
    model = require_model(body, anthropic=True)
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise InvalidRequest("max_tokens: Field required", "max_tokens")
    problem = SAMPLING["max_tokens"].problem(max_tokens)
    if problem:
        raise InvalidRequest(f"max_tokens: {problem}, got {shown(max_tokens)}", "max_tokens")
    tools = wire_tools.anthropic_tools(body)
    choice = wire_tools.anthropic_tool_choice(body, tools)

    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        text = _blocks(system, "system", role="system").text
        if text:
            messages.append({"role": "system", "content": text})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages: must be a non-empty list", "messages")
    ledger = wire_tools.CallLedger(anthropic=True)
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise InvalidRequest(f"{where}.role: must be user or assistant", f"{where}.role")
        blocks = _blocks(m.get("content"), f"{where}.content", role=m["role"], ledger=ledger)
        messages += blocks.results  # a user turn's tool results come before its text
        if blocks.results and not blocks.text:
            continue
        msg: dict[str, Any] = {"role": m["role"], "content": blocks.text}
        if blocks.thinking:
            msg["reasoning_content"] = msg["thinking"] = blocks.thinking
        if blocks.calls:
            msg["tool_calls"] = blocks.calls
            ledger.add(blocks.calls)
        messages.append(msg)

    req = GenerationRequest(messages=messages, max_tokens=max_tokens)
    if tools and choice.mode != "none":
        req.tools, req.tool_choice, req.tool_name, req.parallel_tool_calls = (tools, choice.mode, choice.name,
                                                                             choice.parallel)
    explicit = read_sampling(body, req, ANTHROPIC_SAMPLING, anthropic=True)
    req.stop = read_stops(body.get("stop_sequences"), "stop_sequences", anthropic=True)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream: must be true or false", "stream")
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise InvalidRequest("metadata: must be an object", "metadata")
    thinking_field = body.get("thinking")
    if thinking_field is not None:
        kind = thinking_field.get("type") if isinstance(thinking_field, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise InvalidRequest("thinking.type: must be enabled or disabled", "thinking.type")
        if kind == "enabled":
            budget = thinking_field.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
                raise InvalidRequest("thinking.budget_tokens: must be an integer >= 0 (0: no thinking)",
                                     "thinking.budget_tokens")
            if budget >= max_tokens:
                raise InvalidRequest(f"max_tokens must be greater than thinking.budget_tokens ({budget})",
                                     "thinking.budget_tokens")
            req.thinking_budget = budget
            kind = "disabled" if budget == 0 else kind
        req.chat_template_kwargs.setdefault("enable_thinking", kind != "disabled")
    return Parsed(model, req, stream, explicit=explicit)


def stop_reason(finish: Finish) -> tuple[str, str | None]:
    if finish.reason == "length":
        return "max_tokens", None
    if finish.stop is not None:
        return "stop_sequence", finish.stop
    if finish.reason == "tool_calls":
        return "tool_use", None
    return "end_turn", None


def tool_use_id(call_id: str) -> str:
    """Anthropic's spelling of a call's id (``toolu_...``)."""
    return "toolu_" + call_id.removeprefix("call_")


@dataclass
class Renderer:
    model: str
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created: float = field(default_factory=time.time)

    def message(self, blocks: list[dict[str, Any]], finish: Finish | None, prompt_tokens: int,
                cached_tokens: int) -> dict[str, Any]:
        """``usage`` as Anthropic counts it: input_tokens are the prompt tokens read afresh, the
        ones found in the cache are cache_read_input_tokens."""
        reason, seq = stop_reason(finish) if finish else (None, None)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": blocks,
                "stop_reason": reason, "stop_sequence": seq,
                "usage": {"input_tokens": prompt_tokens - cached_tokens, "cache_read_input_tokens": cached_tokens,
                          "cache_creation_input_tokens": 0,
                          "output_tokens": finish.completion_tokens if finish else 0}}

    @staticmethod
    def block(kind: str, text: str = "") -> dict[str, Any]:
        if kind == "thinking":
            return {"type": "thinking", "thinking": text, "signature": ""}
        return {"type": "text", "text": text}

    @staticmethod
    def tool_block(call: Call, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """A ``tool_use`` block: whole with its ``input``; streamed, opened with ``{}`` and filled by
        ``input_json_delta`` events."""
        return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": arguments or {}}

    @staticmethod
    def delta(piece: Piece) -> dict[str, Any]:
        if piece.kind == "thinking":
            return {"type": "thinking_delta", "thinking": piece.text}
        return {"type": "text_delta", "text": piece.text}
