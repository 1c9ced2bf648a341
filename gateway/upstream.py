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
from typing import Any

import aiohttp

from . import placement
from . import upstream_wire as wire
from .config import ModelSpec, Upstream, normalize_name
from .engine import protocol
from .engine.client import Events, RequestFailed
from .engine.protocol import CHAT, COMPLETIONS, EMBEDDINGS, Event, GenerationRequest
from .errors import ApiError, from_event

log = logging.getLogger(__name__)

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
        self.error = why
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
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=up.max_connections, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=None, connect=up.connect_timeout, sock_read=up.idle_timeout),
            headers=headers(up), auto_decompress=True)
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
        try:
            resp = await asyncio.wait_for(self.session.post(self.upstream.url + path, json=body),
                                          self.upstream.first_byte_timeout)
        except asyncio.TimeoutError:
            raise RequestFailed(self._failing(f"no answer within {self.upstream.first_byte_timeout:g} s")) from None
        except (aiohttp.ClientError, OSError) as e:
            raise RequestFailed(self._failing(_why(e))) from None
        if resp.status == 200:
            self.health.succeeded()
            return resp
        try:
            body_bytes = await asyncio.wait_for(resp.content.read(wire.MAX_ERROR_BYTES), self.upstream.idle_timeout)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
            body_bytes = b""
        finally:
            resp.close()
        if resp.status in _FAILING_STATUS:
            raise RequestFailed(self._failing(f"HTTP {resp.status}: {body_bytes[:200].decode(errors='replace')}"))
        self.health.succeeded()  # it answered: a refusal is the request's, not the upstream's
        error = wire.error_from(resp.status, body_bytes)
        if resp.status >= 500:
            error = ApiError(f"the upstream server failed: {error.message}", status=502, code="upstream_error")
        retry = resp.headers.get("Retry-After")
        raise RequestFailed(protocol.Error(0, error.status, error.message, error.param, error.code,
                                           float(retry) if retry and retry.isdigit() else None))

    def _failing(self, why: str) -> protocol.Error:
        self.health.failed(why)
        return self.health.unavailable(why)

    async def embed(self, inputs: list[Any]) -> protocol.Embeddings:
        try:
            resp = await self.post("/embeddings", {"model": self.model, "input": inputs})
        except RequestFailed as e:
            raise from_event(e.event) from None
        try:
            async with resp:
                data = await resp.json(content_type=None)
            items = sorted(data["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in items]
            prompt_tokens = int((data.get("usage") or {}).get("prompt_tokens") or 0)
        except (ValueError, KeyError, TypeError, aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise ApiError(f"the upstream server sent a malformed embeddings answer ({_why(e)})", status=502,
                           code="upstream_malformed") from None
        return protocol.Embeddings(0, vectors, prompt_tokens)

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
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class RemoteGeneration(Events):
    """One answer from the upstream, as backend events (``backend.GenerationEvents``): ``Start``
    once the upstream has sent its first event, then what its chunks hold, then ``Done``; or an
    ``Error``. A failure after the start (the stream broke, went silent past ``idle``, or was
    malformed) is an ``Error`` event too: the handler ends the answer in-band."""

    def __init__(self, backend: RemoteBackend, rid: int, request: GenerationRequest):
        self.backend, self.id, self.request = backend, rid, request
        self.on_idle: Callable[[], Awaitable[None]] | None = None
        self._events: collections.deque[Event] = collections.deque()
        self._resp: aiohttp.ClientResponse | None = None
        self._reader = wire.ChunkReader(rid, chat=request.messages is not None)
        self._sse = wire.SSEDecoder()
        self._began = False
        self.finished = False

    async def next(self) -> Event:
        if not self._events and not self.finished:
            if self._began and self.on_idle is not None:
                await self.on_idle()
            try:
                await self._fill()
            except RequestFailed as e:
                self._events.append(replace(e.event, id=self.id))
        event = self._events.popleft()
        if isinstance(event, protocol.TERMINAL):
            self.finished = True
            self.close()
        return event

    async def _fill(self) -> None:
        """Read until there is an event to hand out (the first call opens the request)."""
        if not self._began:
            path, body = wire.request_body(self.request, self.backend.model)
            self._resp = await self.backend.post(path, body)
            self._began = True
            if self._resp.content_type == "application/json":  # a server that does not stream
                await self._read_whole()
            else:
                await self._read(self.backend.upstream.first_byte_timeout)
            if not isinstance(self._events[0], protocol.Error):  # an answer has begun (an error may follow it)
                self._events.appendleft(protocol.Start(self.id, 0, 0, 0))
            return
        await self._read(None)

    async def _read_whole(self) -> None:
        """A whole answer where a stream was asked for, read as the stream it stands for."""
        assert self._resp is not None
        try:
            body = await asyncio.wait_for(self._resp.content.read(wire.MAX_EVENT_BYTES + 1),
                                          self.backend.upstream.first_byte_timeout)
            if len(body) > wire.MAX_EVENT_BYTES:
                raise wire.MalformedStream(f"a whole answer of more than {wire.MAX_EVENT_BYTES} bytes")
            for data in wire.whole_as_chunks(body, self._reader.chat):
                self._events.extend(self._reader.feed(data))
        except ApiError as e:
            self._fail(protocol.Error(self.id, e.status, e.message, e.param, e.code))
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as e:
            self.backend.health.failed(_why(e))
            self._fail(protocol.Error(self.id, 502, f"the upstream server for {self.backend.spec.name!r} broke "
                                                    f"its answer: {_why(e)}", None, "upstream_unavailable"))

    async def _read(self, first_byte: float | None) -> None:
        """Read the stream until at least one event is queued; a failure queues an ``Error``
        after the events read before it."""
        assert self._resp is not None
        upstream = self.backend.upstream
        try:
            while not self._events:
                read = self._resp.content.readany()
                chunk = await (asyncio.wait_for(read, first_byte) if first_byte else read)
                datas = self._sse.feed(chunk) if chunk else self._sse.close()
                for data in datas:
                    self._events.extend(self._reader.feed(data))
                if not chunk and not self._events:
                    if self._reader.done:
                        return
                    raise wire.MalformedStream("the stream ended before [DONE]")
        except ApiError as e:
            self._fail(protocol.Error(self.id, e.status, e.message, e.param, e.code))
        except asyncio.TimeoutError:
            if not self._began or first_byte:
                self.backend.health.failed(f"no event within {first_byte or upstream.idle_timeout:g} s")
            self._fail(protocol.Error(self.id, 504, f"the upstream server for {self.backend.spec.name!r} sent "
                                                    f"nothing for {first_byte or upstream.idle_timeout:g} s",
                                      None, "upstream_timeout"))
        except (aiohttp.ClientError, OSError) as e:
            self.backend.health.failed(_why(e))
            self._fail(protocol.Error(self.id, 502, f"the upstream server for {self.backend.spec.name!r} broke "
                                                    f"the stream: {_why(e)}", None, "upstream_unavailable"))

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
            if self._reader.done:
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
        """The model ids upstream ``h`` lists now (its /models)."""
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
        """GET the upstream's /models: up (and its model ids) or down."""
        h.checked_at = time.monotonic()
        up = h.upstream
        timeout = aiohttp.ClientTimeout(total=up.connect_timeout + min(up.first_byte_timeout, 30.0),
                                        connect=up.connect_timeout)
        try:
            async with aiohttp.ClientSession(timeout=timeout, headers=headers(up)) as session, \
                    session.get(up.url + "/models") as resp:
                if resp.status in _FAILING_STATUS:
                    raise OSError(f"HTTP {resp.status}")
                data = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as e:
            h.failed(_why(e))
            return
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            self.listed(h, [m["id"] for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)])
        h.succeeded()

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

