"""One answer, whatever the wire shape: the worker's events turned into thinking and content
pieces, calls and a finish. Streamed and whole answers both consume this, so they cannot drift.

The items are the tool-call parsers' own (``text/toolformats/items.py``), passed on as they
are: ``Piece``, ``Call`` (the parsers' ``CallStart``) and ``CallArgs``; a parser's ``CallEnd``
is only counted. How an answer is read (``prepare``) was settled once, at the model's load
(``text/formats.py``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import protocol
from ..backends.local import GenerationEvents
from ..base import strictjson
from ..base.errors import ApiError, from_event
from ..text.formats import FORMATS, NATIVE, Formats
from ..text.reasoning import CONTENT, THINKING, unsplit
from ..text.toolformats import TABLE, AnswerParser, CallArgs, CallEnd, CallStart, Piece, frames_answers
from ..text.toolformats import Item as ParserItem

Call = CallStart  # a tool call opens: its id and tool are known; its arguments follow as ``CallArgs``
Item = Piece | Call | CallArgs  # what an answer yields before its Finish


@dataclass
class Finish:
    reason: str  # stop | length | cancelled | tool_calls (the answer ended after its calls)
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the slot's cache (not decoded again)
    drafted: int = 0  # tokens speculative decoding proposed, and those the model kept
    accepted: int = 0


def api_error(event: protocol.Error) -> ApiError:
    """The one translation of a worker's error event into what the caller is told."""
    return from_event(event)


def prepare(req: protocol.GenerationRequest, model: str, info: dict[str, Any], *, thinking: bool = True) -> None:
    """Settle how ``req``'s answer is read, by the formats its model's load settled (``info``:
    what its backend reported, ``Formats`` included): its thinking format (``thinking`` False:
    thinking is not split out) and, when the request has tools or its chat's every answer is
    framed in it (``frames_answers``), their call format. Raises 400 ``tools_unsupported`` for
    tools on a model set to ``tool_format: none``."""
    formats: Formats = info[FORMATS]
    chat = req.messages is not None
    req.reasoning = formats.reasoning if thinking else unsplit(formats.reasoning, chat=chat)
    if req.tools:
        req.tool_format = formats.tools
        if req.tool_format is None:
            raise ApiError(f"model {model!r} does not take tools (its tool_format is none)", status=400,
                           param="tools", code="tools_unsupported")
    elif chat and frames_answers(formats.tools):
        req.tool_format = formats.tools


async def start(gen: GenerationEvents, req: protocol.GenerationRequest,
                stream: bool) -> tuple[protocol.Start, Reader]:
    """Wait for the backend to accept ``req`` (a refusal raises its error); returns its start
    event (prompt_tokens, prompt_text for echo, ...) and the reader of its answer, by the
    formats ``prepare`` settled. ``stream=False`` (whole answers): a call is given only once its
    arguments parse, so a whole answer never carries a broken call."""
    event = await gen.next()
    if isinstance(event, protocol.Error):
        raise api_error(event)
    if not isinstance(event, protocol.Start):
        raise ApiError(f"the model worker answered {type(event).__name__} before starting", status=500)
    tools = req.tools if req.tool_format and req.tool_format != NATIVE else None
    fmt = req.tool_format if tools or frames_answers(req.tool_format) else None
    return event, Reader(AnswerParser(fmt, tools, reasoning=req.reasoning, prompt_tail=event.prompt_tail,
                                      stream=stream))


