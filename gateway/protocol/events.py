"""Messages between the gateway (parent) and a model worker (child).

Transport: two pipes, one each way, on file descriptors handed to the child (never its
stdout, which llama.cpp or a library could write to). Each message is a frame: a 4-byte
big-endian length, then that many bytes of UTF-8 JSON. The one message sent for nearly every
token, a text event without log-probabilities, has a frame of its own that needs no JSON: its
body is a zero byte, the request id (8 bytes) and the token count (4 bytes), big-endian, then
the text in UTF-8 (``text_frame``; ``decode`` reads either kind).

Parent -> worker: each command is a class below (``Load``, ``Generate``, ``Cancel``, ...), framed
by ``encode_command`` and read back by ``decode_command``; on the wire, {"op": KIND, FIELD: VALUE}:
  {"op": "load", "model": {...LoadParams...}}            first message, exactly once
  {"op": "generate", "id": N, "request": {...GenerationRequest...}}
  {"op": "cancel", "id": N}                              for a queued or running request
  {"op": "tokenize", "id": N, "request": {...PromptRequest...}, "with_pieces": bool}
  {"op": "detokenize", "id": N, "tokens": [...]}         both answered at once, even mid-generation
  {"op": "apply_template", "id": N, "request": {...PromptRequest...}}  likewise
  {"op": "threads", "n": K}                              decode with K threads from now on (the
                                                         gateway shares the CPUs among busy workers)
  {"op": "embed", "id": N, "inputs": [text or [ids], ...]}  queued like generate (embedding models)
  {"op": "trim_cache", "id": N, "max_bytes": B}         prompt cache down to B bytes (answer: cache_held)
  {"op": "adapt", "id": N, "action": "list"|"load"|"unload"|"scales", ...}  the LoRA adapters:
                                                         one loaded or dropped by name, or every default
                                                         scale set (answer: adapted, or error)
  {"op": "exit"}                                         (EOF on the pipe means the same)

Worker -> parent: each event is a class below (``Ready``, ``Start``, ``Text``, ``Done``, ``Error``,
...), framed by ``encode_event`` and read back by ``decode_event``; on the wire:
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
import json
import struct
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import PurePath
from typing import Any, TypeVar

from .settings import LlamaSettings
from .typedjson import nested as _nested


def _plain(o: Any) -> Any:
    """JSON's form of what JSON has no type for: a path (as text), a dataclass (the object of its
    fields, as ``asdict`` writes it, without the deep copy ``asdict`` makes first: a request's
    command is encoded at once, and the copy cost more than the encoding)."""
    if isinstance(o, PurePath):
        return str(o)
    names = _FIELD_NAMES.get(type(o))
    if names is None and is_dataclass(o) and not isinstance(o, type):
        names = _FIELD_NAMES[type(o)] = tuple(f.name for f in fields(o))
    if names is not None:
        return {name: getattr(o, name) for name in names}
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


_HEADER = struct.Struct(">I")
_TEXT = struct.Struct(">IBQI")  # frame length, 0 (where JSON has "{"), request id, tokens so far
_TEXT_BODY = struct.Struct(">xQI")
_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_plain).encode  # made once: used per token
_unjson = json.JSONDecoder().decode


# The kinds of request a model may serve (``WorkerProcess.serves``, ``backend.Backend``).
CHAT, COMPLETIONS, EMBEDDINGS, TOKENIZE, RERANK = "chat", "completions", "embeddings", "tokenize", "rerank"


# --- what commands carry ---------------------------------------------------------------------

@dataclass(frozen=True)
class LoadParams(LlamaSettings):
    """What a worker loads: the model's file and its llama.cpp settings (``LlamaSettings``'s
    fields, keyword-only: ``backend.load_params`` copies them from the model's spec), and what
    the gateway adds."""

    name: str
    path: str
    embeddings: bool = False  # an embedding context (pooled vectors) instead of a generating one
    stream_interval: float = 0.0  # seconds an answer's text may be held to go out with the next tokens'
    # where the slots' caches are saved at exit and restored at load (``kvcache``); None: neither
    kv_cache_dir: str | None = None
    kv_cache_max_bytes: int = 0  # the whole directory's bound, least recently used removed first
    # a projector discovery paired by folder: one llama.cpp refuses (made for another model there)
    # is left out with a warning, where one models.yaml names fails the load
    mmproj_optional: bool = False
    # LoRA adapters loaded with the model and applied per request (``adapters``), after ``lora``'s:
    # (name, path, the scale it gets when a request names it, the scale every request gets)
    loras: tuple[tuple[str, str, float, float], ...] = ()


@dataclass
class Media:
    """A picture or a sound a request carries; the prompt's text holds a marker for each
    (``wire.media.MARKER``), in this order."""

    kind: str  # image | audio
    param: str  # the caller's field it came in (messages[1].content[0]), as a refusal names it
    data: str = ""  # the file's bytes, base64 (PNG, JPEG, GIF, BMP; WAV, MP3, FLAC)
    url: str | None = None  # an http(s) address, fetched by the gateway before the request goes on
    # a tool result's picture: what a model that takes none reads in its place (else such a model refuses it)
    note: str | None = None
    # what its header says it decodes to (``wire.mediasize``): a picture's width and height, a sound's
    # frames and their sample rate; (0, 0): not read
    size: tuple[int, int] = (0, 0)


@dataclass
class GenerationRequest:
    """The gateway's own request, whatever wire shape it came in.

    Exactly one of ``messages`` (rendered with the chat template in the worker),
    ``prompt`` (text) or ``prompt_tokens`` (ids) is set.
    """

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None  # None: until end of generation or the context is full
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # the sampling fields the caller or the model's defaults set (the rest are this gateway's
    # defaults, which a request forwarded to another server leaves to that server)
    given: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # llama-server's extension: generate max_tokens whatever the model says
    grammar: str | None = None  # GBNF constraining every sampled token (from the first trigger, if any)
    grammar_triggers: list[str] = field(default_factory=list)  # patterns that switch a lazy grammar on
    response_format: str | None = None  # json_object | json_schema: the worker makes the grammar
    json_schema: dict[str, Any] | None = None  # for json_schema
    format_param: str = "response_format"  # the caller's field it came in (Ollama: format), as refusals name it
    logprobs: int | None = None  # None: none; N: each token's log-probability and its N likeliest alternatives
    tools: list[dict[str, Any]] | None = None  # function tools (wire/tools.py's shape)
    tool_choice: str = "auto"  # auto | required (none: the wire layer leaves tools out)
    tool_names: tuple[str, ...] | None = None  # the tools the model may call, when not all (allowed_tools, a named one)
    parallel_tool_calls: bool = True
    tool_format: str | None = None  # the model's call format (text/toolformats), set once the model is known
    reasoning: str | None = None  # the model's thinking format (reasoning.py), set once the model is known
    thinking_budget: int | None = None  # most tokens of thinking; past it the worker ends the thinking block
    echo: bool = False  # the start event carries the prompt's text
    # fill-in-the-middle (engine/infill.py lays the prompt out from the model's FIM tokens):
    # with ``suffix`` set, ``prompt`` is the text before the cursor and ``suffix`` the text after
    suffix: str | None = None
    infill_extra: list[dict[str, str]] = field(default_factory=list)  # other files: {"filename", "text"}
    infill_prompt: str = ""  # llama-server's /infill ``prompt``: text after the prefix, special tokens read
    suffix_param: str = "suffix"  # the caller's field for the suffix, as a refusal names it
    deadline: float | None = None  # wall-clock time (time.time()) at which the answer ends with "length"
    # whose cached prompts this request may reuse (server.isolate_cache_by_key: the API key's
    # name); a slot holding another scope's cache is read afresh
    cache_scope: str = ""
    media: list[Media] = field(default_factory=list)  # pictures and sounds, in the order of their markers
    # the LoRA adapters it is decoded under (``adapters.Adapters.chosen``): ``adapter``, one the model's
    # name picked (BASE:ADAPTER); ``lora``, llama-server's field as (id, scale) pairs; neither: the defaults
    adapter: str | None = None
    lora: list[tuple[int, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PromptRequest:
    """A prompt read without generating (tokenize, apply_template): exactly one of ``messages``,
    ``prompt`` or ``prompt_tokens``, as in a ``GenerationRequest``."""

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_tokens: list[int] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None  # part of the prompt: the template lists them
    tool_format: str | None = None  # how the tools reach the prompt (``plain``: a system message)
    add_special: bool = True  # the tokenizer adds the model's special tokens (BOS) to a prompt text
    param: str | None = None  # the field a refusal names (None: "messages" or "prompt")
    media: list[Media] = field(default_factory=list)  # counted as the tokens they take, not encoded

    @classmethod
    def of(cls, request: dict[str, Any]) -> PromptRequest:
        """The prompt's fields of ``request`` (a ``GenerationRequest``'s dict, or /tokenize's few)."""
        return cls(**{name: request[name] for name in _PROMPT_FIELDS if name in request})


