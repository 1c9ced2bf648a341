"""Token usage per API key, model, wire and UTC hour, kept in SQLite (the standard library's
``sqlite3``) and written off the asyncio event loop.

The contract:

* ``record`` runs on the event loop for every request. It adds the request into a dict keyed by
  (hour, key, model, wire) under a lock held only for that dict work: O(1), no I/O, never raises.
  What waits to be written is bounded by the distinct combinations, not by the requests, even
  while the writer is stuck; past ``MAX_PENDING`` combinations a new model name is counted under
  ``OTHER`` (the key's totals, which budgets read, stay exact).
* One daemon thread owns the connection. Every ``flush_seconds``, and before each query, it swaps
  that dict out and writes it in ONE transaction of upserts that add. ``query``, ``spent_since``
  and ``last_used`` are jobs on that same thread, so a query sees every ``record`` made before it
  was called, and the event loop never touches sqlite.
* Rows are per UTC hour: ``hour`` is the epoch second its hour starts. ``since`` and ``until``
  select hour buckets: a row counts where floor_hour(since) <= hour < until.
* Retention: at start and then about once an hour, rows of hours that start before
  floor_hour(now) - keep_days days are deleted; ``keep_days=0`` keeps the current hour only.
  ``last_use`` (one row per key name, what ``gguf-gateway keys list`` shows) is not pruned: a key
  unused for longer than the retention still shows when it was last used.
* The file: WAL (the command line reads it while the gateway writes), ``synchronous=NORMAL``
  (a power cut may lose the last flush, never the file), made with mode 0600 where new (it names
  the keys), its folder made where missing.
* Failure: a file that is not a database, a file or folder that cannot be read or written, a
  full disk, a folder that cannot be made. None of it raises out of ``start``, ``record`` or
  ``query``: the store logs ONE error naming the file and the reason, ``status`` says it, and it
  goes on in an in-memory database of the same schema (answers then cover what was recorded since;
  the rows whose write failed are kept). Another process's lock (SQLITE_BUSY past the busy
  timeout) is not a failure: the rows wait for the next flush (a query meanwhile answers from
  what is written).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..models.config import MEMORY

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1  # PRAGMA user_version: a newer file is left alone, not rewritten
HOUR, DAY = 3600, 86400
MAX_TEXT = 256  # key, model and wire come from outside: what a row keeps of each
MAX_PENDING = 50_000  # distinct combinations waiting to be written before new model names fold into OTHER
OTHER = "(other)"
BUSY_SECONDS = 5.0  # how long a statement waits on another process's lock
PRUNE_SECONDS = HOUR
GROUPS = ("day", "hour")

T = TypeVar("T")
Combination = tuple[int, str, str, str]  # (hour, key, model, wire)
Job = tuple[Callable[[sqlite3.Connection], Any], "Future[Any]"]

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS usage (hour INTEGER NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL,"
    " wire TEXT NOT NULL, requests INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,"
    " completion_tokens INTEGER NOT NULL, PRIMARY KEY (hour, key, model, wire)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS last_use (key TEXT PRIMARY KEY, at REAL NOT NULL)",
)
UPSERT = (
    "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (hour, key, model, wire) DO UPDATE SET"
    " requests = requests + excluded.requests, prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = completion_tokens + excluded.completion_tokens"
)
TOUCH = "INSERT INTO last_use VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET at = max(at, excluded.at)"


@dataclass(frozen=True)
class Spend:
    """One request's spending, made by the middleware on the event loop."""

    key: str  # the API key's name ("anonymous" when the gateway has no keys)
    model: str
    wire: str  # "chat", "completions", "embeddings", "messages", "responses", "ollama", "fim", "rerank"
    prompt_tokens: int
    completion_tokens: int
    at: float  # time.time() when the request ended


