"""What the registry and the handlers know of a loaded model: the ``Backend`` protocol.

A backend serves some kinds of request (``serves``), runs on a device (``device``: cpu,
cuda, metal, ...), and answers with typed events (``engine/protocol.py``). The local llama.cpp
worker (``engine.client.WorkerProcess``) is the first implementation; one that forwards to
another machine's server implements the same calls, and no handler changes.
"""

from __future__ import annotations

from typing import Any, Protocol

from .engine.client import Generation
from .engine.protocol import (  # noqa: F401 (the kinds: re-exported)
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    TOKENIZE,
    Detokenized,
    Embeddings,
    GenerationRequest,
    Prompt,
    Tokens,
)


class Backend(Protocol):
    info: dict[str, Any]  # what the model reported at load (n_ctx, chat_template, special tokens, ...)

    @property
    def serves(self) -> frozenset[str]: ...

    @property
    def device(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    def generate(self, request: GenerationRequest) -> Generation: ...

    async def tokenize(self, request: dict[str, Any], with_pieces: bool = False) -> Tokens: ...

    async def detokenize(self, tokens: list[int]) -> Detokenized: ...

    async def apply_template(self, request: dict[str, Any]) -> Prompt: ...

    async def embed(self, inputs: list[Any]) -> Embeddings: ...

    async def stop(self, timeout: float = 5.0) -> None: ...
