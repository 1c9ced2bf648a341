"""The gateway's commands to a model worker (parent -> worker): each is a class below (``Load``,
``Generate``, ``Cancel``, ...), framed by ``encode_command`` (``framing``) and read back by
``decode_command``; on the wire, {"op": KIND, FIELD: VALUE}:
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .framing import frame, unjson
from .request import GenerationRequest, PromptRequest
from .settings import LlamaSettings
from .typedjson import nested as _nested

# --- what commands carry (besides ``request``'s) ----------------------------------------------

@dataclass(frozen=True)
class LoadParams(LlamaSettings):
    """What a worker loads: the model's file and its llama.cpp settings (``LlamaSettings``'s
    fields, keyword-only: ``backend.load_params`` copies them from the model's spec), and what
    the gateway adds."""

    name: str
    path: str
    embeddings: bool = False  # an embedding context (pooled vectors) instead of a generating one
    stream_interval: float = 0.0  # seconds an answer's text may be held to go out with the next tokens'
    # where the slots' caches are saved at exit and restored at load (``worker.savedslots``); None: neither
    kv_cache_dir: str | None = None
    kv_cache_max_bytes: int = 0  # the whole directory's bound, least recently used removed first
    # a projector discovery paired by folder: one llama.cpp refuses (made for another model there)
    # is left out with a warning, where one models.yaml names fails the load
    mmproj_optional: bool = False
    # LoRA adapters loaded with the model and applied per request (``adapters``), after ``lora``'s:
    # (name, path, the scale it gets when a request names it, the scale every request gets)
    loras: tuple[tuple[str, str, float, float], ...] = ()


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
    return frame(msg)


def decode_command(data: bytes) -> Command:
    """One command from a frame's body."""
    msg = unjson(data.decode())
    cls = _OPS[msg.pop("op")]
    for name, read in _OP_FIELDS[cls][1]:
        if read is not None:
            msg[name] = read(msg[name])
    return cls(**msg)
