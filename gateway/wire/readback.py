"""A captured answer read back into its parts: ``read_answer(route, stream, body)`` takes the
bytes a client received (a whole JSON answer, or a stream's frames: SSE for OpenAI's,
Anthropic's, the Responses API's and llama-server's routes, a JSON object a line for Ollama's
``/api/*``) and gives its thinking, content and tool calls, as the captures' page shows them.

Each wire is read as its own clients read it: OpenAI's chat ``reasoning_content`` (or
``reasoning``), ``content`` and ``tool_calls`` (streamed by index, the arguments in pieces), its
text completions' ``text``, choice 0 only (``choices`` says how many were seen); Anthropic's
``thinking``, ``text`` and ``tool_use`` blocks (an ``input`` object as JSON text; streamed, the
``input_json_delta`` pieces; a hosted tool's blocks are no call); the Responses API's
``reasoning``, ``message``, ``function_call`` and ``custom_tool_call`` items (streamed, their
deltas, each item replaced by its whole form once
``response.output_item.done`` or the final response gives it); Ollama's ``message`` (or
generate's ``response`` and ``thinking``), its calls' argument objects as JSON text;
llama-server's ``content`` (``/infill``). ``finish_reason`` is in the wire's own words
(``stop``, ``end_turn``, ``completed`` or ``max_output_tokens``, ``eos``); ``usage`` is the
wire's own object (Ollama's and llama-server's counts gathered into one); ``error`` is the
message of an error the answer holds (an error body, an in-band error event), or, where nothing
of an answer could be read, why.

Pure, never raises, and linear in the body's length: bytes that are not UTF-8 are replaced, a
frame that is not a JSON object (a stream cut short by the capture's bound ends in one) or not
of the wire's shape is skipped, and JSON is read by ``strictjson`` (bounded depth).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ..base import strictjson

MAX_ERROR = 2000  # characters of an error's message kept

SSE, LINES = "sse", "lines"
# route -> (wire, how its streams are framed); routes not here have no answers to read
_ROUTES: dict[str, tuple[str, str]] = {
    "/v1/chat/completions": ("openai", SSE), "/v1/completions": ("openai", SSE),
    "/v1/fim/completions": ("openai", SSE), "/v1/embeddings": ("openai", SSE),
    "/v1/messages": ("anthropic", SSE),
    "/v1/responses": ("responses", SSE), "/v1/responses/{response_id}": ("responses", SSE),
    "/api/chat": ("ollama", LINES), "/api/generate": ("ollama", LINES), "/api/embed": ("ollama", LINES),
    "/api/embeddings": ("ollama", LINES),
    "/infill": ("llama", SSE), "/completion": ("llama", SSE),
}
OLLAMA_STATS = ("prompt_eval_count", "eval_count", "total_duration", "load_duration", "prompt_eval_duration",
                "eval_duration")
LLAMA_STATS = ("tokens_predicted", "tokens_evaluated", "tokens_cached")


class _Call:
    __slots__ = ("id", "name", "parts", "whole")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name = ""
        self.parts: list[str] = []  # argument pieces, as streamed
        self.whole: str | None = None  # the arguments given whole (where no pieces came)

    def named(self, call_id: Any, name: Any) -> None:
        if self.id is None and isinstance(call_id, str):
            self.id = call_id
        if not self.name and isinstance(name, str):
            self.name = name

    def out(self) -> dict[str, Any]:
        arguments = "".join(self.parts) if self.parts else self.whole or ""
        return {"id": self.id, "name": self.name, "arguments": arguments}


class _Answer:
    """What has been read so far."""

    def __init__(self) -> None:
        self.thinking: list[str] = []
        self.content: list[str] = []
        self.calls: dict[Any, _Call] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None
        self.choices: set[Any] = set()  # OpenAI's choice indices seen
        self.answered = False  # some part of an answer (another wire's one choice) was seen
        self.seen = False  # anything of the wire's shape, an error or usage included
        self.items: dict[Any, _Item] = {}  # the Responses API's output items, by output index
        self.opened: dict[Any, str] = {}  # Anthropic's streamed tool_use blocks' first input, until they stop

    def call(self, key: Any) -> _Call:
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = _Call()
        return call

    def text(self, into: list[str], value: Any) -> None:
        if isinstance(value, str):
            into.append(value)
            self.answered = self.seen = True

    def fail(self, obj: dict[str, Any]) -> None:
        """The error ``obj`` tells, if any: OpenAI's and Anthropic's ``{"error": {...}}``,
        Ollama's ``{"error": "..."}``, the Responses API's ``error`` event."""
        err = obj.get("error")
        if err is None and obj.get("type") == "error":
            err = obj
        if isinstance(err, str):
            message = err
        elif isinstance(err, dict):
            found = err.get("message")
            message = found if isinstance(found, str) else _dumps(err)
        else:
            return
        self.error, self.seen = message[:MAX_ERROR], True

    def result(self, wire: str) -> dict[str, Any]:
        for key, item in self.items.items():  # in order; a reasoning item's summary where it has no text
            self.thinking += item.reasoning or item.summary
            self.content += item.text
            if item.call is not None:
                self.calls[("item", key)] = item.call
        choices = len(self.choices) if wire == "openai" else int(self.answered)
        return {"thinking": "".join(self.thinking), "content": "".join(self.content),
                "calls": [c.out() for c in self.calls.values()], "finish_reason": self.finish_reason,
                "usage": self.usage, "error": self.error, "choices": choices}


def read_answer(route: str, stream: bool, body: bytes) -> dict[str, Any]:
    """``body``, the answer to a request on ``route`` (aiohttp's canonical route) as its client
    received it, whole or (``stream``) its frames, possibly cut short: ``{"thinking",
    "content", "calls": [{"id", "name", "arguments"}], "finish_reason", "usage", "error",
    "choices"}``. Never raises."""
    ans = _Answer()
    known = _ROUTES.get(route) if isinstance(route, str) else None
    if known is None:
        ans.error = f"answers to {str(route)[:200]!r} are not read back"
        return ans.result("")
    wire, framing = known
    try:
        text = bytes(body).decode("utf-8", "replace")
        why = _read(text, stream, framing, _READERS[wire], ans)
    except Exception as e:  # noqa: BLE001 (a bug here must not break the page): what was read stands
        why = f"the answer could not be read ({type(e).__name__})"
        ans.seen = False
    if not ans.seen and ans.error is None:
        ans.error = why or f"nothing in the answer has the shape of an answer on {route}"
    return ans.result(wire)


Reader = Callable[[dict[str, Any], _Answer], None]


def _read(text: str, stream: bool, framing: str, read: Reader, ans: _Answer) -> str | None:
    """Each object of ``text`` through ``read``; why nothing could be read, where that is known."""
    if not text.strip():
        return "the answer is empty"
    whole = not stream or text.lstrip().startswith("{")  # a refusal before a stream opened is whole JSON
    if whole:
        try:
            obj = strictjson.loads(text, "answer")
        except ValueError as e:
            if not stream:
                looks_streamed = "data:" in text if framing == SSE else text.strip().count("\n") > 0
                if not looks_streamed:
                    return str(e)[:MAX_ERROR]
            # else: frames after all (Ollama's lines start with "{" too)
        else:
            if isinstance(obj, dict):
                read(obj, ans)
                return None
            return "the answer is not a JSON object"
    frames = parsed = 0
    for data in (_sse(text) if framing == SSE else _lines(text)):
        frames += 1
        try:
            obj = strictjson.loads(data, "frame")
        except ValueError:
            continue  # [DONE], a frame cut short, garbage
        if isinstance(obj, dict):
            parsed += 1
            read(obj, ans)
    if not frames:
        return "the stream holds no data frames"
    if not parsed:
        return f"none of the stream's {frames} frames is a JSON object"
    return None


def _sse(text: str) -> Iterator[str]:
    """The data of each server-sent event (its ``event:`` line aside: the data names its type);
    comments (``: loading 43%``) skipped, and a last event without its blank line given too."""
    data: list[str] = []
    for line in text.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            if data:
                yield "\n".join(data)
            data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _lines(text: str) -> Iterator[str]:
    for line in text.split("\n"):
        line = line.strip()
        if line and not line.startswith(":"):
            yield line


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _key(value: Any, default: Any) -> Any:
    """An index from the wire, or ``default`` where it is none (a bool, an object)."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else default


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- OpenAI: chat and text completions, Mistral's FIM, embeddings -----------------------------

def _openai(obj: dict[str, Any], ans: _Answer) -> None:
    ans.fail(obj)
    if isinstance(obj.get("usage"), dict):
        ans.usage, ans.seen = obj["usage"], True
    if isinstance(obj.get("data"), list):  # embeddings
        ans.seen = True
    if not isinstance(obj.get("choices"), list):
        return
    ans.seen = True
    for position, choice in enumerate(obj["choices"]):
        if not isinstance(choice, dict):
            continue
        index = _key(choice.get("index"), position)
        ans.choices.add(index)
        if index != 0:
            continue
        if isinstance(choice.get("finish_reason"), str):
            ans.finish_reason = choice["finish_reason"]
        ans.text(ans.content, choice.get("text"))  # a text completion's
        for part in (choice.get("message"), choice.get("delta")):
            if isinstance(part, dict):
                _openai_message(part, ans)


def _openai_message(msg: dict[str, Any], ans: _Answer) -> None:
    """A whole message or a streamed delta: both name their parts alike."""
    thinking = msg.get("reasoning_content")  # the same text under both names, where both are sent
    ans.text(ans.thinking, thinking if isinstance(thinking, str) else msg.get("reasoning"))
    content = msg.get("content")
    if isinstance(content, list):  # parts, as some servers give a message's content
        for part in content:
            ans.text(ans.content, _dict(part).get("text"))
    else:
        ans.text(ans.content, content)
    for position, tc in enumerate(_list(msg.get("tool_calls"))):
        if not isinstance(tc, dict):
            continue
        ans.answered = True
        call = ans.call(_key(tc.get("index"), position))
        fn = _dict(tc.get("function"))
        call.named(tc.get("id"), fn.get("name"))
        if fn.get("arguments") is not None:
            call.parts.append(_dumps(fn["arguments"]))


# --- Anthropic --------------------------------------------------------------------------------

def _anthropic(obj: dict[str, Any], ans: _Answer) -> None:
    kind = obj.get("type")
    ans.fail(obj)
    if kind in ("message", "message_start", "content_block_start", "content_block_delta"):
        ans.answered = True
    if kind in ("message", "message_start", "message_delta", "message_stop", "ping") or kind in _BLOCK_EVENTS:
        ans.seen = True
    index = _key(obj.get("index"), None)
    if kind == "message":  # whole
        for position, block in enumerate(_list(obj.get("content"))):
            _block(_dict(block), position, ans)
        _stop(obj, ans)
        if isinstance(obj.get("usage"), dict):
            ans.usage = obj["usage"]
    elif kind == "message_start":
        usage = _dict(obj.get("message")).get("usage")
        if isinstance(usage, dict):
            ans.usage = dict(usage)
    elif kind == "content_block_start":
        _block(_dict(obj.get("content_block")), index, ans)
        call = ans.calls.get(("block", index))
        if call is not None and call.whole is not None:  # its input comes in pieces; {} until then
            ans.opened[index], call.whole = call.whole, None
    elif kind == "content_block_delta":
        delta = _dict(obj.get("delta"))
        dtype = delta.get("type")
        if dtype == "text_delta":
            ans.text(ans.content, delta.get("text"))
        elif dtype == "thinking_delta":
            ans.text(ans.thinking, delta.get("thinking"))
        elif dtype == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            call = ans.calls.get(("block", index))  # none: a hosted tool's input (server_tool_use), no call
            if call is not None:
                call.parts.append(delta["partial_json"])
    elif kind == "content_block_stop":  # a call that got no pieces: the input it started with
        call = ans.calls.get(("block", index))
        if call is not None and index in ans.opened:
            call.whole = ans.opened.pop(index)
    elif kind == "message_delta":
        _stop(_dict(obj.get("delta")), ans)
        if isinstance(obj.get("usage"), dict):
            ans.usage = {**(ans.usage or {}), **obj["usage"]}


_BLOCK_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop")


def _block(block: dict[str, Any], index: Any, ans: _Answer) -> None:
    kind = block.get("type")
    if kind == "text":
        ans.text(ans.content, block.get("text"))
    elif kind == "thinking":
        ans.text(ans.thinking, block.get("thinking"))
    elif kind == "tool_use":
        call = ans.call(("block", index))
        call.named(block.get("id"), block.get("name"))
        if "input" in block:
            call.whole = _dumps(block["input"])


def _stop(obj: dict[str, Any], ans: _Answer) -> None:
    if isinstance(obj.get("stop_reason"), str):
        ans.finish_reason = obj["stop_reason"]


# --- OpenAI's Responses API -----------------------------------------------------------------

class _Item:
    """One output item as read so far."""

    __slots__ = ("kind", "reasoning", "summary", "text", "call")

    def __init__(self) -> None:
        self.kind: Any = None
        self.reasoning: list[str] = []
        self.summary: list[str] = []
        self.text: list[str] = []
        self.call: _Call | None = None

    def begin(self, item: dict[str, Any]) -> None:
        if self.kind is None:
            self.kind = item.get("type")
        if self.kind in ("function_call", "custom_tool_call"):
            self.call = self.call or _Call()
            self.call.named(item.get("call_id"), item.get("name"))

    def whole(self, item: dict[str, Any]) -> None:
        """The item as ``response.output_item.done`` (or the final response) gives it: what
        its deltas said is replaced, unless it is still in progress (a failed response's last
        item holds none of what was streamed of it)."""
        streamed = self.reasoning or self.summary or self.text or (self.call is not None and self.call.parts)
        if item.get("status") == "in_progress" and streamed:
            return
        self.kind = None
        self.begin(item)
        if self.kind == "reasoning":
            self.reasoning = _texts(item.get("content"), "reasoning_text")
            self.summary = _texts(item.get("summary"), "summary_text")
        elif self.kind == "message":
            self.text = _texts(item.get("content"), "output_text")
        elif self.call is not None:
            value = item.get("arguments" if self.kind == "function_call" else "input")
            if value is not None:
                self.call.parts = [_dumps(value)]


def _texts(parts: Any, kind: str) -> list[str]:
    return [p["text"] for p in map(_dict, _list(parts)) if p.get("type") == kind and isinstance(p.get("text"), str)]


def _item_at(ans: _Answer, index: Any) -> _Item:
    found = ans.items.get(index)
    if found is None:
        found = ans.items[index] = _Item()
    return found


def _response(response: dict[str, Any], ans: _Answer) -> None:
    """A whole response, or the one a stream's event carries (created, completed, failed, ...)."""
    ans.fail(response)
    status = response.get("status")
    reason = _dict(response.get("incomplete_details")).get("reason")
    if isinstance(reason, str):
        ans.finish_reason = reason
    elif isinstance(status, str) and status not in ("in_progress", "queued"):
        ans.finish_reason = status
    if isinstance(response.get("usage"), dict):
        ans.usage = response["usage"]
    for index, item in enumerate(_list(response.get("output"))):
        if isinstance(item, dict):
            _item_at(ans, index).whole(item)


_DELTAS = {"response.reasoning_text.delta": "reasoning", "response.reasoning_summary_text.delta": "summary",
           "response.output_text.delta": "text", "response.function_call_arguments.delta": "call",
           "response.custom_tool_call_input.delta": "call"}


def _responses(obj: dict[str, Any], ans: _Answer) -> None:
    kind = obj.get("type")
    if obj.get("object") == "response":  # whole
        ans.seen = ans.answered = True
        _response(obj, ans)
        return
    ans.fail(obj)  # an error event, or a refusal's ``{"error": {...}}``
    if not isinstance(kind, str) or not kind.startswith("response."):
        return
    ans.seen = ans.answered = True
    index, delta, item = _key(obj.get("output_index"), None), obj.get("delta"), obj.get("item")
    if isinstance(obj.get("response"), dict):
        _response(obj["response"], ans)
    elif kind == "response.output_item.added" and isinstance(item, dict):
        _item_at(ans, index).begin(item)
    elif kind == "response.output_item.done" and isinstance(item, dict):
        _item_at(ans, index).whole(item)
    elif kind in _DELTAS and isinstance(delta, str):
        found = _item_at(ans, index)
        if _DELTAS[kind] == "call":
            found.call = found.call or _Call()
            found.call.parts.append(delta)
        else:
            getattr(found, _DELTAS[kind]).append(delta)


# --- Ollama -----------------------------------------------------------------------------------

def _ollama(obj: dict[str, Any], ans: _Answer) -> None:
    ans.fail(obj)
    msg = obj.get("message")
    if isinstance(msg, dict):  # /api/chat
        ans.seen = ans.answered = True
        ans.text(ans.content, msg.get("content"))
        ans.text(ans.thinking, msg.get("thinking"))
        for tc in map(_dict, _list(msg.get("tool_calls"))):  # each call whole
            fn = _dict(tc.get("function"))
            call = ans.call(len(ans.calls))
            call.named(tc.get("id"), fn.get("name"))
            call.whole = _dumps(fn.get("arguments", {}))
    if "response" in obj:  # /api/generate
        ans.seen = ans.answered = True
        ans.text(ans.content, obj.get("response"))
        ans.text(ans.thinking, obj.get("thinking"))
    if isinstance(obj.get("embeddings"), list) or isinstance(obj.get("embedding"), list):
        ans.seen = True
    if obj.get("done") is True and isinstance(obj.get("done_reason"), str):
        ans.finish_reason = obj["done_reason"]
    _stats(obj, OLLAMA_STATS, ans)


def _stats(obj: dict[str, Any], names: tuple[str, ...], ans: _Answer) -> None:
    found = {k: obj[k] for k in names if isinstance(obj.get(k), int) and not isinstance(obj.get(k), bool)}
    if found:
        ans.usage = {**(ans.usage or {}), **found}
        ans.seen = True


# --- llama-server's /completion shape (/infill) ------------------------------------------------

def _llama(obj: dict[str, Any], ans: _Answer) -> None:
    ans.fail(obj)
    if "content" in obj:
        ans.seen = ans.answered = True
        ans.text(ans.content, obj["content"])
    if obj.get("stop") is True and isinstance(obj.get("stop_type"), str):
        ans.finish_reason = obj["stop_type"]
    _stats(obj, LLAMA_STATS, ans)
    if isinstance(obj.get("timings"), dict) and ans.usage is not None:
        ans.usage["timings"] = obj["timings"]


_READERS: dict[str, Reader] = {"openai": _openai, "anthropic": _anthropic, "responses": _responses,
                               "ollama": _ollama, "llama": _llama}
