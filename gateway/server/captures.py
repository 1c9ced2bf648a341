"""Captured requests (``server.capture``): each generating request as it was received and its
answer as it was sent, kept in a bounded store for ``/captures`` and the page's Requests tab.

A ``Capture`` follows one request while it runs. The observe middleware opens it before the
handler; ``api/body`` hands it the body it read (decoded, before parsing); an ``EventStream``
hands it each write of a stream with its time (``frame``); the middleware closes it with the
status, the whole answer's bytes where the answer was not a stream, and the request's
``Observation`` (model, key, timings). What it keeps is the bytes themselves, so a capture of a
stream is the stream the client read, byte for byte, each write stamped with its time.

Bounds: each body (and each stream's writes together) is kept up to ``max_body_bytes``, cut
past it and said so (``truncated``, with the size it had); a request's headers are kept up to
``MAX_HEADERS`` of them and ``MAX_HEADER_BYTES`` in all. The store holds at most ``max_bytes``,
and it counts every byte it keeps (``weight``): the headers' names and values, the bodies, each
write of a stream with its place (``ENTRY``), the ids and names, and each entry's own fields
(``OVERHEAD``). A request refused at the door (401, 403, 429: ``REFUSED``) is kept as a line
(``Refusal``: its time, status, route, key and error code), not a capture, and apart from the
captures: the newest ``MAX_REFUSALS`` lines and a count by status and key, so refusals, however
many, never take a capture's room. The store is shared
out by owner (the key that asked, ``events.OWNER``; nobody where no key was given): past the
bound, what nobody's requests left goes first, then the oldest of the owner holding the most.
So a request from nobody never pushes out a key's captures, and a key that floods the store
pushes out its own. What a capture costs the request is a slice of the body and one list append
per stream write (and a search for its secrets, where it presented any); everything else
(redaction of content, persistence, JSON) happens after the answer went out, or when a capture
is read.

Secrets never enter a capture: the headers that carry credentials are redacted, and the key the
request presented (and every key the configuration gives as itself) is cut out of every other
byte the capture keeps: header values, query, bodies, and a stream's writes as they are told,
across two writes too (``redaction.Secrets``, ``redaction.StreamCut``), in any JSON escaping.
A stream may also spell a secret in pieces, each in its own write (a model that repeats a key
says it a token at a time): when a stream with secrets to cut (the key it presented, the keys
the configuration gives) ends, its writes are read back off the event loop (``reader``:
``wire/readback``'s, given by the api layer), where ``redaction.Secrets.may_spell`` says its
text could spell one; where the joined thinking, content or a call's arguments do, the writes
are not kept: the answer read back, the secret cut, is kept in their place
(``Record.withheld``). Until that check ends the capture is listed but not shown (``checked``)
nor written to its file. What is made of a capture (its kept file, a replay, ``curl``, the
page) is made of what it kept. With
``redact_content`` the text goes too: every string of the JSON, but for the words that give its
shape (roles, types, names, finish reasons), becomes its length (``redaction``)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.config.specs import CaptureConfig
from . import redaction, shares
from .capturerecords import ENTRY, OVERHEAD, Record, Refusal
from .events import Observation, request_key

__all__ = ["CAPTURE", "FOLDER", "Capture", "CaptureStore", "Record", "Refusal", "timings"]

log = logging.getLogger(__name__)

FOLDER = "captures"  # in the state folder, where ``keep`` is on
MAX_HEADERS = 64  # of a request's headers kept, each name's and value's length, all of them together
MAX_HEADER_VALUE = 1024
MAX_HEADER_BYTES = 16 * 1024
REFUSED = frozenset({401, 403, 429})  # refused at the door: kept as a line (``Refusal``), not a capture
MAX_REFUSALS = 256  # the newest refusals' lines kept, apart from the captures
# an answer's bytes read back into its parts: ``wire/readback.read_answer``'s (route, stream, body)
Reader = Callable[[str, bool, bytes], dict[str, Any]]
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
    secrets: redaction.Secrets  # the credentials the request presented, cut out of what is kept
    limit: int  # each body's bytes kept (a stream's writes counting ``ENTRY`` each too)
    body: bytes | None = None  # the request's body as read (decoded), cut to ``limit``
    body_bytes: int = 0  # its whole size
    request_cut: bool = False
    frames: list[tuple[float, bytes]] = field(default_factory=list)  # a stream's writes: (seconds in, bytes)
    sent: int = 0  # a stream's bytes written in all
    kept: int = 0  # of them, kept (with ``ENTRY`` for each write)
    response_cut: bool = False
    cutter: redaction.StreamCut | None = None  # where there are secrets: the writes with them cut out
    last: float = 0.0  # seconds in of the last write

    def request_body(self, raw: bytes) -> None:
        self.body_bytes = len(raw)
        self.request_cut = len(raw) > self.limit
        self.body = self.secrets.bounded(raw, self.limit)

    def frame(self, data: bytes) -> None:
        """A write of the answer's stream, as it went to the client."""
        self.sent += len(data)
        self.last = time.monotonic() - self.started
        if self.secrets:
            if self.cutter is None:
                self.cutter = redaction.StreamCut(self.secrets)
            data = self.cutter.feed(data)
        self._keep(data)

    def end_stream(self) -> None:
        """The stream is over: what the secrets' cut held back is kept."""
        if self.cutter is not None:
            self._keep(self.cutter.flush())

    def _keep(self, data: bytes) -> None:
        if not data or self.response_cut:
            return
        room = self.limit - self.kept - ENTRY
        if room < len(data):
            self.response_cut = True  # nothing after it is kept: what is kept is a beginning
        if room <= 0:
            return
        kept = data[:room]
        self.kept += len(kept) + ENTRY
        self.frames.append((self.last, kept))


