"""The OpenAI wire spoken as a client to an upstream server: a ``GenerationRequest`` as the
body of ``/chat/completions`` or ``/completions`` (or, to fill in the middle, llama-server's
``/infill``), the upstream's server-sent events back as
backend events (``Start`` is the backend's; ``Text``, ``Thinking``, ``CallDelta``, ``Done``
come from here), its embeddings and model list, and its error bodies as ``ApiError``s. Pure: no
I/O, so every cut of a stream and every malformed chunk is testable without a server.

Whatever the caller spoke (OpenAI or Anthropic), the upstream hears OpenAI: the gateway's own
request is already the common ground, and every server in reach (another gguf-gateway,
llama-server, vLLM, Ollama's and LM Studio's ``/v1``) speaks it.

An upstream is another party: nothing it sends is trusted to be small. Every answer has a
byte bound here (an event, a stream, a whole answer, an embeddings answer by its inputs, a
model list), and the model ids it lists are taken only when they can be names
(``untrusted.name_problem``), at most ``MAX_LISTED`` of them. Text it chose that goes into a
message (an error's) is shown escaped (``untrusted.shown``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..base.errors import ApiError
from ..engine.ipc import CallDelta, Done, Event, GenerationRequest, Text, Thinking
from .untrusted import name_problem, shown

# Sampling fields OpenAI defines, then those llama.cpp's server (and vLLM, LM Studio) add: only
# the ones a caller or the model's defaults set are sent (GenerationRequest.given).
SAMPLING_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed",
                   "top_k", "min_p", "repeat_penalty")
MAX_EVENT_BYTES = 8 * 2**20  # one server-sent event, or a whole answer where a stream was asked for
MAX_ERROR_BYTES = 64 * 1024  # of an upstream's error body read for its message
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
EMBEDDING_BYTES = 256 * 1024  # one input's vector as JSON floats, with room past 8192 dimensions
MAX_LIST_BYTES = 2 * 2**20  # an upstream's /models answer: parsed on the event loop, so kept small
MAX_LISTED = 1000  # model ids taken from one upstream's list (each becomes a row of /models)
MAX_RETRY_AFTER = 3600.0  # seconds: an upstream's Retry-After is passed on at most this
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")  # an upstream's error code passed on (it becomes a metric's label)


class MalformedStream(ApiError):
    """The upstream's answer is not what the OpenAI wire says it should be."""

    def __init__(self, why: str, what: str = "stream"):
        super().__init__(f"the upstream server sent a malformed {what}: {why}", status=502,
                         code="upstream_malformed")


def too_large(what: str, limit: int) -> MalformedStream:
    return MalformedStream(f"{what} of more than {limit} bytes", "answer")