_PROMPT_FIELDS = tuple(f.name for f in fields(PromptRequest))


# --- parent -> worker: one class per command -------------------------------------------------

@dataclass(slots=True)
class Load:
    model: LoadParams


@dataclass(slots=True)
class Generate:
    id: int
    request: GenerationRequest


@dataclass(slots=True)
class Cancel:
    id: int


@dataclass(slots=True)
class Tokenize:
    id: int
    request: PromptRequest
    with_pieces: bool = False  # each token's text too


@dataclass(slots=True)
class Detokenize:
    id: int
    tokens: list[int]


@dataclass(slots=True)
class ApplyTemplate:
    id: int
    request: PromptRequest


@dataclass(slots=True)
class Threads:
    n: int


@dataclass(slots=True)
class Embed:
    id: int
    inputs: list[Any]  # each a text or a list of token ids
    query: str | None = None  # a reranker's: each input is a document scored against it (one-number vectors)


@dataclass(slots=True)
class TrimCache:  # drop the prompt cache's least recently used states down to max_bytes (its bound stays)
    id: int
    max_bytes: int


@dataclass(slots=True)
class Adapt:
    """The model's LoRA adapters read (``list``) or changed at run time: ``load`` (``name`` from
    ``path``, applied at ``scale`` when named), ``unload`` (``name``), or ``scales`` (every default
    scale: those ``scales`` lists by id, the rest 0, as llama-server's POST /lora-adapters)."""

    id: int
    action: str
    name: str = ""
    path: str = ""
    scale: float = 1.0
    scales: list[tuple[int, float]] | None = None


