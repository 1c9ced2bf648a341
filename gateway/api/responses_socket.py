"""The Responses WebSocket: GET /v1/responses with ``Upgrade: websocket``, as the official
openai SDK's ``client.responses.connect()`` speaks it (OpenAI's "WebSocket mode").

The upgrade is a request like any other: the middlewares check its key (``Authorization:
Bearer`` or ``x-api-key``), its Host, and its Origin as they check a POST's (a page on another
site may open a socket to any address). Then the client sends JSON events, one a text frame:

- ``response.create``: the body of POST /v1/responses (``stream`` implied; ``background`` is
  refused). Each one is made a request of its own: the socket's request cloned as that POST,
  its body given (``body.GIVEN_BODY``), run through every middleware but the connection's own
  (``server.connections.per_connection``) into the POST's own handler (``responses.create``).
  So each response is observed, traced, captured, limited and charged as a POST is (its key's
  ``spends``, usage, the inference event). Its answer is the SSE stream's events, the same
  writer's, each a JSON text frame (``server.socketstream.SocketStream``, the stream the
  pipeline writes to: ``events.STREAM``); a refusal before its stream began (a 400, a 401, a
  429) is an ``error`` event: the error body of the POST, with its ``status``.
- Responses run one at a time, in the order they were asked for (OpenAI: a lane is FIFO); at
  most ``MAX_QUEUED`` wait, past that an ``error`` (429, ``queue_full``).
- ``response.steer``: queued input for the running response (``responses_steer``: what it
  means here, its accepted, pending and failed events).

Bounds: a frame past ``server.max_body_bytes`` closes the socket with 1009 (aiohttp's reader,
before the frame is read whole); a frame that is not a JSON object, or an unknown event type,
is an ``error`` event (400); more than ``MAX_EVENTS_PER_SECOND`` events in a second gets an
``error`` (``rate_limit_exceeded``) and the close 1008; an event out that the client does not
read within ``server.write_timeout`` (``STALL_SECONDS`` where that is 0) aborts the connection.
A socket remembers at most ``MAX_ENDED`` ended responses (to tell a late steer so) and
``MAX_PENDING`` responses whose steers wait; and what waits on it (queued creates, held steers)
is at most ``server.max_body_bytes`` of frames, as a POST holds one body: past it a create is
refused (429, ``queue_full``) and a steer too (``too_many_pending_steers``). (A frame's JSON
takes many times its size once parsed: unbounded, sixteen queued frames of empty objects would
hold gigabytes.) A socket that closes, however, cancels its
running response (its generation stops and the model's slot is freed) and drops the queued
ones. A heartbeat ping every ``HEARTBEAT_SECONDS`` finds a peer that vanished."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import WSMsgType, web

from ..base import strictjson
from ..base.errors import ApiError, InvalidRequest
from ..server.connections import is_per_connection
from ..server.events import STREAM
from ..server.socketstream import Outbox, SocketStream
from . import responses_steer as steering
from .appkeys import CONFIG
from .body import GIVEN_BODY, OFF_LOOP_BYTES, Given
from .responses_steer import Steer, SteerRefused

log = logging.getLogger(__name__)

MAX_QUEUED = 16  # response.create events waiting behind the running one
MAX_ENDED = 256  # ended responses a late steer is told about by name
MAX_PENDING = 16  # responses whose steers wait for their client's turn; past it, the oldest's fail
MAX_EVENTS_PER_SECOND = 100  # a client's events within one second; past it the socket closes
HEARTBEAT_SECONDS = 30.0
STALL_SECONDS = 60.0  # an event out's bound where server.write_timeout is 0
_ENDED = frozenset({"response.completed", "response.incomplete", "response.failed"})
_HEADERS = ("Retry-After", "X-Gateway-Limit")  # an error's headers the error event carries


async def connect(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the Responses WebSocket (the module's docstring)."""
    server = request.app[CONFIG].server
    socket = web.WebSocketResponse(max_msg_size=server.max_body_bytes, heartbeat=HEARTBEAT_SECONDS)
    if not socket.can_prepare(request).ok:
        raise ApiError("GET /v1/responses is the Responses WebSocket: open it with `Upgrade: websocket` "
                       "(POST /v1/responses answers one response)", status=426, code="upgrade_required",
                       headers={"Upgrade": "websocket"})
    await socket.prepare(request)
    outbox = Outbox(socket, request.transport, server.write_timeout or STALL_SECONDS)
    await Session(request, socket, outbox).serve()
    return socket


@dataclass
class Job:
    """One response to make: its ``response.create`` body, and the steers it commits."""

    body: dict[str, Any]
    steers: list[Steer] = field(default_factory=list)
    size: int = 0  # the bytes of its frame and its steers', held while it waits