class Reader:
    """A generation's events (after its ``Start``) read into thinking and content pieces and
    calls, then the finish: ``read`` takes one event and returns what it gives. Token
    log-probabilities ride on the next piece to leave (a marker held back by the parser delays
    them, never drops them). Thinking and calls a backend received already split (an
    upstream's) pass through; a whole answer holds such calls until their arguments parse.

    It counts nothing for anyone: ``tokens`` is what the backend says it generated so far,
    ``fresh`` the tokens the event just read added (None: it was no counted event; 0: a piece
    of text that carried none), and, at the finish, ``completed`` the calls that ended whole and
    ``failures`` the ones that did not parse; the caller's observation takes them from there."""

    def __init__(self, parser: AnswerParser):
        self.parser = parser
        self.tokens = 0
        self.fresh: int | None = None
        self.completed = 0
        self.failures: list[str] = []
        self._reasoning = 0
        self._probs: list[dict[str, Any]] = []
        self._calls = self._whole = 0  # calls opened; the parser's calls that ended whole (a CallEnd without error)
        self._native = _NativeCalls(hold=not parser.stream)

    def _given(self, items: list[ParserItem]) -> list[Item]:
        """The parser's items as the answer gives them: each piece carries the log-probabilities
        held till now; a ``CallEnd`` is only counted."""
        out: list[Item] = []
        for item in items:
            if isinstance(item, CallEnd):
                self._whole += item.error is None
                continue
            if isinstance(item, Piece):
                item.logprobs, self._probs = self._probs or None, []
            elif isinstance(item, Call):
                self._calls += 1
            out.append(item)
        return out

    def read(self, event: protocol.Event) -> Sequence[Item | Finish]:
        if isinstance(event, protocol.Error):
            raise api_error(event)
        n = 0
        self.fresh = None
        # an upstream's call pieces count as its text does (a backend that sends no count: 0)
        if isinstance(event, protocol.Text | protocol.Thinking) or (isinstance(event, protocol.CallDelta)
                                                          and event.tokens > self.tokens):
            n, self.tokens = event.tokens - self.tokens, event.tokens
            self.fresh = n
        if isinstance(event, protocol.Text):
            if event.logprobs:
                self._probs += event.logprobs
            parser = self.parser
            items = parser.feed(event.text)
            if parser.thinking or any(isinstance(i, Piece) and i.kind == THINKING for i in items):
                self._reasoning += n
            return self._given(items)
        if isinstance(event, protocol.Thinking):
            self._reasoning += n
            return [Piece(THINKING, event.text)]
        if isinstance(event, protocol.CallDelta):
            return self._native.feed(event)
        if isinstance(event, protocol.Done):
            return self._done(event)
        return []

    def _done(self, event: protocol.Done) -> list[Item | Finish]:
        parser, native = self.parser, self._native
        failures = len(parser.failed)
        rest = self._given(parser.flush())
        if event.finish_reason == "length":
            rest = _cut(rest, parser, failures)
        out: list[Item | Finish] = [*rest, *native.flush()]
        self._calls += native.calls
        reason = event.finish_reason
        self.completed = self._whole + native.calls
        if self._calls and reason == "stop" and self.completed:
            reason = "tool_calls"
        self.failures = [*parser.failed, *native.failed]
        out.append(Finish(reason, event.stop, event.prompt_tokens, event.completion_tokens,
                          self._reasoning, event.cached_tokens, event.drafted, event.accepted))
        return out


@dataclass
class Whole:
    """A whole answer's pieces and calls gathered: its text of each kind, its calls (each
    ``{"id", "name", "arguments"}``, the arguments as JSON text) and, where ``logprobs`` starts
    as a list, the log-probabilities its pieces carried."""

    text: dict[str, list[str]] = field(default_factory=lambda: {"content": [], "thinking": []})
    calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None

    def feed(self, item: Item) -> None:
        if isinstance(item, Piece):
            self.text[item.kind].append(item.text)
            if self.logprobs is not None and item.logprobs:
                self.logprobs += item.logprobs
        elif isinstance(item, Call):
            self.calls.append({"id": item.id, "name": item.name, "arguments": ""})
        else:  # the open call's arguments go on
            self.calls[-1]["arguments"] += item.text

    @property
    def content(self) -> str:
        return "".join(self.text["content"])

    @property
    def thinking(self) -> str:
        return "".join(self.text["thinking"])


def _cut(items: list[Item], parser: AnswerParser, failures: int) -> list[Item]:
    """The last items of an answer cut by max_tokens, less the text the tool-call parser held
    back to the end because it belonged to no finished text: a call cut inside (its flush
    recorded a failure: a call whose arguments did not complete is never a call, and its raw
    text is no content either) or a marker begun (a prefix of one of the format's markers, such
    as a closer cut after the arguments). llama.cpp's reading of a cut answer holds such
    fragments back too. Whitespace alone is kept (a cut answer ends as it was written)."""
    if parser.tools is None:
        return items
    markers = TABLE[parser.tools.fmt].MARKERS
    failed = len(parser.failed) > failures

    def fragment(item: Item) -> bool:
        text = item.text.strip() if isinstance(item, Piece) and item.kind == CONTENT else ""
        return bool(text) and (failed or any(m.startswith(text) for m in markers))

    return [item for item in items if not fragment(item)]


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

    def feed(self, delta: protocol.CallDelta) -> list[Item]:
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
            try:  # strict and bounded: an upstream's arguments nested thousands deep are no call either
                whole = strictjson.loads(text or "{}")
            except ValueError:
                whole = None
            if not isinstance(whole, dict):
                self.failed.append(f"arguments of {name!r} are not a JSON object: {text[:200]!r}")
                out.append(Piece("content", text))
                continue
            out += [Call(self.calls, call_id, name), CallArgs(self.calls, json.dumps(whole, ensure_ascii=False))]
            self.calls += 1
        return out
