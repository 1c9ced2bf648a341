"""Models answered by another machine's OpenAI-compatible server: ``RemoteBackend``, the
``Backend`` of a models.yaml entry with ``upstream:``, and the bounded reads it (and the probe
loop, ``upstream_table.py``) makes. Each upstream's health is ``upstream_health.py``'s; the
table of upstreams, their probes and listed models (``upstream_discover``) ``upstream_table.py``'s.

A request's answer is always streamed from the upstream, and goes on to the client as it
arrives (a whole answer is the stream collected, as for a local model); leaving the
generation closes the upstream connection at once, so the upstream stops generating. A
request to an upstream that is down and in its back-off is refused at once (503
``upstream_unavailable``), and what a request sees moves the upstream's health.

An upstream is another party, and nothing it does may cost this gateway more than the request
it answers. Every read from it has a byte bound (``upstream_wire``'s), a time bound and ends
when the client goes (the handler's cancellation, or leaving the generation, closes the
connection): an answer's first event must come within ``first_byte_timeout`` of the request,
each next one within ``idle_timeout`` of being asked for (bytes that carry no event, such as
keep-alive comments, do not count), and the whole answer within the request's deadline
(``server.request_timeout``), where it ends with finish_reason "length" as a local model's
does. An embeddings answer or a model list must come whole within ``first_byte_timeout``.
Answers are asked for uncompressed (a compressed answer's size says nothing of what it
becomes), and redirects are never followed (a 307 would send the caller's prompt to a host
nobody configured): a 3xx is a 502.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

import aiohttp

from .. import protocol
from ..base.errors import ApiError, from_event
from ..base.tracecontext import forward_headers
from ..models.config import ModelSpec, Upstream
from ..protocol import CHAT, COMPLETIONS, EMBEDDINGS, Event, GenerationRequest
from ..text.formats import NATIVE  # this backend's tool_calls info: calls arrive parsed (CallDelta)
from . import upstream_wire as wire
from .untrusted import shown
from .upstream_health import UpstreamHealth
from .workerclient import Events, RequestFailed

log = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = ("upstream_unavailable", "worker_crashed", "model_unavailable")  # a replica may answer instead
FAILING_STATUS = (502, 503, 504)  # an upstream answering these is failing, not refusing


def headers(upstream: Upstream) -> dict[str, str]:
    return {"Authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}


def client_session(upstream: Upstream, timeout: aiohttp.ClientTimeout,
                   connector: aiohttp.BaseConnector | None = None) -> aiohttp.ClientSession:
    """A session to ``upstream``: its key, and answers asked for and read uncompressed. (Each
    request also says ``allow_redirects=False``: aiohttp sets that per request.)"""
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 headers={**headers(upstream), "Accept-Encoding": "identity"})


async def read_body(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """``resp``'s whole body; past ``limit`` bytes (by its Content-Length or by what came),
    ``MalformedStream`` and the connection closed."""
    if (resp.content_length or 0) > limit:
        resp.close()
        raise wire.too_large(what, limit)
    parts: list[bytes] = []
    size = 0
    while chunk := await resp.content.readany():
        size += len(chunk)
        if size > limit:
            resp.close()
            parts.clear()  # not kept alive by the error's traceback
            raise wire.too_large(what, limit)
        parts.append(chunk)
    return b"".join(parts)


async def within(step: Awaitable[T], seconds: float | None, discard: Callable[[T], object] | None = None) -> T:
    """``step``, or ``asyncio.TimeoutError`` after ``seconds`` (None: no limit). Unlike ``asyncio.wait_for``
    before Python 3.12, a cancellation that comes as ``step`` finishes is not lost: under a flood
    every read finishes at once, and the client's going would never stop the reading. What a
    step made that is not taken (it finished as the time ran out, or as the caller was
    cancelled) goes to ``discard`` (a response to close)."""
    task = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait((task,), timeout=None if seconds is None else max(0.0, seconds))
    except BaseException:
        _abandon(task, discard)
        raise
    if not done:
        _abandon(task, discard)
        raise asyncio.TimeoutError
    try:
        return task.result()
    finally:  # the task holds its error, whose traceback holds this frame: no cycle left for the GC to find
        del task, done


def _abandon(task: asyncio.Future[T], discard: Callable[[T], object] | None) -> None:
    """Cancel ``task``; what it made all the same goes to ``discard``."""
    task.cancel()
    if discard is not None:
        task.add_done_callback(lambda t: None if t.cancelled() or t.exception() else discard(t.result()))


def _close(resp: aiohttp.ClientResponse) -> None:
    resp.close()


def compressed(resp: aiohttp.ClientResponse) -> str | None:
    """The Content-Encoding of an answer that came compressed although it was asked not to be."""
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    return None if encoding in ("", "identity") else encoding


class RemoteBackend:
    """A model answered by an upstream server (``backend.Backend``)."""

    def __init__(self, spec: ModelSpec, health: UpstreamHealth):
        assert spec.upstream is not None
        self.spec, self.upstream, self.health = spec, spec.upstream, health
        self.model = spec.upstream.model or spec.name
        # no chat template here: calls come parsed, raw thinking markers in the text are split
        # by the model's ``reasoning`` setting
        # fill-in-the-middle goes on to the upstream (its /infill, else /completions with a
        # suffix: RemoteGeneration._infill), which refuses it for a model that cannot
        self.info: dict[str, Any] = {"tool_calls": NATIVE, "n_ctx": None, "upstream": True,
                                     "fim": wire.FIM_FORWARDED}
        up = spec.upstream
        # reads are timed by the request (first_byte_timeout, idle_timeout, its deadline), not per socket read
        self.session = client_session(up, aiohttp.ClientTimeout(total=None, connect=up.connect_timeout),
                                      aiohttp.TCPConnector(limit=up.max_connections, enable_cleanup_closed=True))
        self._ids = itertools.count(1)
        self._live: dict[int, RemoteGeneration] = {}
        self._closed = False

    serves = frozenset({CHAT, COMPLETIONS, EMBEDDINGS})
    device = "remote"
    pid = None

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def busy(self) -> bool:
        return bool(self._live)

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def set_threads(self, n: int) -> None:
        pass  # the upstream's CPUs are its own

    def abort_all(self, message: str) -> None:
        for gen in list(self._live.values()):
            gen.abort(protocol.Error(gen.id, 503, message, None, "shutting_down"))

    def generate(self, request: GenerationRequest) -> RemoteGeneration:
        rid = next(self._ids)
        gen = self._live[rid] = RemoteGeneration(self, rid, request)
        return gen

    def _release(self, rid: int) -> None:
        self._live.pop(rid, None)

    async def post(self, path: str, body: dict[str, Any], url: str | None = None) -> aiohttp.ClientResponse:
        """Send a request (to ``path`` under the upstream's base URL, or to ``url`` on the same
        server) and wait for its answer's headers (``first_byte`` timeout). Health follows what
        happened; a failure raises ``RequestFailed`` with the error to answer."""
        if self.health.wait:
            raise RequestFailed(self.health.unavailable())
        up = self.upstream
        try:
            resp = await within(self.session.post(url or up.url + path, json=body, allow_redirects=False,
                                                 headers=forward_headers() or None),
                                up.first_byte_timeout, _close)
        except asyncio.TimeoutError:
            raise RequestFailed(self._failing(f"no answer within {up.first_byte_timeout:g} s")) from None
        except (aiohttp.ClientError, OSError) as e:
            raise RequestFailed(self._failing(reason(e))) from None
        if resp.status == 200:
            if (encoding := compressed(resp)) is not None:
                resp.close()
                raise RequestFailed(self._refused(502, f"the upstream server for {self.spec.name!r} sent its "
                                                       f"answer compressed ({shown(encoding, 40)}) although it was "
                                                       "asked not to", "upstream_malformed"))
            self.health.succeeded()
            return resp
        try:
            body_bytes = await within(resp.content.read(wire.MAX_ERROR_BYTES), up.idle_timeout)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
            body_bytes = b""
        finally:
            resp.close()
        if resp.status in FAILING_STATUS:
            raise RequestFailed(self._failing(f"HTTP {resp.status}: {body_bytes[:200].decode(errors='replace')}"))
        if 300 <= resp.status < 400:  # following it would send the caller's request to another host
            log.warning("the upstream server for %r answered %s with a redirect (HTTP %d to %s); redirects are not "
                        "followed", self.spec.name, path, resp.status, shown(resp.headers.get("Location", "-"), 200))
            raise RequestFailed(self._refused(502, f"the upstream server for {self.spec.name!r} answered with a "
                                                   f"redirect (HTTP {resp.status}), which this gateway does not follow",
                                              "upstream_error"))
        if resp.status < 400:
            raise RequestFailed(self._refused(502, f"the upstream server for {self.spec.name!r} answered HTTP "
                                                   f"{resp.status} where 200 was due", "upstream_error"))
        error = wire.error_from(resp.status, body_bytes)
        if resp.status >= 500:
            error = ApiError(f"the upstream server failed: {error.message}", status=502, code="upstream_error")
        raise RequestFailed(self._refused(error.status, error.message, error.code, error.param,
                                          wire.retry_after(resp.headers.get("Retry-After"))))

    def _refused(self, status: int, message: str, code: str | None, param: str | None = None,
                 retry_after: float | None = None) -> protocol.Error:
        """An answer that is the request's failure, not the upstream's: it is up."""
        self.health.succeeded()
        return protocol.Error(0, status, message, param, code, retry_after)

    def _failing(self, why: str) -> protocol.Error:
        self.health.failed(why)
        return self.health.unavailable()  # its error: ``why`` as it is shown

    async def embed(self, inputs: list[Any]) -> protocol.Embeddings:
        """The upstream's vectors: its answer must come whole within ``first_byte_timeout`` and
        hold at most ``wire.embeddings_bound`` bytes."""
        seconds = self.upstream.first_byte_timeout
        try:
            body = await within(self._embeddings(inputs), seconds)
        except RequestFailed as e:
            raise from_event(e.event) from None
        except asyncio.TimeoutError:
            raise from_event(self._failing(f"no whole embeddings answer within {seconds:g} s")) from None
        except (aiohttp.ClientError, OSError) as e:
            raise ApiError(f"the upstream server for {self.spec.name!r} broke its embeddings answer ({reason(e)})",
                           status=502, code="upstream_malformed") from None
        vectors, prompt_tokens = wire.embeddings_answer(body, len(inputs))
        return protocol.Embeddings(0, vectors, prompt_tokens)

    async def _embeddings(self, inputs: list[Any]) -> bytes:
        resp = await self.post("/embeddings", {"model": self.model, "input": inputs})
        async with resp:
            return await read_body(resp, wire.embeddings_bound(len(inputs)), "an embeddings answer")

    async def _unsupported(self, what: str) -> Any:
        raise ApiError(f"model {self.spec.name!r} is answered by an upstream server; {what} is not available for it",
                       status=501, param="model", code="unsupported_model")

    async def tokenize(self, request: dict[str, Any], with_pieces: bool = False) -> protocol.Tokens:
        return await self._unsupported("counting or listing its tokens")

    async def rerank(self, query: str, documents: list[str]) -> protocol.Embeddings:
        return await self._unsupported("reranking")

    async def detokenize(self, tokens: list[int]) -> protocol.Detokenized:
        return await self._unsupported("detokenizing")

    async def apply_template(self, request: dict[str, Any]) -> protocol.Prompt:
        return await self._unsupported("its chat template")

    async def stop(self, timeout: float = 5.0) -> None:
        self._closed = True
        self.abort_all(f"model {self.spec.name!r} was unloaded")
        await self.session.close()


def reason(e: BaseException) -> str:
    """An exception as a message (its text may quote the upstream: shown escaped)."""
    return shown(f"{type(e).__name__}: {e}", 300) if str(e) else type(e).__name__


class _Late(Exception):
    """A read's time ran out: the request's own (``server.request_timeout``), or the upstream's."""

    def __init__(self, request_deadline: bool):
        self.request_deadline = request_deadline


