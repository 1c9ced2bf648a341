"""Anthropic's Messages answers: the message and its content blocks (text, thinking,
``tool_use``, a hosted tool's use and result), and the wire's ``Writer``, which owns its whole
and its streamed form (``wire.writer``)."""

from __future__ import annotations

import base64
import json
from typing import Any

from ..base import strictjson
from ..base.errors import ApiError
from ..protocol import Start
from ..tools import citations
from ..tools.hosted import Page, SearchResult
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
            cached_tokens: int, server_tools: dict[str, int] | None = None) -> dict[str, Any]:
    """A message, ``usage`` as Anthropic counts it: input_tokens are the prompt tokens read
    afresh, the ones found in the cache are cache_read_input_tokens; ``server_tool_use`` the
    web searches and fetches the gateway ran, where it ran any."""
    reason, seq = stop_reason(finish) if finish else (None, None)
    usage: dict[str, Any] = {"input_tokens": prompt_tokens - cached_tokens, "cache_read_input_tokens": cached_tokens,
                             "cache_creation_input_tokens": 0,
                             "output_tokens": finish.completion_tokens if finish else 0}
    if server_tools:
        usage["server_tool_use"] = server_tools
    return {"id": id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": reason, "stop_sequence": seq, "usage": usage}


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


def hosted_id(kind: str, call_id: str) -> str:
    """Anthropic's spelling of a hosted call's id: ``srvtoolu_...``, an MCP call's ``mcptoolu_...``."""
    prefix = "mcptoolu_" if kind == "mcp" else "srvtoolu_"
    return call_id if call_id.startswith(prefix) else prefix + call_id.removeprefix("call_")


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = strictjson.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def hosted_block(call: Hosted, whole: bool = True) -> dict[str, Any]:
    """A tool the gateway ran, as Anthropic tells its own: ``server_tool_use`` (web search, web
    fetch: its name is the kind's) or ``mcp_tool_use`` (an MCP server's tool, with its
    ``server_name``); streamed, opened with ``{}`` and filled by one ``input_json_delta``."""
    given = _input(call.arguments) if whole else {}
    if call.kind == "mcp":
        return {"type": "mcp_tool_use", "id": hosted_id(call.kind, call.id), "name": call.name,
                "server_name": call.server or "", "input": given}
    return {"type": "server_tool_use", "id": hosted_id(call.kind, call.id), "name": call.kind, "input": given}


# the error codes of each result's error block; any other outcome is the kind's default
_CODES = {
    "web_search": ({"invalid_tool_input", "unavailable", "max_uses_exceeded", "too_many_requests", "query_too_long",
                    "request_too_large"}, {"max_uses": "max_uses_exceeded", "invalid_input": "invalid_tool_input"},
                   "unavailable"),
    "web_fetch": ({"invalid_tool_input", "url_too_long", "url_not_allowed", "url_not_in_prior_context",
                   "url_not_accessible", "unsupported_content_type", "too_many_requests", "max_uses_exceeded",
                   "unavailable", "content_too_large"},
                  {"max_uses": "max_uses_exceeded", "invalid_input": "invalid_tool_input", "refused": "url_not_allowed",
                   "too_large": "content_too_large", "timeout": "unavailable"}, "url_not_accessible"),
}


def error_code(result: HostedResult) -> str:
    """A web tool's failure in Anthropic's codes: its outcome's, or its error where that is one."""
    codes, outcomes, default = _CODES.get(result.kind, _CODES["web_search"])
    for said in (result.outcome, result.error):
        if said in codes:
            return said
    return outcomes.get(result.outcome or "", default)


def _opaque(text: str) -> str:
    """What Anthropic encrypts, here only encoded: a client gives it back as it got it."""
    return base64.b64encode(text.encode("utf-8", "replace")).decode("ascii")


def hosted_result_block(result: HostedResult) -> dict[str, Any]:
    """Its result: ``mcp_tool_result`` (``is_error``, text content), ``web_search_tool_result``
    (its ``web_search_result`` list) or ``web_fetch_tool_result`` (the page as a text document),
    whose failure is an error block in place of the content."""
    use_id = hosted_id(result.kind, result.id)
    if result.kind == "mcp":
        text = result.error if result.error is not None else getattr(result.output, "text", str(result.output or ""))
        return {"type": "mcp_tool_result", "tool_use_id": use_id, "is_error": result.failed,
                "content": [{"type": "text", "text": text}]}
    content: Any
    if result.error is not None:
        content = {"type": f"{result.kind}_tool_result_error", "error_code": error_code(result)}
    elif result.kind == "web_fetch" and isinstance(result.output, Page):
        page = result.output
        content = {"type": "web_fetch_result", "url": page.url, "retrieved_at": page.retrieved_at or None,
                   "content": {"type": "document", "title": page.title or None,
                               "source": {"type": "text", "media_type": "text/plain", "data": page.text}}}
    else:
        content = [{"type": "web_search_result", "url": r.url, "title": r.title, "page_age": r.page_age,
                    "encrypted_content": _opaque(r.content)} for r in result.sources() if isinstance(r, SearchResult)]
    return {"type": f"{result.kind}_tool_result", "tool_use_id": use_id, "content": content}


def citation(found: citations.Citation) -> dict[str, Any]:
    """A ``web_search_result_location``: its ``encrypted_index`` only encoded, as its results'
    ``encrypted_content`` is."""
    return {"type": "web_search_result_location", "url": found.url, "title": found.title,
            "cited_text": found.cited_text, "encrypted_index": _opaque(f"{found.source}:{found.url}")}


class Writer(writer.Writer):
    """An answer as Anthropic's Messages API writes it: a message of content blocks (thinking,
    text, tool_use, and the hosted tools' use and result), whole, or streamed as
    ``message_start``, each block's ``content_block_start`` / ``_delta`` / ``_stop``,
    ``message_delta`` and ``message_stop``. Every answer ends in a text block, empty where the
    model wrote none, unless it ends in a call.

    A text block written after a web search's result carries the ``citations`` of it that
    ``tools.citations.find`` sees in the block's text (a fetched page is not cited: Anthropic
    cites web fetch's documents only where the tool asks for citations). They are known once
    the block is whole: streamed, they come as ``citations_delta`` events before its
    ``content_block_stop``."""

    def __init__(self, parsed: Parsed, ctx: Context):
        super().__init__(parsed.model, parsed.stream)
        self.id = f"msg_{ctx.request_id}"
        self.blocks: list[dict[str, Any]] = []  # the whole answer's
        self._text: list[str] = []  # the open block's text, or (whole) a tool_use block's arguments
        self.kind: str | None = None  # the open block's: thinking | content | tool_use | hosted
        self.sources: list[SearchResult | Page] = []  # what text written from now on may cite
        self.server_tools = {"web_search_requests": 0, "web_fetch_requests": 0}

    def _start(self, new: dict[str, Any], kind: str) -> list[Frame]:
        frames = self._stop()
        self.kind = kind
        self.blocks.append(new)
        if not self.stream:
            return frames
        return frames + [({"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": new},
                          "content_block_start")]

    def _stop(self) -> list[Frame]:
        """The open block closes: whole, its text or input is filled in; a text block gets its
        citations."""
        kind, self.kind = self.kind, None
        if kind is None:
            return []
        last, index = self.blocks[-1], len(self.blocks) - 1
        text, self._text = "".join(self._text), []
        found = [citation(c) for c in citations.find(text, self.sources)] if kind == "content" else []
        if not self.stream:
            if kind == "tool_use":
                last["input"] = json.loads(text) if text else {}
            elif kind in ("thinking", "content"):
                last["thinking" if kind == "thinking" else "text"] = text
            if found:
                last["citations"] = found
            return []
        return [*[({"type": "content_block_delta", "index": index, "delta": {"type": "citations_delta", "citation": c}},
                   "content_block_delta") for c in found],
                ({"type": "content_block_stop", "index": index}, "content_block_stop")]

    def open(self, begun: Start) -> list[Frame]:
        if not self.stream:
            return []
        return [({"type": "message_start",
                  "message": message(self.id, self.model, [], None, begun.prompt_tokens, begun.cached_tokens)},
                 "message_start"), ({"type": "ping"}, "ping")]

    def feed(self, item: Item) -> list[Frame]:
        if isinstance(item, Piece):
            frames = self._start(block(item.kind), item.kind) if self.kind != item.kind else []
            if not self.stream or (item.kind == "content" and self.sources):  # streamed: kept for its citations
                self._text.append(item.text)
            if not self.stream:
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
        counted = f"{call.kind}_requests"
        if counted in self.server_tools:
            self.server_tools[counted] += 1
        frames = self._start(hosted_block(call, whole=not self.stream), "hosted")
        if not self.stream:
            self.kind = None
            return frames
        given = json.dumps(_input(call.arguments))
        return frames + [({"type": "content_block_delta", "index": len(self.blocks) - 1,
                           "delta": {"type": "input_json_delta", "partial_json": given}},
                          "content_block_delta"), *self._stop()]

    def hosted_result(self, result: HostedResult) -> list[Frame]:
        frames = self._start(hosted_result_block(result), "hosted")
        if result.kind == "web_search":
            self.sources += result.sources()
        return frames + self._stop()

    def _used(self) -> dict[str, int] | None:
        return dict(self.server_tools) if any(self.server_tools.values()) else None

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
            self._whole = message(self.id, self.model, self.blocks, total, total.prompt_tokens, total.cached_tokens,
                                  self._used())
            return frames
        reason, seq = stop_reason(finish)
        usage: dict[str, Any] = {"output_tokens": total.completion_tokens}
        if (used := self._used()) is not None:
            usage["server_tool_use"] = used
        return frames + [({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                           "usage": usage}, "message_delta"),
                         ({"type": "message_stop"}, "message_stop")]

    def fail(self, err: ApiError) -> list[Frame]:
        return [(err.anthropic_body(), "error")]

    def body(self) -> dict[str, Any]:
        return self._whole