@dataclass
class Running:
    """The response a job made, as its events told it."""

    job: Job
    id: str | None = None
    final: dict[str, Any] | None = None
    steers: list[Steer] = field(default_factory=list)


class Session:
    """One socket's responses: read its events, run its jobs in turn, route its steers."""

    def __init__(self, request: web.Request, socket: web.WebSocketResponse, outbox: Outbox):
        self.request, self.socket, self.outbox = request, socket, outbox
        self.queue: deque[Job] = deque()
        self.turn: asyncio.Task[None] | None = None
        self.active: Running | None = None  # the response being generated, once created
        self.ended: OrderedDict[str, None] = OrderedDict()  # the last MAX_ENDED responses' ids (a steer too late)
        self.pending: dict[str, list[Steer]] = {}  # response id -> steers waiting for its client's turn
        self.seq = 0  # the socket's own events' sequence numbers
        self.held = 0  # bytes of the frames that wait: queued jobs' and steers' not yet in a job
        self.limit = request.app[CONFIG].server.max_body_bytes
        self._window = (0.0, 0)

    async def serve(self) -> None:
        try:
            async for message in self.socket:
                if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break
                if not self._within_rate():
                    await self._error(ApiError(f"More than {MAX_EVENTS_PER_SECOND} events in a second",
                                               status=429, code="rate_limit_exceeded"))
                    await self.socket.close(code=1008, message=b"too many events")
                    break
                await self._event(message.data)
        except ConnectionResetError:
            log.info("a Responses WebSocket's client stopped reading")
        finally:
            self.queue.clear()
            if self.turn is not None:
                self.turn.cancel()  # the running response's generation ends, its model's slot is freed
                await asyncio.gather(self.turn, return_exceptions=True)
            if not self.socket.closed:
                await self.socket.close()

    def _gone(self) -> bool:
        transport = self.request.transport
        return self.socket.closed or transport is None or transport.is_closing()

    def _within_rate(self) -> bool:
        now = time.monotonic()
        start, count = self._window
        self._window = (start, count + 1) if now - start < 1.0 else (now, 1)
        return self._window[1] <= MAX_EVENTS_PER_SECOND

    async def _event(self, data: str | bytes) -> None:
        try:  # a large frame is parsed off the event loop, as a POST's body is, and only once
            event = await asyncio.to_thread(strictjson.loads, data) if len(data) > OFF_LOOP_BYTES \
                else strictjson.loads(data)
        except ValueError as e:
            return await self._error(InvalidRequest(f"The event is not JSON: {e}", code="invalid_json"))
        if not isinstance(event, dict):
            return await self._error(InvalidRequest("An event must be a JSON object", code="invalid_json"))
        kind = event.get("type")
        if kind == "response.create":
            return await self._create(event, len(data))
        if kind == "response.steer":
            return await self._steer(event, len(data))
        shown = json.dumps(kind)[:60] if kind is not None else "none"
        await self._error(InvalidRequest(f"Unknown event type {shown}: this socket takes response.create and "
                                         "response.steer", "type", code="unknown_event_type"))

    def _fits(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes may wait: one always may, more while they fit the bound."""
        return not self.held or self.held + size <= self.limit

    async def _create(self, event: dict[str, Any], size: int) -> None:
        body = {k: v for k, v in event.items() if k not in ("type", "stream_id")}
        if body.get("background"):
            return await self._error(InvalidRequest("`background` is not supported over WebSocket", "background"))
        if len(self.queue) >= MAX_QUEUED:
            return await self._error(ApiError(f"{MAX_QUEUED} responses already wait on this socket",
                                              status=429, code="queue_full"))
        if not self._fits(size):
            return await self._error(ApiError(f"The responses waiting on this socket hold server.max_body_bytes "
                                              f"({self.limit} bytes) of input already", status=429, code="queue_full"))
        job = Job({**body, "stream": True}, size=size)
        self.held += size
        target = body.get("previous_response_id")
        if isinstance(target, str) and target in self.pending:  # it carries the steers its parent kept
            job.steers = self.pending.pop(target)
            job.body = steering.prepended(job.body, job.steers)
            job.size += sum(steer.size for steer in job.steers)  # held already: now the job's
        self.queue.append(job)
        if self.turn is None:
            self.turn = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            while self.queue and not self._gone():
                job = self.queue.popleft()
                self.held -= job.size
                await self._answer(job)
        except ConnectionResetError:
            log.info("a Responses WebSocket's client went away during a response")
        finally:
            self.turn = None

    async def _answer(self, job: Job) -> None:
        running = Running(job)
        request = await self._request(job.body)
        stream = request[STREAM] = SocketStream(request, self.outbox, on_event=partial(self._seen, running))
        handler = request.match_info.handler
        for middleware in reversed(request.app.middlewares):
            if not is_per_connection(middleware):
                handler = partial(middleware, handler=handler)
        try:
            response = await handler(request)
        finally:
            if self.active is running:
                self.active = None
        if not stream.opened and isinstance(response, web.Response):
            await self._refused(response)
        await self._after(running)

    async def _request(self, body: dict[str, Any]) -> web.Request:
        """The socket's request as a POST /v1/responses of ``body``."""
        request = self.request.clone(method="POST")
        app = self.request.app
        match = await app.router.resolve(request)
        match.add_app(app)
        match.freeze()
        request._match_info = match  # what aiohttp's own dispatch does: the POST's route and handler
        request[GIVEN_BODY] = Given(dict(body), lambda: json.dumps(body).encode())  # parsed: never again
        return request

    def _seen(self, running: Running, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "response.created":
            running.id = event.get("response", {}).get("id")
            self.active = running  # steerable; its job's steers are committed
        elif kind in _ENDED:
            running.final = event.get("response")
            if running.id is not None:
                self.ended[running.id] = None
                while len(self.ended) > MAX_ENDED:
                    self.ended.popitem(last=False)
            if self.active is running:
                self.active = None

    async def _refused(self, response: web.Response) -> None:
        try:
            error = json.loads(response.body)["error"]  # type: ignore[arg-type]
        except (TypeError, ValueError, KeyError):
            error = {"type": "server_error", "message": "The response could not be made", "code": None,
                     "param": None}
        headers = {k: response.headers[k] for k in _HEADERS if k in response.headers}
        if headers:
            error = {**error, "headers": headers}
        await self.outbox.event({"type": "error", "status": response.status, "error": error})

    async def _after(self, running: Running) -> None:
        """A job's end: its own steers failed where it was never created, and the steers it
        was given: kept for its client's turn, or carried by a successor made now."""
        if running.id is None:
            for steer in running.job.steers:
                await self._steer_failed(steer, "successor_creation_failed", "The response that was to carry "
                                         "this steering input could not be created")
        steers, final = running.steers, running.final
        if not steers:
            return
        if final is None or final.get("status") == "failed":
            for steer in steers:
                self.held -= steer.size
                await self._steer_failed(steer, "response_not_active", "The steered response ended without "
                                         "finishing; its steering input was not applied")
            return
        required = steering.required_input(final.get("output") or [])
        if required:
            self.pending[final["id"]] = steers
            for steer in steers:
                await self._send(steering.pending(steer, required, self._next()))
            while len(self.pending) > MAX_PENDING:
                for steer in self.pending.pop(next(iter(self.pending))):
                    self.held -= steer.size
                    await self._steer_failed(steer, "response_not_active", "Too many responses on this socket "
                                             "wait for their client's turn; this one's steering input was dropped")
            return
        self.queue.appendleft(Job(steering.successor(running.job.body, final, steers), steers,
                                  sum(steer.size for steer in steers)))

    async def _steer(self, event: dict[str, Any], size: int) -> None:
        target = event.get("previous_response_id")
        target = target if isinstance(target, str) else ""
        try:
            target, given, items = steering.accept(event)
            running = self.active
            if running is None or running.id != target:
                if target in self.ended:
                    raise SteerRefused("response_already_completed", f"Response {target[:100]} has ended and "
                                       "takes no more steering input")
                raise SteerRefused("response_not_found", f"No response {target[:100]} runs on this connection")
            if len(running.steers) >= steering.MAX_STEERS:
                raise SteerRefused("too_many_pending_steers", f"{steering.MAX_STEERS} steering submissions "
                                   "already wait for this response")
            if not self._fits(size):
                raise SteerRefused("too_many_pending_steers", "The input waiting on this socket holds "
                                   f"server.max_body_bytes ({self.limit} bytes) already")
        except SteerRefused as refused:
            return await self._send(steering.failed(refused.code, refused.message, target, event.get("input"),
                                                    self._next()))
        steer = Steer(target, given, items, size=size)
        self.held += size
        running.steers.append(steer)
        await self._send(steering.accepted(steer, self._next()))

    async def _steer_failed(self, steer: Steer, code: str, message: str) -> None:
        await self._send(steering.failed(code, message, steer.previous_response_id, steer.input, self._next(),
                                         steer.id))

    async def _error(self, err: ApiError) -> None:
        await self._send({"type": "error", "status": err.status, **err.openai_body()})

    async def _send(self, event: dict[str, Any]) -> None:
        await self.outbox.event(event)

    def _next(self) -> int:
        self.seq += 1
        return self.seq - 1
