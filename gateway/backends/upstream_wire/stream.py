"""An upstream's answer read back: the bytes of its ``text/event-stream`` as events
(``SSEDecoder``), each event's OpenAI chunk as backend events (``ChunkReader``: ``Text``,
``Thinking``, ``CallDelta``, ``Done``; ``Start`` is the backend's), a whole answer where a stream
was asked for read as the stream it stands for, and the bounds on all of it. Pure: no I/O, so
every cut of a stream and every malformed chunk is testable without a server.

An upstream is another party: nothing it sends is trusted to be small. An event, a stream, a
whole answer each have a byte bound here, and an answer's chunks a bound by ``max_tokens``
(``answer_bounds``), past which it ends with finish_reason "length".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...protocol import CallDelta, Done, Event, GenerationRequest, Text, Thinking
from .failures import MalformedStream, check_chunk, count_of, json_of

MAX_EVENT_BYTES = 8 * 2**20  # one server-sent event, or a whole answer where a stream was asked for
# A stream is read at most this much at a time: the events of one read are handed out without
# the event loop running in between, so a flood of small events must come in small bites.
READ_BYTES = 16 * 1024
# Everything one streamed answer may send, comments and empty events included: far above what
# a model's context holds, with its log-probabilities. Past it the answer is malformed.
MAX_STREAM_BYTES = 256 * 2**20
# The chunks that carry an answer (text, thinking, calls, their log-probabilities), and their
# JSON bytes: without max_tokens at most MAX_ANSWER_CHUNKS (a token each: about what a fast model
# writes within the default server.request_timeout) and MAX_ANSWER_BYTES, else by
# max_tokens and CHUNK_BYTES a chunk. Past them the answer ends with finish_reason "length", as a
# local model's does at its limit.
MAX_ANSWER_CHUNKS = 2**16
MAX_ANSWER_BYTES = 32 * 2**20
CHUNK_BYTES = 4096  # one chunk's JSON with room: a token's text or call piece, its top log-probabilities


# Lines that do not matter, as many as come, skipped in one match (a server may send a megabyte
# of blank lines, and a line at a time in Python would hold the event loop): between events,
# every line but a ``data`` line (a run of line ends in one step); inside one, every line but a
# ``data`` line and the blank line that ends it.
_BETWEEN_EVENTS = re.compile(rb"(?:[\r\n]+|(?!data(?::|\r?\n))[^\n]*\n)*")
_INSIDE_EVENT = re.compile(rb"(?:(?!data(?::|\r?\n)|\r?\n)[^\n]*\n)*")
# whole ``data`` lines, as many as follow each other, and each one's field name (and the one space
# after its colon): a run of them is joined in one step too, whatever it holds
_DATA_LINES = re.compile(rb"(?:data(?::[^\n]*|\r)?\n)+")
_DATA_FIELD = re.compile(rb"^data(?:: ?)?", re.MULTILINE)


class SSEDecoder:
    """Bytes of a ``text/event-stream`` in any cuts -> the ``data`` of each event, in order.

    Linear in what it is fed, however it is cut: the unread rest is a ``bytearray`` consumed from
    the front, and a line is searched for once. An event's data (its ``data`` lines joined, each
    counted with its newline, so empty ones count too) and the unfinished line are at most
    ``limit`` bytes together; past that it raises ``MalformedStream``."""

    def __init__(self, limit: int = MAX_EVENT_BYTES):
        self.limit = limit
        self._buf = bytearray()
        self._scanned = 0  # bytes at the front of _buf known to hold no newline
        self._data = bytearray()
        self._pending = False  # a data line came since the last event ended

    def feed(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        buf = self._buf
        buf += chunk
        pos = 0
        while (end := buf.find(b"\n", max(pos, self._scanned))) >= 0:
            self._scanned = 0
            skip = (_INSIDE_EVENT if self._pending else _BETWEEN_EVENTS).match(buf, pos)
            if skip is not None and skip.end() > pos:
                pos = skip.end()
                continue
            run = _DATA_LINES.match(buf, pos)
            if run is None:  # the skips leave data lines and, inside an event, the blank line that ends it
                pos = end + 1
                out.append(self._event())
                continue
            if self._pending:
                self._data += b"\n"
            self._data += _DATA_FIELD.sub(b"", run.group()).replace(b"\r\n", b"\n")[:-1]
            self._pending = True
            pos = run.end()
            if len(self._data) > self.limit:
                break
        del buf[:pos]
        self._scanned = len(buf)
        if len(self._data) + len(buf) > self.limit:
            raise MalformedStream(f"an event of more than {self.limit} bytes")
        return out

    def _event(self) -> str:
        text = self._text(self._data)
        self._data, self._pending = bytearray(), False
        return text

    def close(self) -> list[str]:
        """The last event, when the stream ended without the blank line that ends it."""
        if self._buf.startswith(b"data"):
            self.feed(b"\n")
        self._buf = bytearray()
        return [self._event()] if self._pending else []

    @staticmethod
    def _text(data: bytearray) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise MalformedStream("an event that is not UTF-8") from None


@dataclass(frozen=True)
class Bounds:
    """What one answer may bring before it ends with finish_reason "length": the chunks that
    carry generated output, and their JSON bytes."""

    chunks: int = MAX_ANSWER_CHUNKS
    bytes: int = MAX_ANSWER_BYTES


def answer_bounds(req: GenerationRequest) -> Bounds:
    """``req``'s bounds: with ``max_tokens``, twice that many chunks and some (a server sends a
    token a chunk, or several, but may cut one across two: a character held back, a call's
    arguments in pieces), CHUNK_BYTES each; an echoed prompt comes on top."""
    echoed = 0
    if req.echo:  # the prompt comes back as text: as a string, or as tokens (JSON-escaped at worst)
        echoed = 6 * len(req.prompt) if req.prompt is not None else 256 * len(req.prompt_tokens or ())
    if req.max_tokens is None:
        return Bounds(MAX_ANSWER_CHUNKS, MAX_ANSWER_BYTES + echoed)
    chunks = 2 * req.max_tokens + 16 + (1 if req.echo else 0)
    return Bounds(chunks, min(MAX_ANSWER_BYTES, chunks * CHUNK_BYTES) + echoed)


class ChunkReader:
    """An upstream's stream, one ``data`` payload at a time -> the backend's events for request
    ``rid``. Raises ``MalformedStream`` for what an OpenAI stream cannot hold, and the
    upstream's own in-band error as an ``ApiError``. Past its ``Bounds`` the answer is cut: the
    chunk that passed them is dropped and ``Done`` ends it with "length"."""

    def __init__(self, rid: int, chat: bool, bounds: Bounds = Bounds()):
        self.rid, self.chat, self.bounds = rid, chat, bounds
        self.tokens = 0  # chunks with generated text or calls: a token each for llama.cpp's server
        self.finish: str | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.usage = False
        self.done = False
        self.truncated = False  # ended here (``cut``), not by the upstream's [DONE]
        self.pieces = 0  # chunks that carried generated output
        self.kept = 0  # their JSON bytes
        self._calls: set[int] = set()

    def feed(self, data: str) -> list[Event]:
        if self.done:
            return []
        if data.strip() == "[DONE]":
            self.done = True
            return [self.finished()]
        return self.take(json_of(data, "an event"), len(data))

    def take(self, chunk: Any, size: int) -> list[Event]:
        """One chunk, parsed (``size``: its JSON's bytes)."""
        if self.done:
            return []
        check_chunk(chunk)
        self._usage(chunk.get("usage"))
        choices = chunk.get("choices", [])
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise MalformedStream("`choices` is not a list of objects")
        out: list[Event] = []
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            out += self._choice(choice)
        if out:
            self.pieces += 1
            self.kept += size
            if self.pieces > self.bounds.chunks or self.kept > self.bounds.bytes:
                return [self.cut()]
        return out

    def cut(self, reason: str = "length") -> Done:
        """End the answer here (a bound, the request's deadline): what the upstream sends after
        it is not read."""
        self.done = self.truncated = True
        self.finish = reason
        return self.finished()

    def _usage(self, usage: Any) -> None:
        if usage is None:
            return
        if not isinstance(usage, dict):
            raise MalformedStream("`usage` is not an object")
        self.usage = True
        self.prompt_tokens = count_of(usage.get("prompt_tokens"))
        self.completion_tokens = count_of(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        self.cached_tokens = count_of(details.get("cached_tokens")) if isinstance(details, dict) else 0

    def _choice(self, choice: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        if self.chat:
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedStream("`delta` is not an object")
            for key in ("reasoning_content", "reasoning"):  # the first a server sends: some send both
                thinking = delta.get(key)
                if isinstance(thinking, str) and thinking:
                    self.tokens += 1
                    out.append(Thinking(self.rid, thinking, self.tokens))
                    break
            content = delta.get("content")
            calls = delta.get("tool_calls") or []
            if not isinstance(calls, list):
                raise MalformedStream("`tool_calls` is not a list")
            if calls:
                self.tokens += 1  # a chunk of a call's pieces is generated output, as one of text is
            for call in calls:
                out.append(self._call(call))
        else:
            content = choice.get("text")
        if content is not None and not isinstance(content, str):
            raise MalformedStream("text that is not a string")
        if content:
            self.tokens += 1
            probs = choice.get("logprobs")
            entries = probs.get("content") if self.chat and isinstance(probs, dict) else None
            out.append(Text(self.rid, content, self.tokens, entries if isinstance(entries, list) else None))
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise MalformedStream("`finish_reason` is not a string")
            self.finish = reason
        return out

    def _call(self, call: Any) -> CallDelta:
        if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
            raise MalformedStream("a tool call that is not an object with an index")
        index = call.get("index", 0)
        function = call.get("function") or {}
        if not isinstance(function, dict):
            raise MalformedStream("a tool call's `function` is not an object")
        name, arguments = function.get("name"), function.get("arguments") or ""
        if not isinstance(arguments, str) or (name is not None and not isinstance(name, str)):
            raise MalformedStream("a tool call's name or arguments is not a string")
        if index not in self._calls:
            if not name:
                raise MalformedStream("a tool call's first piece has no name")
            self._calls.add(index)
            call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{self.rid}_{index}"
            return CallDelta(self.rid, index, call_id, name, arguments, self.tokens)
        return CallDelta(self.rid, index, None, None, arguments, self.tokens)

    def whole(self, body: bytes) -> list[Event]:
        """A whole answer where a stream was asked for, read as the stream it stands for."""
        return self.take(whole_as_chunk(body, self.chat), len(body)) + self.feed("[DONE]")

    def finished(self) -> Done:
        """The ``Done`` event: usage as the upstream counted it, else the chunks counted here."""
        reason = {"content_filter": "stop", "function_call": "tool_calls"}.get(self.finish or "stop",
                                                                             self.finish or "stop")
        completion = self.completion_tokens if self.usage else self.tokens
        return Done(self.rid, reason, None, self.prompt_tokens, completion, self.cached_tokens)


def whole_as_chunk(body: bytes, chat: bool) -> dict[str, Any]:
    """A whole answer (a server that ignored ``stream: true``) as the one chunk of the stream it
    stands for (its text, thinking and calls), for ``ChunkReader.take``; ``[DONE]`` follows it."""
    data = json_of(body, "a whole answer", "answer")
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedStream("a whole answer without `choices`")
    choice = choices[0]
    if chat:
        message = choice.get("message")
        if not isinstance(message, dict):
            raise MalformedStream("a whole answer without a `message`")
        delta = {k: message[k] for k in ("content", "reasoning_content", "reasoning") if k in message}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)]
        part: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}
    else:
        part = {"index": 0, "text": choice.get("text"), "finish_reason": choice.get("finish_reason")}
    return {"choices": [part], **({"usage": data["usage"]} if isinstance(data.get("usage"), dict) else {})}