@dataclass(frozen=True)
class UsageRow:
    """One row of a query's answer."""

    period: str  # "2026-11-28" (group="day") or "2026-11-28T06:00Z" (group="hour"), UTC
    key: str
    model: str
    wire: str
    requests: int
    prompt_tokens: int
    completion_tokens: int

    def as_json(self) -> dict[str, Any]:
        return {"period": self.period, "key": self.key, "model": self.model, "wire": self.wire,
                "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


@dataclass(frozen=True)
class UsageStatus:
    recording: bool  # True: written to the database file; False: kept in memory only
    path: str | None  # the database file (None for MEMORY)
    reason: str | None  # why not recording, for a person; None when recording or when MEMORY was asked for


def floor_hour(at: float) -> int:
    return int(at // HOUR) * HOUR


def retention_cutoff(now: float, keep_days: int) -> int:
    """The first hour kept: rows of earlier hours are deleted (keep_days=0: the current hour only)."""
    return floor_hour(now) - max(keep_days, 0) * DAY


def _period(bucket: int, group: str) -> str:
    return time.strftime("%Y-%m-%d" if group == "day" else "%Y-%m-%dT%H:00Z", time.gmtime(bucket))


def _connect(path: Path) -> sqlite3.Connection:
    # autocommit: the transactions are the explicit BEGIN IMMEDIATE ... COMMIT of _transaction
    return sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # IMMEDIATE takes the write lock up front, so a read-only file fails here even where the
    # statements inside would change nothing
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _create_schema(conn: sqlite3.Connection) -> None:
    with _transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"its schema is version {version}, newer than this gateway's {SCHEMA_VERSION}")
        for statement in SCHEMA:
            conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _open_file(path: Path) -> sqlite3.Connection:
    for folder in (path.parent, *path.parent.parents):  # "File exists" would say little of a file in the way
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(20, f"{folder} is a file, not a folder")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with suppress(FileExistsError):
        # made here rather than by sqlite so that it is 0600 from its first byte (the WAL and
        # shared-memory files take the database file's mode)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    conn = _connect(path)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        _create_schema(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _open_memory() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    _create_schema(conn)
    return conn


def _write(conn: sqlite3.Connection, pending: dict[Combination, list[int]], last: dict[str, float]) -> None:
    with _transaction(conn):
        conn.executemany(UPSERT, [(*combination, *sums) for combination, sums in pending.items()])
        conn.executemany(TOUCH, list(last.items()))


def _prune(conn: sqlite3.Connection, cutoff: int) -> None:
    with _transaction(conn):
        conn.execute("DELETE FROM usage WHERE hour < ?", (cutoff,))


def _busy(exc: sqlite3.Error) -> bool:
    """Another process holds the lock: worth waiting out, not a reason to leave the file."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11 on
    if isinstance(code, int):
        return (code & 0xFF) in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED and their extended codes
    return "locked" in str(exc) or "busy" in str(exc)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror  # "Not a directory", without the errno and the path again
    return str(exc) or type(exc).__name__


def _add(into: dict[Combination, list[int]], combination: Combination, requests: int, prompt: int,
         completion: int) -> None:
    sums = into.get(combination)
    if sums is None:
        into[combination] = [requests, prompt, completion]
    else:
        sums[0] += requests
        sums[1] += prompt
        sums[2] += completion


class UsageStore:
    """See the module's docstring. Use: ``start()``, ``record()`` per request, ``await close()``."""

    def __init__(self, path: Path, keep_days: int, *, flush_seconds: float = 1.0):
        self.path = path
        self.keep_days = keep_days
        self.flush_seconds = flush_seconds
        # guards _pending, _last, _thread and _closing; held for dict work only, never for I/O
        self._lock = threading.Lock()
        self._pending: dict[Combination, list[int]] = {}  # -> [requests, prompt_tokens, completion_tokens]
        self._last: dict[str, float] = {}
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()  # None: stop
        self._thread: threading.Thread | None = None
        self._closing: Future[None] | None = None  # set once close() was called (or the thread ended)
        self._conn: sqlite3.Connection | None = None  # the writer thread's alone
        self._on_file = False
        self._warned: set[str] = set()  # warnings given once per store, not once per request
        memory = path == MEMORY
        self._status = UsageStatus(recording=not memory, path=None if memory else str(path), reason=None)

    @property
    def status(self) -> UsageStatus:
        """Settled once the writer has opened the database: after start(), any awaited query."""
        return self._status

    def start(self) -> None:
        """Start the writer thread, which opens the database itself. A second call does nothing."""
        with self._lock:
            if self._thread is not None or self._closing is not None:
                return
            self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
            self._thread.start()

    def record(self, spend: Spend) -> None:
        """Count one request. On the event loop: O(1), no I/O, never raises."""
        try:
            at = float(spend.at)
            combination = (floor_hour(at), spend.key[:MAX_TEXT], spend.model[:MAX_TEXT], spend.wire[:MAX_TEXT])
            prompt, completion = int(spend.prompt_tokens), int(spend.completion_tokens)
        except (TypeError, ValueError, OverflowError, AttributeError):
            self._warn_once("spend", "usage: a request's spending could not be counted: %r", spend)
            return
        with self._lock:
            if combination not in self._pending and len(self._pending) >= MAX_PENDING:
                combination = (combination[0], combination[1], OTHER, combination[3])
            _add(self._pending, combination, 1, prompt, completion)
            key = combination[1]
            if at > self._last.get(key, -math.inf):
                self._last[key] = at

    async def query(self, *, keys: Collection[str] | None = None, model: str | None = None,
                    wire: str | None = None, since: float | None = None, until: float | None = None,
                    group: str = "day") -> list[UsageRow]:
        """The rows per period (UTC day or hour), key, model and wire, in that order. ``keys``
        None: every key; empty: none. ``until`` is exclusive."""
        if group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, not {group!r}")
        where: list[str] = []
        args: list[Any] = []
        if keys is not None:
            names = sorted({k[:MAX_TEXT] for k in ([keys] if isinstance(keys, str) else keys)})
            if not names:
                return []
            where.append(f"key IN ({', '.join('?' * len(names))})")
            args += names
        for column, value in (("model", model), ("wire", wire)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value[:MAX_TEXT])
        if since is not None:
            where.append("hour >= ?")
            args.append(floor_hour(since))
        if until is not None:
            where.append("hour < ?")
            args.append(until)
        bucket = "hour" if group == "hour" else f"hour - hour % {DAY}"
        sql = (f"SELECT {bucket} AS bucket, key, model, wire, SUM(requests), SUM(prompt_tokens),"
               f" SUM(completion_tokens) FROM usage {'WHERE ' + ' AND '.join(where) if where else ''}"
               " GROUP BY bucket, key, model, wire ORDER BY bucket, key, model, wire")
        rows = await self._submit(lambda conn: conn.execute(sql, args).fetchall())
        return [UsageRow(_period(b, group), k, m, w, r, p, c) for b, k, m, w, r, p, c in rows]

    async def spent_since(self, since: dict[str, float]) -> dict[str, int]:
        """Per key name asked: prompt + completion tokens in the hours from floor_hour(since[key]) on
        (0 where none), to restore budgets at start."""
        asked = [(name, name[:MAX_TEXT], floor_hour(at)) for name, at in since.items()]

        def work(conn: sqlite3.Connection) -> dict[str, int]:
            sql = "SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage WHERE key = ? AND hour >= ?"
            return {name: int(conn.execute(sql, (stored, hour)).fetchone()[0]) for name, stored, hour in asked}

        return await self._submit(work)

    async def last_used(self) -> dict[str, float]:
        """Per key name: time.time() of its last recorded request."""
        return await self._submit(lambda conn: {k: float(at) for k, at in conn.execute("SELECT key, at FROM last_use")})

    async def close(self) -> None:
        """Write what is pending, stop the thread, close the connection. Idempotent; safe where
        start() was never called (what was recorded then is dropped: there was no database)."""
        with self._lock:
            if self._closing is None:
                self._closing = Future()
                if self._thread is None:
                    self._closing.set_result(None)
                else:
                    self._jobs.put(None)
            closing = self._closing
        # shielded: a cancelled close must not cancel the future the writer resolves
        await asyncio.shield(asyncio.wrap_future(closing))

    async def _submit(self, work: Callable[[sqlite3.Connection], T]) -> T:
        future: Future[T] = Future()
        with self._lock:  # under the lock: no job is queued behind the stop, where none would run it
            if self._thread is None or self._closing is not None:
                raise RuntimeError("the usage store is not running (start() was not called, or it was closed)")
            self._jobs.put((work, future))
        return await asyncio.wrap_future(future)

    # the writer thread

    def _run(self) -> None:
        try:
            self._open()
            self._prune()
            next_prune = time.monotonic() + PRUNE_SECONDS
            while True:
                try:
                    job = self._jobs.get(timeout=self.flush_seconds)
                    stop = job is None
                except queue.Empty:  # no job: the timer ran out, time to flush
                    job, stop = None, False
                self._flush()
                if stop:
                    break
                if job is not None:
                    self._do(job)
                if time.monotonic() >= next_prune:
                    self._prune()
                    next_prune = time.monotonic() + PRUNE_SECONDS
        except Exception:  # a bug: still end cleanly, so that no query or close() waits forever
            log.exception("usage: the writer thread failed")
        finally:
            self._finish()

    def _open(self) -> None:
        if self.path == MEMORY:
            self._conn = _open_memory()
            return
        try:
            self._conn = _open_file(self.path)
            self._on_file = True
        except Exception as exc:  # sqlite3.Error, OSError, and anything else a strange path makes
            self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        reason = f"cannot write {self.path}: {_describe(exc)}"
        log.error("usage: %s; usage is kept in memory only from now on, until the gateway restarts", reason)
        old, self._conn, self._on_file = self._conn, _open_memory(), False
        if old is not None:
            with suppress(sqlite3.Error):
                old.close()
        self._status = UsageStatus(recording=False, path=str(self.path), reason=reason)

    def _guard(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` on the connection; where the file fails it, again on the in-memory database."""
        assert self._conn is not None
        try:
            return work(self._conn)
        except sqlite3.Error as exc:
            if not self._on_file or _busy(exc):
                raise
            self._fall_back(exc)
            return work(self._conn)

    def _flush(self) -> None:
        with self._lock:
            if not self._pending and not self._last:
                return
            pending, self._pending = self._pending, {}
            last, self._last = self._last, {}
        try:
            self._guard(lambda conn: _write(conn, pending, last))
        except sqlite3.Error as exc:
            if not _busy(exc):
                log.exception("usage: %d rows could not be written, and are dropped", len(pending))
                return
            self._warn_once("busy", "usage: %s is locked by another process; the rows wait for the next flush",
                            self.path)
            with self._lock:  # back in, added to what came meanwhile
                for combination, (requests, prompt, completion) in pending.items():
                    _add(self._pending, combination, requests, prompt, completion)
                for key, at in last.items():
                    if at > self._last.get(key, -math.inf):
                        self._last[key] = at

    def _prune(self) -> None:
        cutoff = retention_cutoff(time.time(), self.keep_days)
        try:
            self._guard(lambda conn: _prune(conn, cutoff))
        except sqlite3.Error as exc:  # busy: the next hour's try deletes them
            log.warning("usage: old rows of %s could not be deleted: %s", self.path, exc)

    def _do(self, job: Job) -> None:
        work, future = job
        if not future.set_running_or_notify_cancel():
            return  # its caller went away
        try:
            future.set_result(self._guard(work))
        except Exception as exc:
            future.set_exception(exc)

    def _finish(self) -> None:
        with self._lock:
            if self._closing is None:  # the thread failed: later calls answer at once
                self._closing = Future()
            closing = self._closing
        with suppress(Exception):
            self._flush()
        while True:  # jobs queued before the stop was seen (only where the thread failed)
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job and job[1].set_running_or_notify_cancel():
                job[1].set_exception(RuntimeError("the usage store was closed"))
        if self._conn is not None:
            with suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        if closing.set_running_or_notify_cancel():
            closing.set_result(None)

    def _warn_once(self, what: str, message: str, *args: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, *args)


def read_last_used(path: Path) -> dict[str, float]:
    """Per key name, time.time() of its last recorded request, read synchronously for the command
    line. The file is opened read-only (the gateway may be writing it); {} when it is missing or
    cannot be read."""
    if path == MEMORY or not path.is_file():
        return {}  # mode=ro would not make it, but skip the attempt
    try:
        uri = path.resolve().as_uri() + "?mode=ro"
        with closing(sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS)) as conn:
            return {str(key): float(at) for key, at in conn.execute("SELECT key, at FROM last_use")}
    except (sqlite3.Error, OSError, ValueError):
        return {}