def _loads(data: str | bytes, what: str, where: str = "stream") -> Any:
    """JSON, or ``MalformedStream`` (nesting too deep for the parser included)."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise MalformedStream(f"{what} that is not JSON: {shown(_text_of(data[:80]))!r}", where) from None


def _text_of(data: str | bytes) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A history message as OpenAI takes it: a call's arguments as JSON text, thinking as
    ``reasoning_content`` (llama.cpp's server and vLLM read it back), nothing of the chat
    template's own shape."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content", "")}
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("tool_call_id")
    elif isinstance(m.get("name"), str):
        out["name"] = m["name"]
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["function"]["name"], "arguments": _json_text(
                                  c["function"]["arguments"])}} for c in m["tool_calls"]]
        out["content"] = out["content"] or None
    if isinstance(m.get("reasoning_content"), str):
        out["reasoning_content"] = m["reasoning_content"]
    return out


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def request_body(req: GenerationRequest, model: str) -> tuple[str, dict[str, Any]]:
    """(path under the upstream's base URL, JSON body) for ``req``, always streamed: a whole
    answer is the stream collected, as for a local model."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if req.messages is not None:
        path = "/chat/completions"
        body["messages"] = [_message(m) for m in req.messages]
        if req.tools:
            # a choice of several tools (allowed_tools) reaches the upstream as those tools alone,
            # which every OpenAI-compatible server follows
            allowed = req.tool_names
            body["tools"] = [t for t in req.tools if allowed is None or t["function"]["name"] in allowed]
            body["tool_choice"] = ({"type": "function", "function": {"name": allowed[0]}}
                                   if allowed is not None and len(allowed) == 1 and req.tool_choice == "required"
                                   else req.tool_choice)
            if not req.parallel_tool_calls:
                body["parallel_tool_calls"] = False
        if req.chat_template_kwargs:
            body["chat_template_kwargs"] = req.chat_template_kwargs
        if req.logprobs is not None:
            body["logprobs"], body["top_logprobs"] = True, req.logprobs
    else:
        path = "/completions"
        body["prompt"] = req.prompt if req.prompt is not None else req.prompt_tokens
        if req.echo:
            body["echo"] = True
        if req.suffix is not None:  # fill in the middle, where the upstream has no /infill
            _fim_fallback(req)
            body["suffix"] = req.suffix
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    for name in req.given:
        if name in SAMPLING_FIELDS:
            body[name] = getattr(req, name)
    if req.stop:
        body["stop"] = req.stop
    if req.grammar is not None:
        body["grammar"] = req.grammar
    if req.response_format == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif req.response_format == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": req.json_schema}}
    if req.ignore_eos:
        body["ignore_eos"] = True
    return path, body


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
        self.tokens = 0  # chunks with generated text: a token each for llama.cpp's server
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
        return self.take(_loads(data, "an event"), len(data))

    def take(self, chunk: Any, size: int) -> list[Event]:
        """One chunk, parsed (``size``: its JSON's bytes)."""
        if self.done:
            return []
        if not isinstance(chunk, dict):
            raise MalformedStream("an event that is not a JSON object")
        if "error" in chunk:
            raise in_band_error(chunk["error"])
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
        self.prompt_tokens = _count(usage.get("prompt_tokens"))
        self.completion_tokens = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        self.cached_tokens = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0

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
            return CallDelta(self.rid, index, call_id, name, arguments)
        return CallDelta(self.rid, index, None, None, arguments)

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
    data = _loads(body, "a whole answer", "answer")
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


# --- fill-in-the-middle ----------------------------------------------------------------------
# A FIM request (``req.suffix`` set) goes to the upstream's llama-server-shaped ``POST /infill``
# (at the server's root, beside the OpenAI base URL's /v1: llama-server and this gateway serve it
# there), which lays the prompt out from the model's FIM tokens where the vocabulary is. An
# upstream that answers one of FIM_FALLBACK for it (vLLM, Ollama, LM Studio) gets
# ``request_body``'s ``/completions`` with ``prompt`` and ``suffix`` instead, the OpenAI shape
# their completions take a suffix in.
FIM_FALLBACK = (404, 405)
# A backend's ``fim`` info where its upstream server is sent fill-in-the-middle: whether the model
# can is not known here, the upstream refuses for itself
FIM_FORWARDED = "upstream"


def infill_url(base_url: str) -> str:
    """The upstream's /infill: at the root of the server whose OpenAI base URL is ``base_url``
    (its trailing ``/v1`` left out)."""
    root = base_url.rstrip("/")
    return (root[:-len("/v1")] if root.endswith("/v1") else root) + "/infill"


def infill_body(req: GenerationRequest, model: str) -> dict[str, Any]:
    """llama-server's /infill request for ``req`` (``req.suffix`` set), always streamed."""
    assert req.suffix is not None and req.prompt is not None
    body: dict[str, Any] = {"model": model, "stream": True, "input_prefix": req.prompt, "input_suffix": req.suffix}
    if req.infill_extra:
        body["input_extra"] = req.infill_extra
    if req.infill_prompt:
        body["prompt"] = req.infill_prompt
    if req.max_tokens is not None:
        body["n_predict"] = req.max_tokens
    for name in req.given:
        if name in SAMPLING_FIELDS:
            body[name] = getattr(req, name)
    if req.stop:
        body["stop"] = req.stop
    if req.ignore_eos:
        body["ignore_eos"] = True
    return body


def _fim_fallback(req: GenerationRequest) -> None:
    """Refuse what the OpenAI completions shape cannot carry, rather than drop it."""
    for value, param in ((req.infill_extra, "input_extra"), (req.infill_prompt, "prompt")):
        if value:
            raise ApiError(f"`{param}` cannot reach this model: its upstream server has no /infill, and its "
                           "/completions takes a prompt and a suffix only; leave it out", status=501,
                           param=param, code="fim_not_supported")


class InfillReader:
    """An upstream's /infill stream (llama-server's /completion shape: ``{"content", "stop":
    false}`` per piece, the last with ``"stop": true``, its ``stop_type``, token counts and
    ``timings``; no ``[DONE]``) -> backend events, with ``ChunkReader``'s bounds and interface."""

    chat = False

    def __init__(self, rid: int, bounds: Bounds = Bounds()):
        self.rid, self.bounds = rid, bounds
        self.tokens = self.pieces = self.kept = 0
        self.done = self.truncated = False
        self.finish: str | None = None
        self.stop: str | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.usage = False

    def feed(self, data: str) -> list[Event]:
        if self.done:
            return []
        if data.strip() == "[DONE]":  # a server that sends one anyway
            self.done = True
            return [self.finished()]
        return self.take(_loads(data, "an event"), len(data))

    def whole(self, body: bytes) -> list[Event]:
        """A whole answer (stream: false, or a server that ignored stream: true): the last object."""
        return self.take(_loads(body, "a whole answer", "answer"), len(body)) + self.feed("[DONE]")

    def take(self, chunk: Any, size: int) -> list[Event]:
        if self.done:
            return []
        if not isinstance(chunk, dict):
            raise MalformedStream("an event that is not a JSON object")
        if "error" in chunk:
            raise in_band_error(chunk["error"])
        content = chunk.get("content")
        if content is not None and not isinstance(content, str):
            raise MalformedStream("`content` that is not a string")
        out: list[Event] = []
        if content:
            self.tokens += 1
            out.append(Text(self.rid, content, self.tokens, None))
            self.pieces += 1
            self.kept += size
            if self.pieces > self.bounds.chunks or self.kept > self.bounds.bytes:
                return [self.cut()]
        if chunk.get("stop") is True:
            kind = chunk.get("stop_type")
            self.finish = "length" if kind == "limit" else "stop"
            word = chunk.get("stopping_word")
            self.stop = word if kind == "word" and isinstance(word, str) and word else None
            if "tokens_predicted" in chunk or "tokens_evaluated" in chunk:
                self.usage = True
                self.prompt_tokens = _count(chunk.get("tokens_evaluated"))
                self.completion_tokens = _count(chunk.get("tokens_predicted"))
                timings = chunk.get("timings")
                cached = chunk.get("tokens_cached", timings.get("cache_n") if isinstance(timings, dict) else 0)
                self.cached_tokens = _count(cached)
            self.done = True
            out.append(self.finished())
        return out

    def cut(self, reason: str = "length") -> Done:
        self.done = self.truncated = True
        self.finish = reason
        return self.finished()

    def finished(self) -> Done:
        completion = self.completion_tokens if self.usage else self.tokens
        return Done(self.rid, self.finish or "stop", self.stop, self.prompt_tokens, completion, self.cached_tokens)


def embeddings_bound(inputs: int) -> int:
    """The most bytes an embeddings answer for ``inputs`` inputs may take."""
    return MAX_ERROR_BYTES + inputs * EMBEDDING_BYTES


def embeddings_answer(body: bytes, inputs: int) -> tuple[list[list[float]], int]:
    """An upstream's embeddings answer -> (a vector per input, in the inputs' order, prompt
    tokens); ``MalformedStream`` for anything else (a vector too many or too few included)."""
    what = "embeddings answer"
    data = _loads(body, "an answer", what)
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list) or len(items) != inputs or not all(isinstance(d, dict) for d in items):
        raise MalformedStream(f"not one vector for each of the {inputs} inputs", what)
    try:
        items = sorted(items, key=lambda d: d["index"])
        vectors = [[float(x) for x in d["embedding"]] for d in items]
    except (KeyError, TypeError, ValueError, OverflowError):
        raise MalformedStream("an item without an `index` or a list of numbers as its `embedding`", what) from None
    usage = data.get("usage")
    return vectors, _count(usage.get("prompt_tokens") if isinstance(usage, dict) else None)