@dataclass(slots=True)
class Exit:
    pass


Command = Load | Generate | Cancel | Tokenize | Detokenize | ApplyTemplate | Threads | Embed | TrimCache | Adapt | Exit
_OPS: dict[str, type] = {"load": Load, "generate": Generate, "cancel": Cancel, "tokenize": Tokenize,
                         "detokenize": Detokenize, "apply_template": ApplyTemplate, "threads": Threads,
                         "embed": Embed, "trim_cache": TrimCache, "adapt": Adapt, "exit": Exit}


_OP_FIELDS = {cls: (op, _nested(cls)) for op, cls in _OPS.items()}


def encode_command(command: Command) -> bytes:
    """A command's frame: JSON ``{"op": KIND, FIELD: VALUE, ...}``."""
    op, names = _OP_FIELDS[type(command)]
    msg: dict[str, Any] = {"op": op}
    for name, _ in names:
        msg[name] = getattr(command, name)  # a dataclass (a request) as its fields' object: ``_plain``
    return _encode(msg)


def decode_command(data: bytes) -> Command:
    """One command from a frame's body."""
    msg = _unjson(data.decode())
    cls = _OPS[msg.pop("op")]
    for name, read in _OP_FIELDS[cls][1]:
        if read is not None:
            msg[name] = read(msg[name])
    return cls(**msg)


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


def _encode(msg: dict[str, Any]) -> bytes:
    data = _json(msg).encode()
    return _HEADER.pack(len(data)) + data


def encode_event(event: Event) -> bytes:
    """An event's frame: JSON ``{"ev": KIND, FIELD: VALUE, ...}``; embeddings' vectors as
    little-endian float32 in base64 (``packed``: the model's own precision, and a tenth of the
    time of writing and reading each number as JSON)."""
    if type(event) is Embeddings:
        return _encode({"ev": "embeddings", "id": event.id, "prompt_tokens": event.prompt_tokens,
                        "packed": [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in event.data]})
    name, names = _NAMES[type(event)]
    msg = {"ev": name}
    for f in names:
        msg[f] = getattr(event, f)
    return _encode(msg)


def text_frame(rid: int, text: str, tokens: int) -> bytes:
    """``encode_event(Text(rid, text, tokens))``, without JSON."""
    data = text.encode()
    return _TEXT.pack(len(data) + _TEXT_BODY.size, 0, rid, tokens) + data


def decode_event(data: bytes | bytearray) -> Event:
    """One worker event from a frame's body (either kind of frame)."""
    if data[0] == 0:
        rid, tokens = _TEXT_BODY.unpack_from(data)
        return Text(rid, data[_TEXT_BODY.size:].decode(), tokens)
    msg = _unjson(data.decode())
    if "packed" in msg:  # embeddings (``encode_event``)
        msg["data"] = [list(_floats(base64.b64decode(v))) for v in msg.pop("packed")]
    return _KINDS[msg.pop("ev")](**msg)


def _floats(raw: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(raw) // 4}f", raw)
