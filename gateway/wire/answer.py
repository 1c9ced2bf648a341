"""One answer, whatever the wire shape: the worker's events turned into thinking and content
pieces and a finish. Streamed and whole answers both consume this, so they cannot drift."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..backends.local import GenerationEvents
from ..backends.upstream import NATIVE
from ..base.errors import ApiError, from_event
from ..engine import ipc
from ..server.events import Observation
from ..text import toolformats
from ..text.reasoning import THINKING, detect
from ..text.toolformats import AnswerParser


@dataclass
class Piece:
    kind: str  # "thinking" | "content"
    text: str
    logprobs: list[dict[str, Any]] | None = None  # the tokens this piece completes, when asked for


@dataclass
class Call:
    """A tool call opens: its id and tool are known; its arguments follow as ``CallArgs``."""

    index: int  # 0, 1, ... within the answer
    id: str  # call_...
    name: str


@dataclass
class CallArgs:
    """A piece of a call's arguments, JSON text; a call's pieces together are one JSON object."""

    index: int
    text: str


Item = Piece | Call | CallArgs  # what an answer yields before its Finish


@dataclass
class Finish:
    reason: str  # stop | length | cancelled | tool_calls (the answer ended after its calls)
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the slot's cache (not decoded again)


def api_error(event: ipc.Error) -> ApiError:
    """The one translation of a worker's error event into what the caller is told."""
    return from_event(event)


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


def prepare(req: ipc.GenerationRequest, model: str, reasoning: str | None, tools: str,
            info: dict[str, Any]) -> None:
    """Settle, once the model is known, how its answer is read: its thinking format (``reasoning``:
    the model's setting; None: thinking is not split out) and, when the request has tools, their
    call format (``tools``: the model's ``tool_format``). Raises 400 ``tools_unsupported`` for
    tools on a model set to ``tool_format: none``."""
    req.reasoning = reasoning_format(reasoning, info) if reasoning else None
    if req.tools:
        req.tool_format = tool_format(tools, info)
        if req.tool_format is None:
            raise ApiError(f"model {model!r} does not take tools (its tool_format is none)", status=400,
                           param="tools", code="tools_unsupported")


async def start(gen: GenerationEvents, req: ipc.GenerationRequest,
                stream: bool) -> tuple[ipc.Start, AnswerParser]:
    """Wait for the backend to accept ``req`` (a refusal raises its error); returns its start
    event (prompt_tokens, prompt_text for echo, ...) and the parser that reads the answer by the
    formats ``prepare`` settled. ``stream=False`` (whole answers): a call is given only once its
    arguments parse, so a whole answer never carries a broken call."""
    event = await gen.next()
    if isinstance(event, ipc.Error):
        raise api_error(event)
    if not isinstance(event, ipc.Start):
        raise ApiError(f"the model worker answered {type(event).__name__} before starting", status=500)
    tools = req.tools if req.tool_format and req.tool_format != NATIVE else None
    return event, AnswerParser(req.tool_format if tools else None, tools, reasoning=req.reasoning,
                               prompt_tail=event.prompt_tail, stream=stream)


