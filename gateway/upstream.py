"""Models answered by another machine's OpenAI-compatible server: ``RemoteBackend`` (the
``Backend`` of a models.yaml entry with ``upstream:``), each upstream's health, and the
upstreams' model lists (``upstream_discover``).

Health is a small state machine (``Health``; ``UpstreamHealth.move`` is the one place it
changes): unknown until the upstream is first reached, up after an answer or a probe, down
after a connection failure, a timeout or a 502/503/504. Down, it is not tried again until its
back-off has passed (the first wait, doubling up to the cap): requests get 503
``upstream_unavailable`` with ``Retry-After`` at once, and the probe loop (``Upstreams.watch``)
tries it when the back-off ends, so it comes back without a request paying for it.

A request's answer is always streamed from the upstream, and goes on to the client as it
arrives (a whole answer is the stream collected, as for a local model); leaving the
generation closes the upstream connection at once, so the upstream stops generating.

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
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TypeVar

import aiohttp

from . import placement
from . import upstream_wire as wire
from .config import ModelSpec, Upstream, normalize_name
from .engine import protocol
from .engine.client import Events, RequestFailed
from .engine.protocol import CHAT, COMPLETIONS, EMBEDDINGS, Event, GenerationRequest
from .errors import ApiError, from_event
from .untrusted import shown

log = logging.getLogger(__name__)
T = TypeVar("T")

NATIVE = "native"  # a backend's tool_calls info: calls arrive parsed (CallDelta), not as text
RETRYABLE = ("upstream_unavailable", "worker_crashed", "model_unavailable")  # a replica may answer instead
_FAILING_STATUS = (502, 503, 504)  # an upstream answering these is failing, not refusing


class Health(Enum):
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


@dataclass
class UpstreamHealth:
    """One upstream's health and back-off. ``name``: the models.yaml entry (or replica) it
    serves, the label it is shown and counted by (never its URL or key)."""

    name: str
    upstream: Upstream
    backoff: tuple[float, float] = (2.0, 60.0)  # the first wait after a failure, and the cap
    state: Health = Health.UNKNOWN
    failures: int = 0  # in a row
    retry_at: float = 0.0  # time.monotonic() before which a down upstream is not tried
    error: str | None = None
    checked_at: float = -1e18  # last probe
    models: list[str] | None = None  # the ids its /models listed at the last probe
    spec: ModelSpec | None = None  # the entry it serves: what its discovered models inherit

    def move(self, new: Health) -> None:
        """The one place the state changes (every move is allowed: health is what was last seen)."""
        if new is not self.state:
            log.log(logging.WARNING if new is Health.DOWN else logging.INFO, "upstream %r is %s%s", self.name,
                    new.value, f": {self.error}" if new is Health.DOWN else "")
        self.state = new

    def succeeded(self) -> None:
        self.failures, self.error = 0, None
        self.move(Health.UP)

    def failed(self, why: str) -> None:
        self.failures += 1
        self.retry_at = time.monotonic() + placement.backoff(self.failures, *self.backoff)
        self.error = shown(why, 300)  # it may quote the upstream: logged and shown as it is
        self.move(Health.DOWN)

    @property
    def wait(self) -> float:
        """Seconds until a down upstream may be tried again (0: now)."""
        return max(0.0, self.retry_at - time.monotonic()) if self.state is Health.DOWN else 0.0

    def unavailable(self, why: str | None = None) -> protocol.Error:
        return protocol.Error(0, 503, f"the upstream server for {self.name!r} is unavailable: "
                                      f"{why or self.error or 'not reachable'}", "model", "upstream_unavailable",
                              max(self.wait, 1.0))

    def describe(self) -> dict[str, Any]:
        return {"state": self.state.value, "error": self.error,
                "retry_after": round(self.wait, 1) if self.wait else None}


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


def _compressed(resp: aiohttp.ClientResponse) -> str | None:
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
        self.info: dict[str, Any] = {"tool_calls": NATIVE, "n_ctx": None, "upstream": True}
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

    async def post(self, path: str, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """Send a request and wait for its answer's headers (``first_byte`` timeout). Health
        follows what happened; a failure raises ``RequestFailed`` with the error to answer."""
        if self.health.wait:
            raise RequestFailed(self.health.unavailable())
        up = self.upstream
        try:
            resp = await within(self.session.post(up.url + path, json=body, allow_redirects=False),
                                up.first_byte_timeout, _close)
        except asyncio.TimeoutError:
            raise RequestFailed(self._failing(f"no answer within {up.first_byte_timeout:g} s")) from None
        except (aiohttp.ClientError, OSError) as e:
            raise RequestFailed(self._failing(_why(e))) from None
        if resp.status == 200:
            if (encoding := _compressed(resp)) is not None:
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
        if resp.status in _FAILING_STATUS:
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
            raise ApiError(f"the upstream server for {self.spec.name!r} broke its embeddings answer ({_why(e)})",
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


def _why(e: BaseException) -> str:
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
        self._reader = wire.ChunkReader(rid, chat=request.messages is not None, bounds=wire.answer_bounds(request))
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
            self.backend.health.failed(_why(e))
            self._fail(protocol.Error(self.id, 502, f"the upstream server for {self.backend.spec.name!r} broke "
                                                    f"its answer: {_why(e)}", None, "upstream_unavailable"))
        if first and self._events and not isinstance(self._events[0], protocol.Error):  # an answer has begun
            self._events.appendleft(protocol.Start(self.id, 0, 0, 0))
            self._answering = True

    async def _open(self) -> None:
        self._began = True
        self._due = asyncio.get_running_loop().time() + self.backend.upstream.first_byte_timeout
        path, body = wire.request_body(self.request, self.backend.model)
        # post's own timeout is first_byte's (a 503: the upstream is failing, and a replica may answer)
        self._resp = await self._in_time(self.backend.post(path, body), _close, upstream_due=False)
        if self._resp.content_type == "application/json":  # a server that does not stream
            await self._read_whole()
        else:
            await self._read()

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
        chunk = wire.whole_as_chunk(body, self._reader.chat)
        self._events.extend(self._reader.take(chunk, len(body)) + self._reader.feed("[DONE]"))

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


class Upstreams:
    """Every upstream's health (kept across loads and unloads of its model), the probe loop
    that watches them, and the models the ``upstream_discover`` ones list."""

    def __init__(self, backoff: tuple[float, float] = (2.0, 60.0), check_seconds: float = 30.0):
        self.backoff = backoff
        self.check_seconds = check_seconds  # how often an upstream that is not down is probed; 0: never
        self._health: dict[str, UpstreamHealth] = {}
        # a discovered model's normalized name -> its spec and its upstream's health, made anew
        # when a list comes in or a reload changes the upstreams (``_relist``), not per lookup
        self._found: dict[str, tuple[ModelSpec, UpstreamHealth]] = {}
        self._probing: dict[str, asyncio.Task[None]] = {}

    def health(self, spec: ModelSpec) -> UpstreamHealth:
        """The health of the upstream ``spec`` runs on (a discovered model shares its entry's)."""
        assert spec.upstream is not None
        if (found := self._found.get(normalize_name(spec.name))) is not None and spec.name not in self._health:
            return found[1]
        h = self._health.get(spec.name)
        if h is None or h.upstream != spec.upstream:
            h = self._health[spec.name] = UpstreamHealth(spec.name, spec.upstream, self.backoff, spec=spec)
        return h

    def known(self) -> list[UpstreamHealth]:
        return list(self._health.values())

    def backend(self, spec: ModelSpec) -> RemoteBackend:
        return RemoteBackend(spec, self.health(spec))

    def sync(self, specs: list[ModelSpec]) -> None:
        """Watch exactly the upstreams of ``specs`` (at start and after a reload)."""
        wanted = {m.name: m for s in specs for m in s.members if m.upstream is not None}
        for name in [n for n in self._health if n not in wanted]:
            del self._health[name]
        for member in wanted.values():
            self.health(member)
        self._relist()

    def listed(self, h: UpstreamHealth, models: list[str]) -> None:
        """The model ids upstream ``h`` lists now (its /models); the table is made anew only
        when they changed (a probe comes every few seconds, the list seldom changes)."""
        if models != h.models:
            h.models = models
            self._relist()

    def _relist(self) -> None:
        """A spec per model a ``upstream_discover`` upstream listed, named prefix + its id, with the
        entry's settings (reasoning, defaults, keep_alive...); the first upstream to list a name has it."""
        found: dict[str, tuple[ModelSpec, UpstreamHealth]] = {}
        for h in self._health.values():
            if h.upstream.discover and h.models:
                parent = h.spec or ModelSpec(name=h.name, upstream=h.upstream)
                for mid in h.models:
                    spec = replace(parent, name=h.upstream.prefix + mid, aliases=(), source="upstream",
                                   upstream=replace(h.upstream, model=mid, discover=False))
                    found.setdefault(normalize_name(spec.name), (spec, h))
        self._found = found

    def discovered(self) -> list[ModelSpec]:
        return [spec for spec, _ in self._found.values()]

    def resolve(self, key: str) -> ModelSpec | None:
        """The discovered model named ``key`` (normalized), if any."""
        found = self._found.get(key)
        return found[0] if found is not None else None

    async def probe(self, h: UpstreamHealth) -> None:
        """GET the upstream's /models: up (and the model ids ``wire.listing`` takes) or down. A
        list that cannot be taken (too large, not JSON, behind a redirect) leaves it up, listing
        nothing."""
        h.checked_at = time.monotonic()
        up = h.upstream
        timeout = aiohttp.ClientTimeout(total=up.connect_timeout + min(up.first_byte_timeout, 30.0),
                                        connect=up.connect_timeout)
        body, problem = None, None
        try:
            async with client_session(up, timeout) as session, \
                    session.get(up.url + "/models", allow_redirects=False) as resp:
                if resp.status in _FAILING_STATUS:
                    raise OSError(f"HTTP {resp.status}")
                if 300 <= resp.status < 400:
                    problem = f"it is behind a redirect (HTTP {resp.status}), which is not followed"
                elif resp.status == 200 and (encoding := _compressed(resp)) is not None:
                    problem = f"it came compressed ({shown(encoding, 40)}) although it was asked not to"
                elif resp.status == 200:
                    body = await read_body(resp, wire.MAX_LIST_BYTES, "a model list")
            found = wire.listing(body) if body is not None else None
        except wire.MalformedStream as e:
            found, problem = None, e.message
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            h.failed(_why(e))
            return
        h.succeeded()
        if found is not None:
            if (found.refused or found.left_out) and found.ids != h.models:
                log.warning("upstream %r lists %d model ids that cannot be names (the first: %s) and %d past the %d "
                            "taken", h.name, found.refused, found.why, found.left_out, wire.MAX_LISTED)
            self.listed(h, found.ids)
        elif problem is not None:
            if h.models != []:
                log.warning("upstream %r: its model list is not taken: %s", h.name, problem)
            self.listed(h, [])

    def _due(self, h: UpstreamHealth, now: float) -> bool:
        if h.state is Health.DOWN:
            return now >= h.retry_at
        if h.upstream.discover and h.models is None and h.checked_at < 0:  # its list, once, whatever the interval
            return True
        return bool(self.check_seconds) and now - h.checked_at >= self.check_seconds

    async def refresh(self, discover_only: bool = False) -> None:
        """Probe every upstream that is due now (or, ``discover_only``, every discovering one)."""
        now = time.monotonic()
        due = [h for h in self._health.values()
               if (h.upstream.discover if discover_only else self._due(h, now)) and h.name not in self._probing]
        for h in due:
            self._probing[h.name] = asyncio.ensure_future(self.probe(h))
        tasks = [self._probing[h.name] for h in due]
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for h in due:
                self._probing.pop(h.name, None)

    async def watch(self) -> None:
        """Probe upstreams as they fall due, until cancelled."""
        while True:
            await self.refresh()
            await asyncio.sleep(1.0)