class RemoteGeneration(Events):
    """One answer from the upstream, as backend events (``backend.GenerationEvents``): ``Start``
    once the upstream has sent its first event, then what its chunks hold, then ``Done``; or an
    ``Error``. A failure after the start (the stream broke, went silent past ``idle``, or was
    malformed) is an ``Error`` event too: the handler ends the answer in-band. An answer past
    its bounds (``wire.answer_bounds``: ``max_tokens``, bytes) or its request's deadline ends
    with ``Done`` "length", and the upstream's connection is closed."""

    def __init__(self, backend: RemoteBackend, rid: int, request: GenerationRequest):
        self.backend, self.id, self.request = backend, rid, request
        self.on_idle: Callable[[], Awaitable[None]] | None = None
        self._events: collections.deque[Event] = collections.deque()
        self._resp: aiohttp.ClientResponse | None = None
        self._reader: wire.ChunkReader | wire.InfillReader = wire.ChunkReader(
            rid, chat=request.messages is not None, bounds=wire.answer_bounds(request))
        self._sse = wire.SSEDecoder()
        self._began = False  # the request was sent
        self._answering = False  # its first event came: Start is out
        self._due = 0.0  # loop time by which the next event must come
        self._read_bytes = 0
        self.finished = False

    async def next(self) -> Event:
        if not self._events and not self.finished:
            if self._began and self.on_idle is not None:
                await self.on_idle()
            await self._fill()
        event = self._events.popleft()
        if isinstance(event, protocol.TERMINAL):
            self.finished = True
            self.close()
        return event

    async def _fill(self) -> None:
        """Read until there is an event to hand out (the first call sends the request); a
        failure queues an ``Error`` after the events read before it."""
        first = not self._began
        try:
            await (self._open() if first else self._read())
        except RequestFailed as e:
            self._fail(replace(e.event, id=self.id))
        except ApiError as e:
            self._fail(protocol.Error(self.id, e.status, e.message, e.param, e.code))
        except _Late as late:
            self._late(late.request_deadline)
        except (aiohttp.ClientError, OSError) as e:
            self.backend.health.failed(reason(e))
            self._fail(protocol.Error(self.id, 502, f"the upstream server for {self.backend.spec.name!r} broke "
                                                    f"its answer: {reason(e)}", None, "upstream_unavailable"))
        if first and self._events and not isinstance(self._events[0], protocol.Error):  # an answer has begun
            self._events.appendleft(protocol.Start(self.id, 0, 0, 0))
            self._answering = True

    async def _open(self) -> None:
        self._began = True
        self._due = asyncio.get_running_loop().time() + self.backend.upstream.first_byte_timeout
        if self.request.suffix is not None:
            self._resp = await self._infill()
        else:
            path, body = wire.request_body(self.request, self.backend.model)
            # post's own timeout is first_byte's (a 503: the upstream is failing, and a replica may answer)
            self._resp = await self._in_time(self.backend.post(path, body), _close, upstream_due=False)
        if self._resp.content_type == "application/json":  # a server that does not stream
            await self._read_whole()
        else:
            await self._read()

    async def _infill(self) -> aiohttp.ClientResponse:
        """Fill in the middle: the upstream's /infill, or where it has none (FIM_FALLBACK) its
        /completions with a suffix (``request_body`` refuses what that cannot carry)."""
        req, backend = self.request, self.backend
        try:
            resp = await self._in_time(backend.post("/infill", wire.infill_body(req, backend.model),
                                                    url=wire.infill_url(backend.upstream.url)),
                                       _close, upstream_due=False)
            self._reader = wire.InfillReader(self.id, wire.answer_bounds(req))
            return resp
        except RequestFailed as e:
            if e.event.status not in wire.FIM_FALLBACK:
                raise
        path, body = wire.request_body(req, backend.model)
        return await self._in_time(backend.post(path, body), _close, upstream_due=False)

    async def _in_time(self, step: Awaitable[T], discard: Callable[[T], object] | None = None, *,
                       upstream_due: bool = True) -> T:
        """``step`` (``within``), in the time the next event has: until ``_due`` (the upstream's
        timeouts; not with ``upstream_due=False``), at most until the request's deadline;
        ``_Late`` says which ran out."""
        left = self._due - asyncio.get_running_loop().time() if upstream_due else None
        ours = False
        if self.request.deadline is not None:
            until = self.request.deadline - time.time()
            if left is None or until < left:
                left, ours = until, True
        if left is not None and left <= 0:  # checked here too: under a flood a read never waits, so never times out
            raise _Late(ours)
        try:
            return await within(step, left, discard)
        except asyncio.TimeoutError:
            raise _Late(ours) from None

    async def _read_whole(self) -> None:
        """A whole answer where a stream was asked for, read as the stream it stands for."""
        assert self._resp is not None
        body = await self._in_time(read_body(self._resp, wire.MAX_EVENT_BYTES, "a whole answer"))
        self._events.extend(self._reader.whole(body))

    async def _read(self) -> None:
        """Read the stream until at least one event is queued. The upstream's time for it runs
        from here: the time the client took over the last one is not the upstream's."""
        assert self._resp is not None
        if self._answering:
            self._due = asyncio.get_running_loop().time() + self.backend.upstream.idle_timeout
        while not self._events:
            chunk = await self._in_time(self._resp.content.read(wire.READ_BYTES))
            self._read_bytes += len(chunk)
            if self._read_bytes > wire.MAX_STREAM_BYTES:
                raise wire.too_large("a stream", wire.MAX_STREAM_BYTES)
            for data in self._sse.feed(chunk) if chunk else self._sse.close():
                self._events.extend(self._reader.feed(data))
                if self._reader.done:  # [DONE], or the answer was cut: what follows is not read
                    break
            if not chunk and not self._events:
                if self._reader.done:
                    return
                raise wire.MalformedStream("the stream ended before [DONE]")

    def _late(self, request_deadline: bool) -> None:
        """The time for the next event ran out."""
        name, up = self.backend.spec.name, self.backend.upstream
        if request_deadline and self._answering:  # as a local model's answer at its deadline
            self._events.append(self._reader.cut("length"))
            self._drop()
        elif request_deadline:
            self._fail(protocol.Error(self.id, 504, f"the upstream server for {name!r} did not answer within the "
                                                    "request's time (server.request_timeout)", None,
                                      "upstream_timeout"))
        else:
            seconds = up.idle_timeout if self._answering else up.first_byte_timeout
            if not self._answering:
                self.backend.health.failed(f"no event within {seconds:g} s")
            self._fail(protocol.Error(self.id, 504, f"the upstream server for {name!r} sent nothing of its answer "
                                                    f"for {seconds:g} s", None, "upstream_timeout"))

    def _fail(self, event: protocol.Error) -> None:
        """The answer ends with ``event``, after what was read before it."""
        self._events.append(event)
        self._drop()

    def unread(self) -> collections.deque[Event]:
        return self._events

    def abort(self, event: protocol.Error) -> None:
        """End the answer now (shutdown, unload): what was not handed out yet is dropped."""
        self._events.clear()
        self._fail(event)

    def _drop(self) -> None:
        if self._resp is not None:
            self._resp.close()  # the connection, not back to the pool: the upstream sees the client go
            self._resp = None

    def close(self) -> None:
        if self._resp is not None:
            if self._reader.done and not self._reader.truncated:
                self._resp.release()
                self._resp = None
            else:
                self._drop()
        self.backend._release(self.id)
