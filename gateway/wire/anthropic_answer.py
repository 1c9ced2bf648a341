"""Anthropic's Messages answers: the message and its content blocks (text, thinking,
``tool_use``, a hosted tool's use and result), and the wire's ``Writer``, which owns its whole
and its streamed form (``wire.writer``)."""

from __future__ import annotations

import json
from typing import Any

from ..base.errors import ApiError
from ..protocol import Start
from . import writer
from .answer import Call, Finish, Item, Piece
from .context import Context
from .params import Parsed
from .writer import Frame, Hosted, HostedResult


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


def message(id: str, model: str, blocks: list[dict[str, Any]], finish: Finish | None, prompt_tokens: int,
            cached_tokens: int) -> dict[str, Any]:
    """A message, ``usage`` as Anthropic counts it: input_tokens are the prompt tokens read
    afresh, the ones found in the cache are cache_read_input_tokens."""
    reason, seq = stop_reason(finish) if finish else (None, None)
    return {"id": id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": seq,
            "usage": {"input_tokens": prompt_tokens - cached_tokens, "cache_read_input_tokens": cached_tokens,
                      "cache_creation_input_tokens": 0,
                      "output_tokens": finish.completion_tokens if finish else 0}}


def block(kind: str, text: str = "") -> dict[str, Any]:
    if kind == "thinking":
        return {"type": "thinking", "thinking": text, "signature": ""}
    return {"type": "text", "text": text}


def tool_block(call: Call, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``tool_use`` block: whole with its ``input``; streamed, opened with ``{}`` and filled by
    ``input_json_delta`` events."""
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": arguments or {}}


def delta(piece: Piece) -> dict[str, Any]:
    if piece.kind == "thinking":
        return {"type": "thinking_delta", "thinking": piece.text}
    return {"type": "text_delta", "text": piece.text}


def hosted_block(call: Hosted) -> dict[str, Any]:
    """A tool the gateway ran, as Anthropic tells its own: ``server_tool_use`` (web search, web
    fetch) or ``mcp_tool_use`` (an MCP server's tool, with its ``server_name``)."""
    if call.kind == "mcp":
        return {"type": "mcp_tool_use", "id": call.id, "name": call.name, "server_name": call.server or "",
                "input": {}}
    return {"type": "server_tool_use", "id": call.id, "name": call.name, "input": {}}


def hosted_result_block(result: HostedResult) -> dict[str, Any]:
    """Its result: ``mcp_tool_result`` (``is_error``, text content), or ``web_search_tool_result``
    and its kin, whose failure is an error object in place of the content."""
    if result.kind == "mcp":
        text = result.error if result.error is not None else result.output
        return {"type": "mcp_tool_result", "tool_use_id": result.id, "is_error": result.error is not None,
                "content": text if isinstance(text, list) else [{"type": "text", "text": str(text or "")}]}
    failed = {"type": f"{result.kind}_tool_result_error", "error_code": result.error}
    return {"type": f"{result.kind}_tool_result", "tool_use_id": result.id,
            "content": result.output if result.error is None else failed}


class Writer(writer.Writer):
    """An answer as Anthropic's Messages API writes it: a message of content blocks (thinking,
    text, tool_use, and the hosted tools' use and result), whole, or streamed as
    ``message_start``, each block's ``content_block_start`` / ``_delta`` / ``_stop``,
    ``message_delta`` and ``message_stop``. Every answer ends in a text block, empty where the
    model wrote none, unless it ends in a call."""

    def __init__(self, parsed: Parsed, ctx: Context):
        super().__init__(parsed.model, parsed.stream)
        self.id = f"msg_{ctx.request_id}"
        self.blocks: list[dict[str, Any]] = []  # the whole answer's
        self._text: list[str] = []  # the open block's text, or a tool_use block's arguments
        self.kind: str | None = None  # the open block's: thinking | content | tool_use | hosted

    def _start(self, new: dict[str, Any], kind: str) -> list[Frame]:
        frames = self._stop()
        self.kind = kind
        self.blocks.append(new)
        if not self.stream:
            return frames
        return frames + [({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": new},
                          "content_block_start")]

    def _stop(self) -> list[Frame]:
        """The open block closes: whole, its text or input is filled in."""
        kind, self.kind = self.kind, None
        if kind is None:
            return []
        if not self.stream:
            last = self.blocks[-1]
            text, self._text = "".join(self._text), []
            if kind == "tool_use":
                last["input"] = json.loads(text) if text else {}
            elif kind in ("thinking", "content"):
                last["thinking" if kind == "thinking" else "text"] = text
            return []
        return [({"type": "content_block_stop", "index": len(self.blocks) - 1}, "content_block_stop")]

    def open(self, begun: Start) -> list[Frame]:
        if not self.stream:
            return []
        return [({"type": "message_start",
                  "message": message(self.id, self.model, [], None, begun.prompt_tokens, begun.cached_tokens)},
                 "message_start"), ({"type": "ping"}, "ping")]

    def feed(self, item: Item) -> list[Frame]:
        if isinstance(item, Piece):
            frames = self._start(block(item.kind), item.kind) if self.kind != item.kind else []
            if not self.stream:
                self._text.append(item.text)
                return frames
            frames.append(({"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta(item)},
                           "content_block_delta"))
            return frames
        if isinstance(item, Call):
            return self._start(tool_block(item), "tool_use")
        if not self.stream:
            self._text.append(item.text)
            return []
        return [({"type": "content_block_delta", "index": len(self.blocks) - 1,
                  "delta": {"type": "input_json_delta", "partial_json": item.text}}, "content_block_delta")]

    def hosted(self, call: Hosted) -> list[Frame]:
        new = hosted_block(call)
        frames = self._start(new, "hosted")
        if not self.stream:
            new["input"] = json.loads(call.arguments or "{}")
            self.kind = None
            return frames
        return frames + [({"type": "content_block_delta", "index": len(self.blocks) - 1,
                           "delta": {"type": "input_json_delta", "partial_json": call.arguments}},
                          "content_block_delta"), *self._stop()]

    def hosted_result(self, result: HostedResult) -> list[Frame]:
        frames = self._start(hosted_result_block(result), "hosted")
        return frames + self._stop()

    def close(self, finish: Finish) -> list[Frame]:
        # an answer ends in a text block, if empty: streamed, unless its last is text or a call;
        # whole, unless it has text or a call anywhere
        if self.stream:
            missing = self.kind not in ("content", "tool_use")
        else:
            missing = not any(b["type"] in ("text", "tool_use") for b in self.blocks)
        frames = self._start(block("content"), "content") if missing else []
        frames += self._stop()
        total = self.usage.total(finish)
        if not self.stream:
            self._whole = message(self.id, self.model, self.blocks, total, total.prompt_tokens, total.cached_tokens)
            return frames
        reason, seq = stop_reason(finish)
        return frames + [({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                           "usage": {"output_tokens": total.completion_tokens}}, "message_delta"),
                         ({"type": "message_stop"}, "message_stop")]

    def fail(self, err: ApiError) -> list[Frame]:
        return [(err.anthropic_body(), "error")]

    def body(self) -> dict[str, Any]:
        return self._whole
