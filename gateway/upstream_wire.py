"""The OpenAI wire spoken as a client to an upstream server: a ``GenerationRequest`` as the
body of ``/chat/completions`` or ``/completions``, the upstream's server-sent events back as
backend events (``Start`` is the backend's; ``Text``, ``Thinking``, ``CallDelta``, ``Done``
come from here), and its error bodies as ``ApiError``s. Pure: no I/O, so every cut of a
stream and every malformed chunk is testable without a server.

Whatever the caller spoke (OpenAI or Anthropic), the upstream hears OpenAI: the gateway's own
request is already the common ground, and every server in reach (another gguf-gateway,
llama-server, vLLM, Ollama's and LM Studio's ``/v1``) speaks it.
"""

from __future__ import annotations

import json
from typing import Any

from .engine.protocol import CallDelta, Done, Event, GenerationRequest, Text, Thinking
from .errors import ApiError

# Sampling fields OpenAI defines, then those llama.cpp's server (and vLLM, LM Studio) add: only
# the ones a caller or the model's defaults set are sent (GenerationRequest.given).
SAMPLING_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "seed",
                   "top_k", "min_p", "repeat_penalty")
MAX_EVENT_BYTES = 8 * 2**20  # one server-sent event; a larger one is a malformed stream
MAX_ERROR_BYTES = 64 * 1024  # of an upstream's error body read for its message


class MalformedStream(ApiError):
    """The upstream's answer is not the OpenAI stream it should be."""

    def __init__(self, why: str):
        super().__init__(f"the upstream server sent a malformed stream: {why}", status=502,
                         code="upstream_malformed")


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
            body["tools"] = req.tools
            body["tool_choice"] = ({"type": "function", "function": {"name": req.tool_name}} if req.tool_name
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


class SSEDecoder:
    """Bytes of a ``text/event-stream`` in any cuts -> the ``data`` of each event, in order."""

    def __init__(self, limit: int = MAX_EVENT_BYTES):
        self.limit = limit
        self._buf = b""
        self._data: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[str]:
        out: list[str] = []
        self._buf += chunk
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                break
            line, self._buf = self._buf[:end].rstrip(b"\r"), self._buf[end + 1:]
            if not line:  # an event ends
                if self._data:
                    out.append(self._text(b"\n".join(self._data)))
                    self._data, self._size = [], 0
                continue
            if line.startswith(b":"):  # a comment (keep-alive)
                continue
            field, _, value = line.partition(b":")
            if field == b"data":
                value = value[1:] if value.startswith(b" ") else value
                self._data.append(value)
                self._size += len(value)
        if self._size + len(self._buf) > self.limit:
            raise MalformedStream(f"an event of more than {self.limit} bytes")
        return out

    def close(self) -> list[str]:
        """The last event, when the stream ended without the blank line that ends it."""
        data = self._data + ([self._buf[5:].lstrip()] if self._buf.startswith(b"data:") else [])
        self._buf, self._data = b"", []
        return [self._text(b"\n".join(data))] if data else []

    @staticmethod
    def _text(data: bytes) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise MalformedStream("an event that is not UTF-8") from None


class ChunkReader:
    """An upstream's stream, one ``data`` payload at a time -> the backend's events for request
    ``rid``. Raises ``MalformedStream`` for what an OpenAI stream cannot hold, and the
    upstream's own in-band error as an ``ApiError``."""

    def __init__(self, rid: int, chat: bool):
        self.rid, self.chat = rid, chat
        self.tokens = 0  # chunks with generated text: a token each for llama.cpp's server
        self.finish: str | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.usage = False
        self.done = False
        self._calls: set[int] = set()

    def feed(self, data: str) -> list[Event]:
        if self.done:
            return []
        if data.strip() == "[DONE]":
            self.done = True
            return [self.finished()]
        try:
            chunk = json.loads(data)
        except ValueError:
            raise MalformedStream(f"an event that is not JSON: {data[:80]!r}") from None
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
        return out

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

    def finished(self) -> Done:
        """The ``Done`` event: usage as the upstream counted it, else the chunks counted here."""
        reason = {"content_filter": "stop", "function_call": "tool_calls"}.get(self.finish or "stop",
                                                                             self.finish or "stop")
        completion = self.completion_tokens if self.usage else self.tokens
        return Done(self.rid, reason, None, self.prompt_tokens, completion, self.cached_tokens)


def whole_as_chunks(body: bytes, chat: bool) -> list[str]:
    """A whole answer (a server that ignored ``stream: true``) as the stream it stands for: one
    chunk with its text, thinking and calls, then ``[DONE]``, for ``ChunkReader``."""
    try:
        data = json.loads(body)
    except ValueError:
        raise MalformedStream("a whole answer that is not JSON") from None
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
    chunk = {"choices": [part], **({"usage": data["usage"]} if isinstance(data.get("usage"), dict) else {})}
    return [json.dumps(chunk), "[DONE]"]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def in_band_error(error: Any) -> ApiError:
    """An error event inside an upstream's stream: the answer ends with it."""
    message = error.get("message") if isinstance(error, dict) else error
    return ApiError(f"the upstream server failed mid-answer: {str(message)[:500]}", status=502,
                    code="upstream_error")


def error_from(status: int, body: bytes) -> ApiError:
    """An upstream's refusal (a 4xx) as this gateway's error: the same status, message, param and
    code, so the client reads it in its own wire shape. OpenAI's and Anthropic's error bodies and
    plain text are all read."""
    message, param, code = None, None, None
    try:
        data = json.loads(body[:MAX_ERROR_BYTES])
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        message, param, code = error.get("message"), error.get("param"), error.get("code")
    elif isinstance(error, str):
        message = error
    if not isinstance(message, str) or not message:
        message = body[:500].decode(errors="replace").strip() or f"HTTP {status}"
    return ApiError(message, status=status, param=param if isinstance(param, str) else None,
                    code=code if isinstance(code, str) else None)
