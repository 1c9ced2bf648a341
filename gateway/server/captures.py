"""Captured requests (``server.capture``): each generating request as it was received and its
answer as it was sent, kept in a bounded store for ``/captures`` and the page's Requests tab.

A ``Capture`` follows one request while it runs. The observe middleware opens it before the
handler; ``api/body`` hands it the body it read (decoded, before parsing); an ``EventStream``
hands it each write of a stream with its time (``frame``); the middleware closes it with the
status, the whole answer's bytes where the answer was not a stream, and the request's
``Observation`` (model, key, timings). What it keeps is the bytes themselves, so a capture of a
stream is the stream the client read, byte for byte, each write stamped with its time.

Bounds: each body (and each stream's writes together) is kept up to ``max_body_bytes``, cut
past it and said so (``truncated``, with the size it had); the store holds at most
``max_bytes`` of captures, dropping the oldest. What a capture costs the request is a slice of
the body and one list append per stream write; everything else (redaction of content,
persistence, JSON) happens after the answer went out, or when a capture is read.

Secrets never enter a capture: the headers that carry credentials are redacted, and the key the
request presented is cut out of the body wherever it appears. With ``redact_content`` the text
goes too: every string of the JSON, but for the words that give its shape (roles, types, names,
finish reasons), becomes its length (``redaction``)."""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.config.specs import CaptureConfig
from . import redaction
from .events import Observation, request_key

log = logging.getLogger(__name__)

FOLDER = "captures"  # in the state folder, where ``keep`` is on
OVERHEAD = 512  # bytes a capture is counted for beyond its bodies: its fields and headers
MAX_HEADERS = 64  # of a request's headers kept, and each value's length
MAX_HEADER_VALUE = 1024
# the ``Content-Type``s whose answer is a stream of writes rather than one body
STREAM_TYPES = ("text/event-stream", "application/x-ndjson")


@dataclass(slots=True)
class Capture:
    """One request's capture while it runs."""

    id: str
    started: float  # time.monotonic() when the request came
    time: float  # epoch seconds when the request came
    method: str
    path: str
    query: str
    headers: dict[str, str]
    secrets: tuple[bytes, ...]  # the credentials the request presented, cut out of what is kept
    limit: int  # each body's bytes kept
    body: bytes | None = None  # the request's body as read (decoded), cut to ``limit``
    body_bytes: int = 0  # its whole size
    frames: list[tuple[float, bytes]] = field(default_factory=list)  # a stream's writes: (seconds in, bytes)
    sent: int = 0  # a stream's bytes written in all
    kept: int = 0  # of them, kept

    def request_body(self, raw: bytes) -> None:
        self.body_bytes = len(raw)
        self.body = raw[:self.limit]

    def frame(self, data: bytes) -> None:
        """A write of the answer's stream, as it went to the client."""
        self.sent += len(data)
        room = self.limit - self.kept
        if room <= 0:
            return
        kept = data if len(data) <= room else data[:room]
        self.kept += len(kept)
        self.frames.append((time.monotonic() - self.started, kept))