async def pieces(gen: GenerationEvents, parser: AnswerParser,
                 obs: Observation | None = None) -> AsyncIterator[Item | Finish]:
    """Thinking and content pieces and calls, then the finish. Token log-probabilities ride on
    the next piece to leave (a marker held back by the parser delays them, never drops them).
    ``obs`` gets the token times and counts (time to first token, inter-token latency) and the
    calls that failed to parse. Thinking and calls a backend received already split (an
    upstream's) pass through; a whole answer holds such calls until their arguments parse."""
    seen = reasoning = 0
    probs: list[dict[str, Any]] = []
    calls = 0
    for_items = _Items()
    native = _NativeCalls(hold=not parser.stream)
    async for event in gen:
        if isinstance(event, ipc.Error):
            raise api_error(event)
        if isinstance(event, ipc.Text | ipc.Thinking):
            n, seen = event.tokens - seen, event.tokens
            if obs is not None:
                obs.tokens(n)
        if isinstance(event, ipc.Text):
            if event.logprobs:
                probs += event.logprobs
            items = parser.feed(event.text)
            if parser.thinking or any(isinstance(i, tuple) and i[0] == THINKING for i in items):
                reasoning += n
            for item in for_items(items):
                if isinstance(item, Piece):
                    item.logprobs, probs = probs or None, []
                elif isinstance(item, Call):
                    calls += 1
                yield item
        elif isinstance(event, ipc.Thinking):
            reasoning += n
            yield Piece(THINKING, event.text)
        elif isinstance(event, ipc.CallDelta):
            for item in native.feed(event):
                yield item
        elif isinstance(event, ipc.Done):
            for item in for_items(parser.flush()):
                if isinstance(item, Piece):
                    item.logprobs, probs = probs or None, []
                elif isinstance(item, Call):
                    calls += 1
                yield item
            for item in native.flush():
                yield item
            calls += native.calls
            reason = event.finish_reason
            completed = for_items.completed + native.calls
            if calls and reason == "stop" and completed:
                reason = "tool_calls"
            finish = Finish(reason, event.stop, event.prompt_tokens, event.completion_tokens,
                            reasoning, event.cached_tokens)
            if obs is not None:
                obs.finished(finish)
                obs.tool_calls += completed
                obs.tool_call_failures += parser.failed + native.failed
            yield finish


class _NativeCalls:
    """Calls a backend received parsed (``CallDelta``), as ``Call`` and ``CallArgs``. ``hold``
    (whole answers): each is given at the end, and only if its arguments are one JSON object;
    otherwise its text becomes content and the failure is recorded."""

    def __init__(self, hold: bool):
        self.hold = hold
        self.calls = 0
        self.failed: list[str] = []
        self._open: dict[int, tuple[str, str, list[str]]] = {}  # index -> (id, name, argument pieces)
        self._index: dict[int, int] = {}  # the upstream's index -> the answer's

    def feed(self, delta: ipc.CallDelta) -> list[Item]:
        if delta.name is not None:
            self._index[delta.index] = len(self._index)
            self._open[delta.index] = (delta.call_id or f"call_{delta.id}_{delta.index}", delta.name, [])
            if not self.hold:
                self.calls += 1
                out: list[Item] = [Call(self._index[delta.index], *self._open[delta.index][:2])]
                return out + ([CallArgs(self._index[delta.index], delta.arguments)] if delta.arguments else [])
        if delta.index not in self._open:
            return []
        self._open[delta.index][2].append(delta.arguments)
        return [] if self.hold or not delta.arguments else [CallArgs(self._index[delta.index], delta.arguments)]

    def flush(self) -> list[Item]:
        if not self.hold:
            return []
        out: list[Item] = []
        for call_id, name, pieces in self._open.values():
            text = "".join(pieces)
            try:
                whole = json.loads(text or "{}")
            except ValueError:
                whole = None
            if not isinstance(whole, dict):
                self.failed.append(f"arguments of {name!r} are not a JSON object: {text[:200]!r}")
                out.append(Piece("content", text))
                continue
            out += [Call(self.calls, call_id, name), CallArgs(self.calls, json.dumps(whole, ensure_ascii=False))]
            self.calls += 1
        return out


class _Items:
    """The parser's items as the answer's: text segments as pieces, calls as ``Call`` and
    ``CallArgs``; counts the calls that ended whole."""

    def __init__(self) -> None:
        self.completed = 0

    def __call__(self, items: list[toolformats.Item]) -> list[Item]:
        out: list[Item] = []
        for item in items:
            if isinstance(item, tuple):
                out.append(Piece(item[0], item[1]))
            elif isinstance(item, toolformats.CallStart):
                out.append(Call(item.index, item.id, item.name))
            elif isinstance(item, toolformats.CallArgs):
                out.append(CallArgs(item.index, item.text))
            elif item.error is None:
                self.completed += 1
        return out