def _check(store: CaptureStore, record: Record, secrets: redaction.Secrets) -> None:
    """Read ``record``'s stream back off the event loop (``_spelled_secret``) and tell ``store``
    what it found; without a running loop (a caller of the store's own), here and now."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        store._checked(record, _spelled_secret(store.reader, record, secrets))
        return
    future = loop.run_in_executor(None, _spelled_secret, store.reader, record, secrets)
    done: asyncio.Future[None] = loop.create_future()
    store.checking[record.id] = done

    def settle(task: asyncio.Future[dict[str, Any] | None]) -> None:
        store.checking.pop(record.id, None)
        try:
            withheld = task.result()
        except (Exception, asyncio.CancelledError):  # a check that fails keeps no writes: they may spell one
            log.exception("a captured stream could not be read back for secrets; its writes are not kept")
            withheld = {"error": "the stream could not be read back; its writes are not kept"}
        store._checked(record, withheld)
        done.set_result(None)

    future.add_done_callback(settle)


def _spelled_secret(reader: Reader | None, record: Record, secrets: redaction.Secrets) -> dict[str, Any] | None:
    """``record``'s stream read back (``reader``), with ``secrets`` cut, where its joined
    thinking, content or a call's arguments (or its thinking and content joined) spell one;
    None where they do not (blocking: a thread's). It is read twice: as kept, and without its
    events that were cut as they were written (a Responses stream's whole text at its end, cut
    there, would otherwise stand in for the deltas that spell the secret in pieces)."""
    body = record.answer_bytes()
    if reader is None or not secrets.may_spell(body):
        return None
    answer = reader(record.route, True, body)
    uncut = b"\n".join(line for line in body.split(b"\n") if redaction.REDACTED.encode() not in line)
    for read in (answer, reader(record.route, True, uncut) if len(uncut) < len(body) else answer):
        calls = [c for c in read.get("calls", []) if isinstance(c, dict)]
        thinking, content = read.get("thinking") or "", read.get("content") or ""
        if any(secrets.found_in(t) for t in (thinking, content, thinking + content,
                                            *(str(c.get("arguments", "")) for c in calls))):
            return redaction.cut_strings(answer, secrets)
    return None


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
    """The captures kept, oldest first, and the lines of refused requests, within
    ``config.max_bytes`` (shared out by owner, as the module says); with ``keep``, each capture
    also a file in ``folder`` (written and removed by ``persist``'s caller off the event loop)."""

    def __init__(self, config: CaptureConfig, folder: Path | None = None):
        self.config = config
        self.folder = folder if config.keep else None
        self.records: OrderedDict[str, Record] = OrderedDict()
        self.refusals: OrderedDict[str, Refusal] = OrderedDict()  # the newest ``MAX_REFUSALS``
        self.refused = 0  # requests refused at the door since the start, their lines kept or not
        self.refused_by: Counter[tuple[int, str]] = Counter()  # of them, by (status, key's name)
        # reads a stream's answer back for a secret spelled in pieces; None: not checked (the api
        # layer sets it: this layer does not know the wires)
        self.reader: Reader | None = None
        self.checking: dict[str, asyncio.Future[None]] = {}  # streams being checked, by capture id
        self.bytes = 0
        # each owner's entries (None: nobody's), oldest first, with the bytes each is counted for
        self._owned: dict[str | None, OrderedDict[str, int]] = {}
        self._owned_bytes: dict[str | None, int] = {}
        self._ids = itertools.count(1)
        self._prefix = uuid.uuid4().hex[:8]  # ids of one run apart from another's kept ones
        # what ``persist`` writes (a record) or removes (None), by id, since it last ran
        self.pending: list[tuple[str, Record | None]] = []

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def begin(self, method: str, path: str, query: str, headers: Mapping[str, str], started: float,
              secrets: Iterable[str] = ()) -> Capture:
        """A request's capture; ``secrets``: keys besides the one it presented to cut out of it
        (those the configuration gives as themselves)."""
        given = redaction.presented(headers) + tuple(s.encode("utf-8", errors="replace") for s in secrets)
        cut = redaction.Secrets.of(tuple(sorted(set(given))))
        return Capture(f"{self._prefix}-{next(self._ids)}", started, time.time(), method, path,
                       cut.cut_text(query[:MAX_HEADER_VALUE + cut.longest])[:MAX_HEADER_VALUE],
                       redaction.headers(headers, MAX_HEADERS, MAX_HEADER_VALUE, max_total=MAX_HEADER_BYTES,
                                         secrets=cut),
                       cut, self.config.max_body_bytes)

    def finish(self, capture: Capture, obs: Observation, status: int, response_headers: Mapping[str, str],
               whole: bytes | None, code: str | None = None) -> Record | None:
        """The capture of a request that ended with ``status`` (``code``: its error's); ``whole``:
        its answer's body where it was not a stream. A request refused at the door is kept as
        a line (None)."""
        if status in REFUSED:
            self.refuse(Refusal(f"{self._prefix}-r{next(self._ids)}", capture.time, status, obs.endpoint,
                                obs.principal, code, obs.request_id))
            return None
        kind = response_headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        capture.end_stream()
        stream = kind in STREAM_TYPES or bool(capture.frames)
        limit, cut = capture.limit, capture.secrets
        body, frames = capture.body, capture.frames
        answer = None if stream or whole is None else cut.bounded(whole, limit)
        answer_bytes = capture.sent if stream else len(whole or b"")
        response_cut = capture.response_cut if stream else len(whole or b"") > limit
        redacted = self.config.redact_content
        if redacted:
            body = redaction.content(body, sse=False)
            answer = redaction.content(answer, sse=False)
            frames = [(t, redaction.content(b, sse=kind == "text/event-stream") or b"") for t, b in frames]
        record = Record(
            capture.id, capture.time, capture.method, capture.path, obs.endpoint, capture.query, obs.request_id,
            obs.model, obs.principal, status, capture.headers, body, capture.body_bytes,
            redaction.headers(response_headers, MAX_HEADERS, MAX_HEADER_VALUE, max_total=MAX_HEADER_BYTES,
                              secrets=cut),
            stream, answer, frames, answer_bytes, timings(obs, time.monotonic()),
            {"prompt_tokens": obs.prompt_tokens, "cached_tokens": obs.cached_tokens,
             "completion_tokens": obs.completion_tokens, "reasoning_tokens": obs.reasoning_tokens},
            obs.finish_reason, obs.trace_id, redacted, capture.request_cut, response_cut, owner=obs.owner,
            tools=[{k: v for k, v in c.items() if k != "started"} for c in obs.hosted_tool_calls])
        check = stream and not redacted and bool(cut) and bool(frames) and self.reader is not None
        self.add(record, checked=not check)
        if check and record.id in self.records:
            _check(self, record, cut)
        return record

    def add(self, record: Record, checked: bool = True) -> None:
        """Keep ``record`` (``checked``: False while its stream is read back for secrets, its
        file written once that ends)."""
        if not self._hold(record.id, record.owner, record.size):
            return
        self.records[record.id] = record
        if self.folder is not None and checked:
            self.pending.append((record.id, record))  # made into JSON by ``persist``, off the loop
        self._trim(record.owner)

    def _checked(self, record: Record, withheld: dict[str, Any] | None) -> None:
        """``record``'s check ended: where its stream spelled a secret, the answer it found is
        kept in place of the writes (``withheld``); its file is written now."""
        if withheld is not None:
            record.frames, record.withheld = [], withheld
            self._reweigh(record)
        if record.id in self.records and self.folder is not None:
            self.pending.append((record.id, record))

    async def checked(self, record: Record) -> None:
        """Once ``record``'s stream has been checked for secrets (at once where it is not being)."""
        done = self.checking.get(record.id)
        if done is not None:
            await asyncio.shield(done)

    def refuse(self, refusal: Refusal) -> None:
        """A refusal's line, kept apart from the captures: the newest ``MAX_REFUSALS`` of them,
        and counted by status and key."""
        self.refused += 1
        if len(self.refused_by) < MAX_REFUSALS or (refusal.status, refusal.key) in self.refused_by:
            self.refused_by[(refusal.status, refusal.key)] += 1
        self.refusals[refusal.id] = refusal
        while len(self.refusals) > MAX_REFUSALS:
            self.refusals.popitem(last=False)

    def _hold(self, entry_id: str, owner: str | None, size: int, first: bool = False) -> bool:
        """Count an entry in, as its owner's newest (``first``: oldest); False where it alone is
        over the bound, and not kept."""
        if size > self.config.max_bytes:
            return False
        owned = self._owned.setdefault(owner, OrderedDict())
        owned[entry_id] = size
        if first:
            owned.move_to_end(entry_id, last=False)
        self._owned_bytes[owner] = self._owned_bytes.get(owner, 0) + size
        self.bytes += size
        return True

    def _trim(self, newcomer: str | None = None) -> None:
        """Drop entries until the store is within its bound: nobody's oldest first, then the
        oldest of the owner that holds the most (on a tie, ``newcomer``'s: the owner of the entry
        just added, so that it does not push out another's as large)."""
        while self.bytes > self.config.max_bytes and self._owned:
            owner = None if None in self._owned else shares.giver(self._owned_bytes, newcomer)
            owned = self._owned[owner]
            entry_id, size = owned.popitem(last=False)
            if not owned:
                del self._owned[owner], self._owned_bytes[owner]
            else:
                self._owned_bytes[owner] -= size
            self.bytes -= size
            if self.records.pop(entry_id, None) is not None and self.folder is not None:
                self.pending.append((entry_id, None))

    def replayed(self, record: Record, of: Record) -> None:
        """``record`` is the replay of ``of``: said in it, and in its kept file."""
        record.replay_of = of.id
        if self._reweigh(record) and self.folder is not None:
            self.pending.append((record.id, record))

    def _reweigh(self, record: Record) -> bool:
        """``record`` counted again as it now is (False where the store no longer holds it)."""
        owned = self._owned.get(record.owner)
        if owned is None or record.id not in owned:
            return False
        size = record.size
        self.bytes += size - owned[record.id]
        self._owned_bytes[record.owner] += size - owned[record.id]
        owned[record.id] = size
        self._trim(record.owner)
        return record.id in self.records  # it alone may have gone, grown past the bound

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
            if record.id in self.records or not self._hold(record.id, record.owner, record.size, first=True):
                continue
            self.records[record.id] = record
            self.records.move_to_end(record.id, last=False)
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