@dataclass(slots=True)
class Record:
    """A finished capture, as the store keeps it (``summary`` and ``detail`` are its JSON)."""

    id: str
    time: float
    method: str
    path: str
    route: str
    query: str
    request_id: str
    model: str
    key: str
    status: int
    request_headers: dict[str, str]
    request_body: bytes | None
    request_bytes: int
    response_headers: dict[str, str]
    stream: bool
    response_body: bytes | None  # a whole answer
    frames: list[tuple[float, bytes]]  # a streamed one
    response_bytes: int
    timings: dict[str, float | None]
    usage: dict[str, int]
    finish_reason: str | None
    trace_id: str | None
    redacted: bool
    request_cut: bool  # the request's body, or the answer, kept only in part (``max_body_bytes``)
    response_cut: bool
    replay_of: str | None = None

    @property
    def size(self) -> int:
        return OVERHEAD + len(self.request_body or b"") + len(self.response_body or b"") + \
            sum(len(b) for _, b in self.frames)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "time": self.time, "method": self.method, "path": self.path, "route": self.route,
                "request_id": self.request_id, "model": self.model, "key": self.key, "status": self.status,
                "stream": self.stream, **self.timings, **self.usage, "finish_reason": self.finish_reason,
                "request_bytes": self.request_bytes, "response_bytes": self.response_bytes,
                "truncated": self.request_cut or self.response_cut, "redacted": self.redacted,
                "trace_id": self.trace_id, "replay_of": self.replay_of}

    def request_json(self) -> Any:
        """The request's body as JSON, or None where it is cut, missing or not JSON."""
        if self.request_body is None or self.request_cut:
            return None
        try:
            return json.loads(self.request_body)
        except (ValueError, RecursionError):
            return None

    def detail(self) -> dict[str, Any]:
        """Everything kept: the bodies as text (and the request's as JSON where it parses), a
        stream as its writes with their times."""
        request_json = self.request_json()
        response: dict[str, Any] = {"status": self.status, "headers": self.response_headers, "stream": self.stream,
                                    "bytes": self.response_bytes, "truncated": self.response_cut}
        if self.stream:
            response["events"] = [{"t": round(t, 6), "data": _text(b)} for t, b in self.frames]
        else:
            response["body"] = _json_or_none(self.response_body)
            response["body_text"] = _text(self.response_body) if self.response_body is not None else None
        return {**self.summary(), "query": self.query,
                "request": {"headers": self.request_headers, "body": request_json,
                            "body_text": None if request_json is not None or self.request_body is None
                            else _text(self.request_body),
                            "bytes": self.request_bytes, "truncated": self.request_cut},
                "response": response}

    def answer_bytes(self) -> bytes:
        """The answer as the client read it (a stream's writes joined), as far as it was kept."""
        return b"".join(b for _, b in self.frames) if self.stream else (self.response_body or b"")

    # --- kept on disk (``keep``): the record itself, its bytes in base64 ------------------------
    def to_json(self) -> str:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["request_body"] = _b64(self.request_body)
        out["response_body"] = _b64(self.response_body)
        out["frames"] = [[t, _b64(b)] for t, b in self.frames]
        return json.dumps(out, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Record:
        data = json.loads(text)
        data["request_body"] = _unb64(data["request_body"])
        data["response_body"] = _unb64(data["response_body"])
        data["frames"] = [(float(t), _unb64(b) or b"") for t, b in data["frames"]]
        return cls(**data)


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def _json_or_none(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def timings(obs: Observation, ended: float) -> dict[str, float | None]:
    """A request's times, in seconds (None where it did not get that far): waiting in the queue
    (the model's lease, then a sequence to take it, less any load), the load it waited for, to
    the first token, the whole, and the tokens per second after the first. Pure."""
    def span(a: float | None, b: float | None) -> float | None:
        return round(max(0.0, b - a), 6) if a is not None and b is not None else None

    load = obs.load
    load_s = span(max(load.began, obs.queued or load.began), load.ended) if load is not None else None
    queue_end = obs.admitted if obs.admitted is not None else obs.leased
    queue_s = span(obs.queued, queue_end)
    if queue_s is not None and load_s is not None:
        queue_s = round(max(0.0, queue_s - load_s), 6)
    rate = None
    if obs.first_token is not None and obs.last_token is not None and obs.completion_tokens > 1 \
            and obs.last_token > obs.first_token:
        rate = round((obs.completion_tokens - 1) / (obs.last_token - obs.first_token), 3)
    return {"queue_s": queue_s, "load_s": load_s, "time_to_first_token_s": span(obs.started, obs.first_token),
            "duration_s": span(obs.started, ended), "tokens_per_s": rate}


CAPTURE = request_key("capture", Capture)  # the request's capture, where capture is on and it is captured


class CaptureStore:
    """The captures kept, oldest first, within ``config.max_bytes``; with ``keep``, each also a
    file in ``folder`` (written and removed by ``persist``'s caller off the event loop)."""

    def __init__(self, config: CaptureConfig, folder: Path | None = None):
        self.config = config
        self.folder = folder if config.keep else None
        self.records: OrderedDict[str, Record] = OrderedDict()
        self.bytes = 0
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]  # ids of one run apart from another's kept ones
        # what ``persist`` writes (a record) or removes (None), by id, since it last ran
        self.pending: list[tuple[str, Record | None]] = []

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def begin(self, method: str, path: str, query: str, headers: Mapping[str, str], started: float) -> Capture:
        return Capture(f"{self._prefix}-{next(self._ids)}", started, time.time(), method, path,
                       query[:MAX_HEADER_VALUE], redaction.headers(headers, MAX_HEADERS, MAX_HEADER_VALUE),
                       redaction.presented(headers), self.config.max_body_bytes)

    def finish(self, capture: Capture, obs: Observation, status: int, response_headers: Mapping[str, str],
               whole: bytes | None) -> Record:
        """The capture of a request that ended with ``status``; ``whole``: its answer's body where
        it was not a stream."""
        kind = response_headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        stream = kind in STREAM_TYPES or bool(capture.frames)
        limit = capture.limit
        body, frames = capture.body, capture.frames
        answer = None if stream or whole is None else whole[:limit]
        answer_bytes = capture.sent if stream else len(whole or b"")
        request_cut = body is not None and len(body) < capture.body_bytes
        response_cut = (capture.kept if stream else len(answer or b"")) < answer_bytes
        if capture.secrets:
            body = redaction.cut_secrets(body, capture.secrets)
            answer = redaction.cut_secrets(answer, capture.secrets)
        redacted = self.config.redact_content
        if redacted:
            body = redaction.content(body, sse=False)
            answer = redaction.content(answer, sse=False)
            frames = [(t, redaction.content(b, sse=kind == "text/event-stream") or b"") for t, b in frames]
        record = Record(
            capture.id, capture.time, capture.method, capture.path, obs.endpoint, capture.query, obs.request_id,
            obs.model, obs.principal, status, capture.headers, body, capture.body_bytes,
            redaction.headers(response_headers, MAX_HEADERS, MAX_HEADER_VALUE), stream, answer, frames,
            answer_bytes, timings(obs, time.monotonic()),
            {"prompt_tokens": obs.prompt_tokens, "cached_tokens": obs.cached_tokens,
             "completion_tokens": obs.completion_tokens, "reasoning_tokens": obs.reasoning_tokens},
            obs.finish_reason, obs.trace_id, redacted, request_cut, response_cut)
        self.add(record)
        return record

    def add(self, record: Record) -> None:
        size = record.size
        if size > self.config.max_bytes:
            return
        self.records[record.id] = record
        self.bytes += size
        if self.folder is not None:
            self.pending.append((record.id, record))  # made into JSON by ``persist``, off the loop
        self._trim()

    def _trim(self) -> None:
        while self.bytes > self.config.max_bytes and self.records:
            _, old = self.records.popitem(last=False)
            self.bytes -= old.size
            if self.folder is not None:
                self.pending.append((old.id, None))

    def replayed(self, record: Record, of: Record) -> None:
        """``record`` is the replay of ``of``: said in it, and in its kept file."""
        record.replay_of = of.id
        if self.folder is not None and record.id in self.records:
            self.pending.append((record.id, record))

    def get(self, capture_id: str) -> Record | None:
        return self.records.get(capture_id)

    def by_request_id(self, request_id: str) -> Record | None:
        for record in reversed(self.records.values()):
            if record.request_id == request_id:
                return record
        return None

    def query(self, *, models: Iterable[str] = (), keys: Iterable[str] = (), statuses: Iterable[str] = (),
              routes: Iterable[str] = (), since: float | None = None, until: float | None = None,
              limit: int = 100) -> list[Record]:
        """The captures that match every filter given (each a set of values, any of which may
        match; a status as ``200`` or a class, ``4xx``), newest first, at most ``limit``."""
        model_set, key_set, route_set = set(models), set(keys), set(routes)
        status_set = {s.lower() for s in statuses}
        out = []
        for record in reversed(self.records.values()):
            if (model_set and record.model not in model_set) or (key_set and record.key not in key_set) \
                    or (route_set and record.route not in route_set and record.path not in route_set) \
                    or (status_set and str(record.status) not in status_set
                        and f"{record.status // 100}xx" not in status_set) \
                    or (since is not None and record.time < since) or (until is not None and record.time >= until):
                continue
            out.append(record)
            if len(out) >= limit:
                break
        return out

    # --- the state folder (``keep``) ------------------------------------------------------------
    def read_kept(self) -> list[Record]:
        """The kept captures, oldest first (blocking: a thread's); a file that does not read is
        skipped and said so."""
        if self.folder is None or not self.folder.is_dir():
            return []
        most = 2 * (OVERHEAD + 2 * self.config.max_body_bytes) + 65536  # base64 and JSON around two bodies
        out = []
        for path in sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime):
            try:
                if path.stat().st_size > most:
                    raise ValueError("larger than a capture can be")
                out.append(Record.from_json(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:
                log.warning("skipping the kept capture %s: %s", path.name, e)
        return out

    def restore(self, kept: list[Record]) -> None:
        """``read_kept``'s captures put before those made since the start, within ``max_bytes``."""
        for record in reversed(kept):
            if record.id in self.records:
                continue
            self.records[record.id] = record
            self.records.move_to_end(record.id, last=False)
            self.bytes += record.size
        self._trim()

    def take_pending(self) -> list[tuple[str, Record | None]]:
        work, self.pending = self.pending, []
        return work

    def persist(self, work: list[tuple[str, Record | None]]) -> None:
        """Write the captures ``work`` adds and remove those it drops (blocking: a thread's). A
        failure is logged, and the captures stay in memory."""
        if self.folder is None or not work:
            return
        try:
            # they hold what people sent and got: the folder and the files are the user's alone
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            for capture_id, record in work:
                path = self.folder / f"{capture_id}.json"
                if record is None:
                    path.unlink(missing_ok=True)
                    continue
                tmp = path.with_suffix(".tmp")
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
                    f.write(record.to_json())
                os.replace(tmp, path)
        except OSError as e:
            log.warning("could not keep captures in %s: %s", self.folder, e)
