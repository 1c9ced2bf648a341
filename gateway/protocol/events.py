"""A model worker's events to the gateway (worker -> parent): each is a class below (``Ready``,
``Start``, ``Text``, ``Done``, ``Error``, ...), framed by ``encode_event`` (``framing``) and read
back by ``decode_event``. The one event sent for nearly every token, a text event without
log-probabilities, has a frame of its own that needs no JSON (``text_frame``): its body is a zero
byte, the request id (8 bytes) and the token count (4 bytes), big-endian, then the text in UTF-8
(``decode_event`` reads either kind). On the wire:
  {"ev": "ready", "info": {...}}  or  {"ev": "load_failed", "error": "..."}
  per request, in order:
  {"ev": "start", "id": N, "prompt_tokens": P, "cached_tokens": C, "slot": S, "prompt_tail": "...",
   "cache_source": "slot"|"ram"|"disk"|null}
  {"ev": "text", "id": N, "text": "...", "tokens": T,    zero or more; T = tokens so far;
   "logprobs"?: [{"token", "bytes", "logprob", "top_logprobs": [...]}, ...]}  (when asked)
  {"ev": "done", "id": N, "finish_reason": "stop"|"length"|"cancelled",
   "stop": matched-or-null, "prompt_tokens": P, "completion_tokens": T, "cached_tokens": C,
   "cache_source": ...}  (C: prompt tokens found in the slot's cache, or loaded into it from the
   prompt cache in memory, and not decoded again; cache_source: where they came from)
  {"ev": "tokens", "id": N, "tokens": [...], "pieces"?: [...]}  /  {"ev": "detokenized", "id": N, "text": "..."}
   /  {"ev": "prompt", "id": N, "text": "..."}  (the answers to tokenize, detokenize, apply_template)
  {"ev": "embeddings", "id": N, "data": [[float, ...], ...], "prompt_tokens": P}
  or instead of start/done: {"ev": "error", "id": N, "status": S, "message": "...",
   "param": ..., "code": ...}  (a request the worker refused, e.g. a context overflow)
  {"ev": "adapted", "id": N, "adapters": [{"id", "name", "path", "scale", ...}]}  the adapters now
  {"ev": "cache_held", "bytes": B, "id": N}  the prompt cache's size: where it changed (id 0), or
   the answer to trim_cache N (the gateway's placement counts it in the model's RAM)

Requests take the model's free sequence slots in arrival order (``parallel`` of them, decoded
together: continuous batching; the start event names the slot and how many prompt tokens its
cache already held); the others wait. A cancel ends a running request at the next step
(finish_reason "cancelled") and drops a waiting one without a start event. The worker writes
the events of one step together; an answer's text after its first may wait for the next steps'
(up to ``stream_interval`` seconds, and never across a step that reads a prompt), so a fast
model's tokens arrive in twos or threes, each still its own text event.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from .framing import frame, unjson

_TEXT = struct.Struct(">IBQI")  # frame length, 0 (where JSON has "{"), request id, tokens so far
_TEXT_BODY = struct.Struct(">xQI")


# --- worker -> parent: one class per event --------------------------------------------------

@dataclass(slots=True)
class Ready:
    info: dict[str, Any]


@dataclass(slots=True)
class LoadFailed:
    error: str


@dataclass(slots=True)
class LoadProgress:
    """How far the load has read the weights (llama.cpp's progress callback), 0 to 1; sent
    when the whole percent changes."""

    fraction: float


@dataclass(slots=True)
class Start:
    id: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens found in the slot's cache and not decoded again
    slot: int
    prompt_tail: str = ""
    prompt_text: str | None = None  # the prompt's text, when the request asked for its echo
    # where the cached tokens came from: "slot" (the slot's own cache), "ram" (the prompt cache),
    # "disk" (saved at an unload); None: none were reused
    cache_source: str | None = None


@dataclass(slots=True)
class Text:
    id: int
    text: str
    tokens: int  # generated so far
    logprobs: list[dict[str, Any]] | None = None


@dataclass(slots=True)
class Thinking:
    """Thinking a backend received already split from the answer (an upstream server's
    ``reasoning_content``); a worker never sends it: its thinking is in its text."""

    id: int
    text: str
    tokens: int  # generated so far


@dataclass(slots=True)
class CallDelta:
    """A piece of a tool call a backend received already parsed (an upstream server's
    ``delta.tool_calls``); a worker never sends it. A call's first piece carries its id and name."""

    id: int
    index: int  # 0, 1, ... within the answer
    call_id: str | None
    name: str | None
    arguments: str  # a piece of the arguments' JSON text
    tokens: int = 0  # generated so far, as a text event's (its chunk counted as one)


@dataclass(slots=True)
class Done:
    id: int
    finish_reason: str  # stop | length | cancelled
    stop: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cache_source: str | None = None  # as the start event's
    drafted: int = 0  # tokens speculation proposed (``speculation``), and those the model agreed with
    accepted: int = 0


@dataclass(slots=True)
class Error:
    """A request the worker refused or failed (the gateway turns it into an API error in one
    place: ``answer.api_error``)."""

    id: int
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None  # seconds the caller should wait before trying again


@dataclass(slots=True)
class Tokens:
    id: int
    tokens: list[int]
    pieces: list[str] | None = None


@dataclass(slots=True)
class Detokenized:
    id: int
    text: str


@dataclass(slots=True)
class Prompt:
    id: int
    text: str


@dataclass(slots=True)
class Embeddings:
    id: int
    data: list[list[float]]
    prompt_tokens: int


@dataclass(slots=True)
class CacheHeld:  # the prompt cache's bytes in host memory (as its bound counts them; 0: none)
    bytes: int
    id: int = 0  # the TrimCache it answers; 0: sent where the size changed


@dataclass(slots=True)
class Adapted:  # the answer to ``Adapt``: the adapters as they now are (``Adapters.describe``)
    id: int
    adapters: list[dict[str, Any]]


Event = (Ready | LoadFailed | LoadProgress | Start | Text | Thinking | CallDelta | Done | Error | Tokens | Detokenized
         | Prompt | Embeddings | CacheHeld | Adapted)
_KINDS: dict[str, type] = {"ready": Ready, "load_failed": LoadFailed, "progress": LoadProgress, "start": Start,
                           "text": Text, "thinking": Thinking, "call": CallDelta, "done": Done, "error": Error,
                           "tokens": Tokens, "detokenized": Detokenized, "prompt": Prompt, "embeddings": Embeddings,
                           "cache_held": CacheHeld, "adapted": Adapted}
_NAMES = {cls: (name, tuple(f.name for f in fields(cls))) for name, cls in _KINDS.items()}
TERMINAL = (Done, Error, Tokens, Detokenized, Prompt, Embeddings, Adapted)  # the last event of a request
TEvent = TypeVar("TEvent", Ready, LoadFailed, LoadProgress, Start, Text, Thinking, CallDelta, Done, Error, Tokens,
                 Detokenized, Prompt, Embeddings, Adapted)


def encode_event(event: Event) -> bytes:
    """An event's frame: JSON ``{"ev": KIND, FIELD: VALUE, ...}``; embeddings' vectors as
    little-endian float32 in base64 (``packed``: the model's own precision, and a tenth of the
    time of writing and reading each number as JSON)."""
    if type(event) is Embeddings:
        return frame({"ev": "embeddings", "id": event.id, "prompt_tokens": event.prompt_tokens,
                      "packed": [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in event.data]})
    name, names = _NAMES[type(event)]
    msg = {"ev": name}
    for f in names:
        msg[f] = getattr(event, f)
    return frame(msg)


def text_frame(rid: int, text: str, tokens: int) -> bytes:
    """``encode_event(Text(rid, text, tokens))``, without JSON."""
    data = text.encode()
    return _TEXT.pack(len(data) + _TEXT_BODY.size, 0, rid, tokens) + data


def decode_event(data: bytes | bytearray) -> Event:
    """One worker event from a frame's body (either kind of frame)."""
    if data[0] == 0:
        rid, tokens = _TEXT_BODY.unpack_from(data)
        return Text(rid, data[_TEXT_BODY.size:].decode(), tokens)
    msg = unjson(data.decode())
    if "packed" in msg:  # embeddings (``encode_event``)
        msg["data"] = [list(_floats(base64.b64decode(v))) for v in msg.pop("packed")]
    return _KINDS[msg.pop("ev")](**msg)


def _floats(raw: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(raw) // 4}f", raw)
