"""What the registry and the handlers know of a loaded model: the ``Backend`` protocol.

A backend serves some kinds of request (``serves``), runs on a device (``device``: cpu,
cuda, metal, ...), and answers with typed events (``protocol/``). The local llama.cpp
worker (``backends.workerclient.WorkerProcess``, started by ``start_local``) is the first
implementation; one that forwards to another machine's server implements the same calls and
its own ``BackendFactory``, and no handler changes.

A backend that keeps a prompt cache in this machine's memory (the local worker) is also a
``CacheHolder``: its size (``cache_bytes``), which the placement counts in the model's RAM, and
``trim_cache``, which the placement calls before it unloads a model for memory. Other backends
(an upstream, a set of replicas) are not: nothing of theirs is reclaimable here.

``LocalWorkers`` is the factory a serving registry uses (``start_local``, from a spare process
where configured); ``load_params`` makes a local spec's ``LoadParams`` (its llama.cpp settings
copied by their fields).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..hardware import sysmem
from ..models import discovery
from ..models.config import ModelSpec, ServerConfig, default_kv_cache_dir
from ..models.ggufmeta import ModelFileError
from ..protocol import (  # noqa: F401 (the kinds: re-exported)
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    RERANK,
    TOKENIZE,
    Detokenized,
    Embeddings,
    Event,
    GenerationRequest,
    LoadParams,
    Prompt,
    Tokens,
)
from ..protocol.settings import settings_of
from .workerclient import LoadFailed, Spare, WorkerProcess

log = logging.getLogger(__name__)


class StartFailed(Exception):
    """A backend could not start (a bad file, a worker that died loading, a server not there)."""


class GenerationEvents(Protocol):
    """One generation's events (``Start``, ``Text``..., then ``Done``; or ``Error``), in order.
    Leaving the ``async with`` before the last one cancels the generation."""

    # awaited before waiting for an event that has not arrived yet: a streamed answer writes
    # what it holds then
    on_idle: Callable[[], Awaitable[None]] | None

    async def next(self) -> Event: ...

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def __aenter__(self) -> GenerationEvents: ...

    async def __aexit__(self, *exc: Any) -> None: ...

    def close(self) -> None: ...  # leave early: the rest of the answer is not wanted

    def unread(self) -> Sequence[Event]: ...  # the events that came and were not handed out yet


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

    @property
    def pid(self) -> int | None: ...  # the process on this machine that runs it, if any

    def set_threads(self, n: int) -> None: ...  # a backend on this machine's CPUs decodes with n threads

    def abort_all(self, message: str) -> None: ...  # end every request in flight with an error

    def generate(self, request: GenerationRequest) -> GenerationEvents: ...

    async def tokenize(self, request: dict[str, Any], with_pieces: bool = False) -> Tokens: ...

    async def detokenize(self, tokens: list[int]) -> Detokenized: ...

    async def apply_template(self, request: dict[str, Any]) -> Prompt: ...

    async def embed(self, inputs: list[Any]) -> Embeddings: ...

    async def rerank(self, query: str, documents: list[str]) -> Embeddings: ...

    async def stop(self, timeout: float = 5.0) -> None: ...


@runtime_checkable
class CacheHolder(Protocol):
    """A backend whose prompt cache holds this machine's memory beyond what it allocated at load
    (``backends.workerclient.WorkerProcess``)."""

    @property
    def cache_bytes(self) -> int: ...  # what the cache holds, as last reported

    async def trim_cache(self, max_bytes: int) -> int: ...  # drop the least recently used down to this; held then


class BackendFactory(Protocol):
    """Starts the backend for a model; raises ``StartFailed``. ``on_exit(backend, expected)``:
    the backend went away (expected: asked to stop); ``on_busy()``: it went from idle to busy
    or back; ``on_progress(fraction)``: how far its load has gone, 0 to 1 (a backend with
    nothing to load never calls it)."""

    async def __call__(self, spec: ModelSpec, server: ServerConfig, *, on_exit: Callable[[Backend, bool], None],
                       on_busy: Callable[[], None], on_progress: Callable[[float], None]) -> Backend: ...


def kv_cache(spec: ModelSpec, server: ServerConfig) -> dict[str, Any]:
    """Where a local model's slots are saved at unload and restored at load (a generating model
    only: an embedding context keeps nothing worth restoring)."""
    if not server.kv_cache_max_bytes or spec.embeddings or spec.reranker:
        return {}
    root = server.kv_cache_dir or default_kv_cache_dir()
    return {"kv_cache_dir": str(root), "kv_cache_max_bytes": server.kv_cache_max_bytes}


def default_prompt_cache(setting: int, available: int | None) -> int:
    """A model's prompt cache where its entry sets none: ``server.prompt_cache_bytes``, at most a
    quarter of the memory available at its load. The placement counts a cache in its model's RAM
    and trims it before it unloads a model, but a trimmed cache fills again up to its bound
    between two loads, so this bound keeps several models' caches from taking the memory the
    models need; a size set in a model's entry is taken as it is."""
    return setting if available is None else min(setting, available // 4)


def load_params(spec: ModelSpec, server: ServerConfig) -> LoadParams:
    """What a local model's worker loads: the spec's file and every llama.cpp setting it holds
    (``LlamaSettings``'s fields, whatever they are), and what the gateway adds. ``spec`` is local
    (``path`` set)."""
    settings = settings_of(spec)
    if settings["prompt_cache_bytes"] is None:
        mem = sysmem.read()
        settings["prompt_cache_bytes"] = default_prompt_cache(server.prompt_cache_bytes, mem.available if mem else None)
    return LoadParams(name=spec.name, path=str(spec.path), **settings,
                      embeddings=spec.embeddings or spec.reranker, stream_interval=server.stream_interval_ms / 1000,
                      mmproj_optional=spec.source != "models.yaml", **kv_cache(spec, server),
                      loras=tuple((a.name, str(a.path), a.scale, a.default) for a in spec.loras))


class LocalWorkers:
    """The ``BackendFactory`` of a serving gateway: ``start_local``, each worker started from a
    spare process made ready after the last load (``backends.spawning.Spare``), so that a model
    switch does not wait for an interpreter and llama.cpp's import. ``close`` ends the spare."""

    def __init__(self, spare: bool = True):
        self.spare = Spare() if spare else None

    async def __call__(self, spec: ModelSpec, server: ServerConfig, *, on_exit: Callable[[Backend, bool], None],
                       on_busy: Callable[[], None], on_progress: Callable[[float], None]) -> Backend:
        return await start_local(spec, server, on_exit=on_exit, on_busy=on_busy, on_progress=on_progress,
                                 spare=self.spare)

    async def close(self) -> None:
        if self.spare is not None:
            await self.spare.close()


async def start_local(spec: ModelSpec, server: ServerConfig, *, on_exit: Callable[[Backend, bool], None],
                      on_busy: Callable[[], None], on_progress: Callable[[float], None],
                      spare: Spare | None = None) -> Backend:
    """A llama.cpp worker process on this machine (``spare``'s, where it has one ready); raises
    ``StartFailed``."""
    if spec.path is None:
        raise StartFailed(f"model {spec.name!r} has no file to run here")
    try:
        await asyncio.to_thread(discovery.INFO_CACHE.get, spec.path)  # a bad file fails here, before a spawn
        worker = WorkerProcess(load_params(spec, server), on_exit=on_exit, on_busy=lambda _worker: on_busy(),
                               on_progress=on_progress)
        await worker.start(spare)
    except (ModelFileError, LoadFailed) as e:
        raise StartFailed(str(e)) from None
    if spec.cache_reuse and not worker.info.get("cache_reuse"):
        log.warning("cache_reuse is off for %r: llama.cpp cannot shift its cache (a recurrent or hybrid model, "
                    "or a sliding-window one without swa_full)", spec.name)
    return worker