@dataclass(frozen=True)
class Listing:
    """The model ids an upstream's /models lists that are taken (in its order, each once, at
    most MAX_LISTED), how many were refused as names (and why the first was), and how many
    entries came after the last one taken."""

    ids: list[str]
    refused: int = 0
    why: str | None = None
    left_out: int = 0


def listing(body: bytes) -> Listing | None:
    """An upstream's /models answer (at most MAX_LIST_BYTES: it is parsed on the event loop);
    None when it is not OpenAI's model list."""
    data = _loads(body, "a model list", "model list")
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    ids: dict[str, None] = {}
    refused, why = 0, None
    for seen, item in enumerate(items):
        if len(ids) == MAX_LISTED:  # the rest is not even looked at
            return Listing(list(ids), refused, why, len(items) - seen)
        mid = item.get("id") if isinstance(item, dict) else None
        if (problem := name_problem(mid)) is not None:
            refused += 1
            why = why or f"{shown(str(mid), 40)!r}: {problem}"
        else:
            ids[mid] = None  # type: ignore[index]  # a str: name_problem checked it
    return Listing(list(ids), refused, why)


def retry_after(value: str | None) -> float | None:
    """An upstream's ``Retry-After`` in seconds, at most MAX_RETRY_AFTER; None for anything but
    a number of seconds (an HTTP date, garbage)."""
    value = (value or "").strip()
    if not (value.isascii() and value.isdigit()):
        return None
    return MAX_RETRY_AFTER if len(value) > 6 else min(float(value), MAX_RETRY_AFTER)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def in_band_error(error: Any) -> ApiError:
    """An error event inside an upstream's stream: the answer ends with it."""
    message = error.get("message") if isinstance(error, dict) else error
    return ApiError(f"the upstream server failed mid-answer: {shown(str(message), 500)}", status=502,
                    code="upstream_error")


def error_from(status: int, body: bytes) -> ApiError:
    """An upstream's refusal (a 4xx) as this gateway's error: the same status, message, param and
    code, so the client reads it in its own wire shape. OpenAI's and Anthropic's error bodies and
    plain text are all read; the message is shown escaped and cut, a param or code that is not a
    short identifier is dropped."""
    message, param, code = None, None, None
    try:
        data = json.loads(body[:MAX_ERROR_BYTES])
    except (ValueError, RecursionError):
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message, param, code = error.get("message"), error.get("param"), error.get("code")
    elif isinstance(error, str):
        message = error
    if not isinstance(message, str) or not message.strip():
        message = body[:500].decode(errors="replace").strip() or f"HTTP {status}"
    return ApiError(shown(message, 500), status=status,
                    param=param if isinstance(param, str) and len(param) <= 64 and param.isprintable() else None,
                    code=code if isinstance(code, str) and _CODE.fullmatch(code) else None)
