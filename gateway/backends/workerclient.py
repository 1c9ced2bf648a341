"""The parent's side of a model worker: spawn, load, generate, cancel, stop.

Everything here is asyncio: the worker is a child process (a fresh interpreter, as
multiprocessing's spawn method makes) with one pipe each way, read and written through
the event loop, so a load or a generation never blocks it. A worker that dies fails
each of its in-flight requests with an error event; the owner (the registry) then starts
a new one on the next request.

The worker's prompt cache (``promptcache.PromptCache``) holds host memory beyond what llama.cpp
allocated at load: ``WorkerProcess.cache_bytes`` is its size as the worker last told
(``protocol.CacheHeld``, with a request's start or done where it changed), and ``trim_cache`` drops
its least recently used states down to a size, which the placement does before it unloads a
model for memory (``serving/placer.py``); ``CacheHeld`` keeps both.

``spawning.py`` starts the process; the commands and events are ``protocol``'s.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .. import protocol
from ..protocol import Command, Error, Event
from ..protocol.framing import HEADER
from .spawning import LoadFailed, Spare, Spawned, spawn

log = logging.getLogger(__name__)

SAVE_TIMEOUT = 120.0  # seconds a worker saving its KV caches at exit may take before it is killed
# what ``ask`` sends: a command the worker answers with one event (embed included, unlike
# ``prompts.PromptQuestion``, which the worker's prep threads answer without decoding)
WorkerQuestion = protocol.Tokenize | protocol.Detokenize | protocol.ApplyTemplate | protocol.Embed | protocol.Adapt


class RequestFailed(Exception):
    """A question to the worker (``ask``) that it refused or could not answer: ``event`` says why
    (the gateway turns it into an API error: ``answer.api_error``)."""

    def __init__(self, event: Error):
        super().__init__(event.message)
        self.event = event


class WorkerProcess:
    def __init__(self, params: protocol.LoadParams, *, on_exit: Callable[[WorkerProcess, bool], None] | None = None,
                 on_busy: Callable[[WorkerProcess], None] | None = None,
                 on_progress: Callable[[float], None] | None = None):
        self.params = params
        self._on_progress = on_progress  # how far the load has read the weights, 0 to 1
        self.threads: int | None = None  # what the worker was last told to use
        self.info: dict[str, Any] = {}
        self.cache = CacheHeld()
        self.proc: asyncio.subprocess.Process | None = None
        self._on_exit = on_exit
        self.requests = InFlight(None if on_busy is None else lambda: on_busy(self))
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._reader_task: asyncio.Task | None = None
        self._stopping = self._heard = False  # asked to stop; heard anything (a load's progress, its outcome)
        self.exit_reason: str | None = None

    @property
    def serves(self) -> frozenset[str]:
        """The kinds of request this model answers."""
        kind = {protocol.RERANK} if self.params.reranker else {protocol.EMBEDDINGS} if self.params.embeddings \
            else {protocol.CHAT, protocol.COMPLETIONS}
        return frozenset({*kind, protocol.TOKENIZE})

    @property
    def cache_bytes(self) -> int:
        """What the worker's prompt cache holds in host memory, as it last told."""
        return self.cache.bytes

    @property
    def device(self) -> str:
        return str(self.info.get("device", "cpu"))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and self.exit_reason is None

    @property
    def in_flight(self) -> int:
        return len(self.requests.inboxes)

    async def start(self, spare: Spare | None = None) -> dict[str, Any]:
        """Start the worker (``spare``'s waiting process, where there is one) and load the
        model; raises ``LoadFailed``."""
        try:
            await self._launch(await (spare.take() if spare is not None else spawn()))
        except LoadFailed:
            if spare is None or self._heard:
                raise
            # a spare that died before it read the load (killed; not yet reaped when taken): afresh
            self._stopping, self.exit_reason = False, None
            await self._launch(await spawn())
        if spare is not None:
            spare.refill()  # after the load, not beside it: on a small machine the two would share its cores
        log.info("model %r loaded (pid %s, n_ctx %s, device %s%s)", self.params.name, self.pid,
                 self.info.get("n_ctx"), self.device, _restored(self.info))
        return self.info

    async def _launch(self, spawned: Spawned) -> None:
        """Connect to a started worker process and load the model in it; raises ``LoadFailed``."""
        loop = asyncio.get_running_loop()
        self.proc = spawned.proc
        self._heard = False
        closed = loop.create_future()
        await loop.connect_read_pipe(lambda: _Frames(self._dispatch, closed),
                                     os.fdopen(spawned.ev_r, "rb", 0))
        self._transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(spawned.cmd_w, "wb", 0))
        self._ready = loop.create_future()
        self._reader_task = asyncio.create_task(self._wait_exit(closed), name=f"worker-{self.params.name}")
        self._send(protocol.Load(self.params))
        try:
            self.info = await self._ready
        except BaseException:
            await self.stop()
            raise

    def _send(self, command: Command) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(protocol.encode_command(command))

    def _dispatch(self, event: Event) -> None:
        self._heard = True
        if isinstance(event, protocol.Ready):
            if self._ready and not self._ready.done():
                self._ready.set_result(event.info)
        elif isinstance(event, protocol.LoadProgress):
            if self._on_progress is not None:
                self._on_progress(event.fraction)
        elif isinstance(event, protocol.LoadFailed):
            if self._ready and not self._ready.done():
                self._ready.set_exception(LoadFailed(event.error))
        elif isinstance(event, protocol.CacheHeld):
            self.cache.told(event)
        else:
            self.requests.put(event)

    async def _wait_exit(self, closed: asyncio.Future) -> None:
        await closed  # the worker's end of the event pipe closed: it exited or is exiting
        assert self.proc is not None
        rc = await self.proc.wait()
        self._gone(rc)

    def _gone(self, rc: int) -> None:
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        self.exit_reason = how
        expected = self._stopping
        if self._ready and not self._ready.done():
            self._ready.set_exception(LoadFailed(f"the model worker exited during load ({how})"))
        elif not expected:
            log.error("model %r worker (pid %s) exited unexpectedly: %s", self.params.name, self.pid, how)
        for rid, q in self.requests.inboxes.items():
            q.put_nowait(Error(rid, 500, f"the worker for model {self.params.name!r} exited unexpectedly ({how}"
                                         f"{'; an rpc-server it uses may have gone' if self.params.rpc else ''}); "
                                         "the model reloads on the next request", None, "worker_crashed"))
        self.cache.gone()
        if self._transport is not None:
            self._transport.close()
        if self._on_exit is not None:
            self._on_exit(self, expected)

    def abort_all(self, message: str) -> None:
        """Fail every request of this worker at once with ``message`` (503), cancelling its work."""
        for rid, q in list(self.requests.inboxes.items()):
            q.put_nowait(Error(rid, 503, message, None, "shutting_down"))
            self._send(protocol.Cancel(rid))

    @property
    def busy(self) -> bool:
        return bool(self.requests.inboxes)

    def set_threads(self, n: int) -> None:
        if n != self.threads and self.alive:
            self.threads = n
            self._send(protocol.Threads(n))

    def generate(self, request: protocol.GenerationRequest) -> Generation:
        rid, q = self.requests.open()
        if not self.alive:
            q.put_nowait(self._unavailable(rid))
        else:
            self._send(protocol.Generate(rid, request))
        return Generation(self, rid, q)

    def _unavailable(self, rid: int) -> Error:
        return Error(rid, 503, f"model {self.params.name!r} is not running; retry", None, "model_unavailable")

    async def ask(self, question: Callable[[int], WorkerQuestion]) -> Event:
        """One question (made with its request id) with one answer; an error event raises
        ``RequestFailed``."""
        rid, q = self.requests.open()
        try:
            if not self.alive:
                raise RequestFailed(self._unavailable(rid))
            self._send(question(rid))
            try:
                answer = await q.get()
            except asyncio.CancelledError:  # the caller left: a question not begun is skipped
                self._send(protocol.Cancel(rid))
                raise
        finally:
            self.requests.close(rid)
        if isinstance(answer, Error):
            raise RequestFailed(answer)
        return answer

    async def tokenize(self, request: dict[str, Any], with_pieces: bool = False) -> protocol.Tokens:
        """A prompt (``{"prompt"|"messages", "add_special"?, "param"?}``) as the model's tokens."""
        prompt = protocol.PromptRequest.of(request)
        return _expect(await self.ask(lambda rid: protocol.Tokenize(rid, prompt, with_pieces)), protocol.Tokens)

    async def detokenize(self, tokens: list[int]) -> protocol.Detokenized:
        return _expect(await self.ask(lambda rid: protocol.Detokenize(rid, tokens)), protocol.Detokenized)

    async def apply_template(self, request: dict[str, Any]) -> protocol.Prompt:
        """A chat request's messages through the model's template, as the prompt's text."""
        prompt = protocol.PromptRequest.of(request)
        return _expect(await self.ask(lambda rid: protocol.ApplyTemplate(rid, prompt)), protocol.Prompt)

    async def embed(self, inputs: list[Any]) -> protocol.Embeddings:
        return _expect(await self.ask(lambda rid: protocol.Embed(rid, inputs)), protocol.Embeddings)

    async def rerank(self, query: str, documents: list[str]) -> protocol.Embeddings:
        """Each document's relevance to ``query``, as one-number vectors in document order."""
        return _expect(await self.ask(lambda rid: protocol.Embed(rid, documents, query)), protocol.Embeddings)

    async def adapt(self, action: str, **fields: Any) -> list[dict[str, Any]]:
        """Read or change the worker's LoRA adapters (``protocol.Adapt``): the table as it now is; a
        refusal raises ``RequestFailed``."""
        return _expect(await self.ask(lambda rid: protocol.Adapt(rid, action, **fields)), protocol.Adapted).adapters

    async def trim_cache(self, max_bytes: int) -> int:
        """Have the worker drop its prompt cache's least recently used states down to ``max_bytes``
        (its bound stays); the bytes it holds then (0: not running). Not a request: not busy."""
        if not self.alive:
            return 0
        rid = self.requests.new_id()
        answer = self.cache.waiting(rid)
        try:
            self._send(protocol.TrimCache(rid, max_bytes))
            return await answer
        finally:
            self.cache.done(rid)

    def _release(self, rid: int, finished: bool) -> None:
        self.requests.close(rid)
        if not finished and self.alive:
            self._send(protocol.Cancel(rid))

    async def stop(self, timeout: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``timeout``."""
        self._stopping = True
        if self.proc is None or self.proc.returncode is not None:
            return
        self._send(protocol.Exit())
        if self.params.kv_cache_dir:
            timeout = max(timeout, SAVE_TIMEOUT)  # it writes its slots' caches first
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            self.kill()
            await self.proc.wait()
        except asyncio.CancelledError:  # whoever waited went away: the worker must not outlive the stop
            self.kill()
            raise
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)


class InFlight:
    """A worker's requests in flight, by id: each one's inbox, from ``open`` until ``close``.
    ``on_busy`` is called when the worker goes from idle to busy or back."""

    def __init__(self, on_busy: Callable[[], None] | None):
        self._ids = itertools.count(1)
        self.inboxes: dict[int, _Inbox] = {}
        self._on_busy = on_busy

    def new_id(self) -> int:
        return next(self._ids)

    def open(self) -> tuple[int, _Inbox]:
        rid, inbox = next(self._ids), _Inbox()
        self.inboxes[rid] = inbox
        if len(self.inboxes) == 1 and self._on_busy is not None:
            self._on_busy()
        return rid, inbox

    def close(self, rid: int) -> None:
        if self.inboxes.pop(rid, None) is not None and not self.inboxes and self._on_busy is not None:
            self._on_busy()

    def put(self, event: Event) -> None:
        if (inbox := self.inboxes.get(event.id)) is not None:  # type: ignore[union-attr]
            inbox.put_nowait(event)  # (the events of a request already released are dropped)


class CacheHeld:
    """A worker's prompt cache in host memory, as the gateway knows it: its size as the worker
    last told (``bytes``; 0 once the worker is gone), and the trims waiting for their answer."""

    def __init__(self) -> None:
        self.bytes = 0
        self._trims: dict[int, asyncio.Future[int]] = {}  # by the TrimCache's id

    def waiting(self, rid: int) -> asyncio.Future[int]:
        """The answer to TrimCache ``rid``, once it comes: the bytes held then."""
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._trims[rid] = answer
        return answer

    def done(self, rid: int) -> None:
        self._trims.pop(rid, None)

    def told(self, event: protocol.CacheHeld) -> None:
        self.bytes = event.bytes
        if (trim := self._trims.pop(event.id, None)) is not None and not trim.done():
            trim.set_result(event.bytes)

    def gone(self) -> None:
        """The worker exited: it holds nothing, and every trim waiting has its answer."""
        self.bytes = 0
        for trim in self._trims.values():
            if not trim.done():
                trim.set_result(0)
        self._trims.clear()


def _restored(info: dict[str, Any]) -> str:
    if not info.get("restored_slots"):
        return ""
    return f"; restored {info['restored_tokens']} cached tokens in {info['restored_slots']} slot(s)"


def _expect(event: Event, kind: type[protocol.TEvent]) -> protocol.TEvent:
    if not isinstance(event, kind):
        raise TypeError(f"the worker answered {type(event).__name__} where {kind.__name__} was due")
    return event


class _Inbox:
    """One request's events from the worker: asyncio.Queue's put_nowait/get, without its
    generality (no size bound, one reader), which costs on every token."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Event] = collections.deque()
        self._waiter: asyncio.Future | None = None

    def __len__(self) -> int:
        return len(self._items)

    def unread(self) -> collections.deque[Event]:
        return self._items

    def put_nowait(self, msg: Event) -> None:
        self._items.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Event:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class _Frames(asyncio.Protocol):
    """The event pipe: frames are parsed as bytes arrive and handed on at once (no reader task
    between the pipe and the requests: one event-loop pass per read, not two). How often it is
    read is the worker's doing: it writes a fast model's tokens in twos or threes
    (``stream_interval``)."""

    def __init__(self, dispatch: Callable[[Event], None], closed: asyncio.Future):
        self._dispatch, self._closed = dispatch, closed
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        at = 0
        while len(buf) - at >= 4:
            (n,) = HEADER.unpack_from(buf, at)
            if len(buf) - at - 4 < n:
                break
            self._dispatch(protocol.decode_event(buf[at + 4:at + 4 + n]))
            at += 4 + n
        del buf[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)


_Self = TypeVar("_Self", bound="Events")


class Events:
    """What every backend's generation shares (``backend.GenerationEvents``): its events one by
    one (``next``) or iterated up to the last one (``finished``), and ``close`` when the
    ``async with`` is left, early or not."""

    finished: bool

    async def next(self) -> Event:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def unread(self) -> Sequence[Event]:
        """The events that came and were not handed out yet, in order: what a generation left
        before its end had still generated (``api.pipeline`` counts it)."""
        return ()

    def __aiter__(self: _Self) -> _Self:
        return self

    async def __anext__(self) -> Event:
        if self.finished:
            raise StopAsyncIteration
        return await self.next()

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class Generation(Events):
    """One request's events. Leaving the ``async with`` early cancels it in the worker."""

    def __init__(self, worker: WorkerProcess, rid: int, queue: _Inbox):
        self.worker, self.id, self._q = worker, rid, queue
        self.finished = False
        # awaited before waiting for an event that has not arrived yet: a streamed answer writes
        # what it holds (the pieces of events that came together go out in one write)
        self.on_idle: Callable[[], Awaitable[None]] | None = None

    async def next(self) -> Event:
        if self.on_idle is not None and not self._q:
            await self.on_idle()
        event = await self._q.get()
        if isinstance(event, protocol.TERMINAL):
            self.finished = True
        return event

    def unread(self) -> Sequence[Event]:
        return self._q.unread()

    def close(self) -> None:
        self.worker._release(self.id, self.finished)

