"""The pulls a gateway runs: one per model name, shared by every caller who asks for it.

``Pulls.start`` parses a name (``names.parse``: its candidates, tried in order), and either joins
the pull of that name already running or starts one: a thread plans it (the hub's listing or the
registry's manifest) and carries the plan out (``plan.execute``), reporting each file's bytes.
Every caller watches the same ``Pull``: ``watch`` yields its progress as it changes, so two
callers of one model share one download and its progress, and a caller who leaves does not stop
it. ``cancel`` stops it at once, whatever read it is in (``transfer.Stop``; the partial files
stay, and the next pull resumes from them), and ``close`` waits for the pulls it stops no longer
than ``CLOSE_SECONDS``.

On demand (``on_demand``), a name is pulled only from the registries
``server.pull_on_demand_hosts`` names, matched whole: a candidate on any other host is
dropped before anything is asked, so a request never chooses where the gateway connects.

What is kept to show is bounded: ``MAX_FINISHED`` finished pulls, each error's message
(``transfer.PullError``), and ``MAX_FILES_SHOWN`` files of a pull (``file_count`` counts them all).

A pull's state moves only through ``Pull.move``, along ``MOVES``. Progress is coalesced: the
thread tells the loop at most every ``REPORT_EVERY`` seconds, and at each step.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import ApiError
from ..models import discovery
from ..models.config import ServerConfig
from ..models.discovery import HF_HOSTS
from . import huggingface, ollama, transfer
from .names import OLLAMA_REGISTRY, BadName, HFName, HubName, parse
from .plan import Blob, Plan, execute

log = logging.getLogger(__name__)

REPORT_EVERY = 0.1  # seconds between progress reports from a pull's thread
RATE_WINDOW = 5.0  # seconds of progress the speed is measured over
MAX_FINISHED = 32  # finished pulls kept to show (failed ones with their reason)
MAX_FILES_SHOWN = 64  # a pull's files listed in /models and the page; a split model may have far more
MAX_FINISHED_FILES = 8  # ... once it has finished
CLOSE_SECONDS = 5.0  # at shutdown, how long the stopped pulls' threads are waited for
ON_DEMAND_HOSTS = ("hf.co", OLLAMA_REGISTRY)  # server.pull_on_demand_hosts' default
ON_DEMAND_HF = frozenset(HF_HOSTS)  # the name that stands for the Hugging Face hub among the on-demand hosts


def on_demand_candidates(name: str, prefixes: tuple[str, ...],
                         hosts: tuple[str, ...] = ON_DEMAND_HOSTS) -> tuple[HubName, ...]:
    """What a request naming ``name`` may pull on demand (pure): nothing unless it reads as a
    hub's name and starts with one of ``server.pull_on_demand``'s prefixes (``("",)``: any
    name), case-insensitively; then those of its candidates whose registry is one of ``hosts``
    (``server.pull_on_demand_hosts``), matched whole: a Hugging Face name where ``hf.co`` (or
    ``huggingface.co``) is one, the hub being the one ``HF_ENDPOINT`` names, and an Ollama
    name where its registry's ``HOST[:PORT]`` is one."""
    key = name.strip().lower()
    if not any(key.startswith(p) for p in prefixes):
        return ()
    try:
        candidates = parse(name)
    except BadName:
        return ()
    allowed = {h.lower() for h in hosts}
    hf = bool(allowed & ON_DEMAND_HF)
    return tuple(c for c in candidates if (hf if isinstance(c, HFName) else c.host.lower() in allowed))


def on_demand(name: str, prefixes: tuple[str, ...], hosts: tuple[str, ...] = ON_DEMAND_HOSTS) -> bool:
    """Whether a request naming ``name`` may pull it on demand (``on_demand_candidates``)."""
    return bool(on_demand_candidates(name, prefixes, hosts))


class PullState(enum.Enum):
    PLANNING = "planning"  # reading the listing or manifest
    DOWNLOADING = "downloading"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


MOVES = {
    PullState.PLANNING: {PullState.DOWNLOADING, PullState.FAILED, PullState.CANCELLED},
    PullState.DOWNLOADING: {PullState.DONE, PullState.FAILED, PullState.CANCELLED},
}
FINISHED = frozenset({PullState.DONE, PullState.FAILED, PullState.CANCELLED})


@dataclass
class FileProgress:
    digest: str
    name: str
    total: int
    completed: int = 0


@dataclass(frozen=True)
class Stores:
    """Where pulls write: the stores discovery reads (``None``: that source cannot be pulled to)."""

    huggingface: Path | None
    ollama: Path | None
    keep_free: int = 0  # bytes a pull leaves free on the disk


@dataclass
class Pull:
    key: str  # the name as first asked for, normalized: callers of one key share the pull
    asked: str
    insecure: bool
    state: PullState = PullState.PLANNING
    step: str = "pulling manifest"
    name: str = ""  # the canonical name, once planned
    source: str = ""
    files: dict[str, FileProgress] = field(default_factory=dict)
    current: str | None = None  # the digest being fetched
    steps: list[str] = field(default_factory=list)  # the steps besides fetching it has passed, each once
    error: transfer.PullError | None = None
    paths: list[Path] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    cancelled: transfer.Stop = field(default_factory=transfer.Stop)
    _samples: list[tuple[float, int]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    version: int = 0

    def move(self, to: PullState) -> None:
        """The one place a pull's state changes."""
        if to not in MOVES.get(self.state, ()):
            raise RuntimeError(f"pull {self.key}: {self.state.value} -> {to.value} is not a move")
        self.state = to
        self.touch()

    def touch(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def total(self) -> int:
        return sum(f.total for f in self.files.values())

    @property
    def completed(self) -> int:
        return sum(f.completed for f in self.files.values())

    def rate(self) -> float:
        """Bytes per second over the last ``RATE_WINDOW`` seconds."""
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def at(self, step: str) -> None:
        """The step it is at; one besides fetching is kept in ``steps`` too, so that a watcher
        that wakes after the next file began still tells it."""
        self.step = step
        if step not in ("pulling", "success", "error", "cancelled") and step not in self.steps:
            self.steps.append(step)

    def restart_rate(self) -> None:
        self._samples.clear()

    def _sample(self) -> None:
        now = time.monotonic()
        self._samples.append((now, self.completed))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_WINDOW:
            self._samples.pop(0)

    def eta(self, rate: float) -> float | None:
        """Seconds left at ``rate`` bytes a second, where it is known."""
        left = self.total - self.completed
        return round(left / rate, 1) if rate > 0 and left > 0 else None

    def describe(self) -> dict:
        """The pull as ``GET /models`` and the page show it."""
        rate = self.rate()
        out: dict[str, Any] = {
               "name": self.name or self.asked, "asked": self.asked, "state": self.state.value, "step": self.step,
               "source": self.source, "total": self.total, "completed": self.completed,
               "bytes_per_second": round(rate), "eta_seconds": self.eta(rate),
               "files": [{"digest": f.digest, "name": f.name, "total": f.total, "completed": f.completed}
                         for f in list(self.files.values())[: MAX_FINISHED_FILES if self.state in FINISHED
                                                            else MAX_FILES_SHOWN]],
               "file_count": len(self.files)}
        if self.error is not None:
            out["error"] = {"message": str(self.error), "code": self.error.code, "status": self.error.status}
        return out


def stores_for(server: ServerConfig) -> Stores:
    """Where pulls write: the Hugging Face cache and the Ollama store that discovery reads
    (``$OLLAMA_MODELS`` where set, else the first of Ollama's stores that exists)."""
    roots = discovery.roots_for(server.models_dirs, server.discover_default_stores)
    hf = next((r.path for r in roots if r.kind == "huggingface"), None)
    ollama_roots = [r.path for r in roots if r.kind == "ollama"]
    return Stores(hf, next((p for p in ollama_roots if p.is_dir()), ollama_roots[0] if ollama_roots else None),
                  server.pull_keep_free_bytes)


class Pulls:
    """The gateway's pulls. ``refresh`` is awaited once a pull's files are in place (the catalog
    rescans), before the pull counts as done."""

    def __init__(self, stores: Callable[[], Stores], *, refresh: Callable[[], Awaitable[None]] | None = None,
                 on_bytes: Callable[[str, int], None] | None = None,
                 on_outcome: Callable[[str, str], None] | None = None):
        self._stores = stores
        self._refresh = refresh
        # the metrics, where an app serves these pulls: bytes fetched by source, pulls by outcome
        self.on_bytes = on_bytes or (lambda source, n: None)
        self.on_outcome = on_outcome or (lambda source, outcome: None)
        self.active: dict[str, Pull] = {}
        self.finished: dict[str, Pull] = {}
        self._tasks: set[asyncio.Task] = set()

    def start(self, asked: str, *, insecure: bool = False) -> Pull:
        """The pull of ``asked``: the one running, or a new one. Raises ``transfer.BadPullName``."""
        try:
            candidates = parse(asked)
        except BadName as exc:
            raise transfer.BadPullName(str(exc)) from None
        return self._start(asked, candidates, insecure)

    def _start(self, asked: str, candidates: tuple[HubName, ...], insecure: bool) -> Pull:
        key = candidates[0].canonical.lower()
        if (pull := self.active.get(key)) is not None:
            return pull
        pull = Pull(key, asked, insecure)
        pull.cancelled.what = asked
        self.active[key] = pull
        self.finished.pop(key, None)
        task = asyncio.get_running_loop().create_task(self._run(pull, candidates))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pull

    def stores(self) -> Stores:
        return self._stores()

    def find(self, asked: str) -> Pull | None:
        try:
            key = parse(asked)[0].canonical.lower()
        except BadName:
            return None
        return self.active.get(key) or self.finished.get(key)

    def cancel(self, asked: str) -> Pull | None:
        pull = self.find(asked)
        if pull is None or pull.state in FINISHED:
            return None
        pull.cancelled.set()
        return pull

    def rows(self) -> list[dict]:
        return [p.describe() for p in [*self.active.values(), *self.finished.values()]]

    async def watch(self, pull: Pull) -> AsyncIterator[Pull]:
        """``pull`` each time it changes, until it has finished (its last state included)."""
        seen = -1
        while True:
            changed = pull._changed
            if pull.version != seen:
                seen = pull.version
                yield pull
            if pull.state in FINISHED:
                return
            await changed.wait()

    async def wait(self, pull: Pull, timeout: float | None = None) -> Pull:
        async def until_done() -> Pull:
            async for _ in self.watch(pull):
                pass
            return pull
        return await asyncio.wait_for(until_done(), timeout)

    async def on_demand(self, name: str, server: ServerConfig,
                        on_progress: Callable[[float], Awaitable[None]] | None) -> None:
        """For a request naming a model no store has: where ``server.pull_on_demand`` allows the
        name (``on_demand``), pull it and wait: a streamed request (``on_progress``: told the
        share done, as a load's progress) for as long as it takes, a whole one at most
        ``server.pull_wait_seconds`` (0: no bound), then a 503 to come back. Else nothing: the
        caller's own "no such model". Only from ``server.pull_on_demand_hosts``' registries,
        over https: nothing is asked of a host the name alone gives."""
        candidates = on_demand_candidates(name, server.pull_on_demand, server.pull_on_demand_hosts)
        if not candidates:
            return
        wait = server.pull_wait_seconds
        pull = self._start(name, candidates, False)
        shown = -1

        async def follow() -> None:
            nonlocal shown
            async for p in self.watch(pull):
                if on_progress is not None and p.total and (done := int(100 * p.completed / p.total)) != shown:
                    shown = done
                    await on_progress(p.completed / p.total)
        try:
            await asyncio.wait_for(follow(), None if on_progress is not None or not wait else wait)
        except asyncio.TimeoutError:
            raise ApiError(f"{name!r} is still downloading ({pull.completed} of {pull.total} bytes) after "
                           f"server.pull_wait_seconds: try again later", status=503, code="model_downloading",
                           headers={"Retry-After": "30"}) from None
        if pull.error is not None:
            raise pull.error

    async def close(self) -> None:
        """Stop every pull (their reads end at once) and wait for them, at most ``CLOSE_SECONDS``."""
        for pull in self.active.values():
            pull.cancelled.set()
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=CLOSE_SECONDS)
            if pending:
                log.warning("%d pull(s) did not stop within %g s", len(pending), CLOSE_SECONDS)

    async def _run(self, pull: Pull, candidates: tuple[HubName, ...]) -> None:
        loop = asyncio.get_running_loop()
        last = [0.0]

        def report(step: str, blob: Blob | None, held: int) -> None:  # on the pull's thread
            now = time.monotonic()
            if step == "pulling" and now - last[0] < REPORT_EVERY and (blob is None or held < blob.size):
                return
            last[0] = now
            loop.call_soon_threadsafe(self._progress, pull, step, blob, held)

        try:
            plan = await asyncio.to_thread(self._plan, pull, candidates)
            pull.name, pull.source = plan.name, plan.source
            pull.files = {b.digest: FileProgress(b.digest, b.want.name, b.size) for b in plan.blobs}
            pull.move(PullState.DOWNLOADING)
            stores = self._stores()
            pull.paths = await asyncio.to_thread(execute, plan, report, pull.cancelled, stores.keep_free)
            if self._refresh is not None:
                await self._refresh()
            pull.at("success")
            pull.move(PullState.DONE)
        except transfer.PullError as exc:
            pull.error = exc
            pull.at("cancelled" if isinstance(exc, transfer.Cancelled) else "error")
            pull.move(PullState.CANCELLED if isinstance(exc, transfer.Cancelled) else PullState.FAILED)
        except Exception as exc:  # noqa: BLE001 (a pull's unforeseen failure is that pull's alone)
            log.exception("pull of %s failed", pull.asked)
            pull.error = transfer.PullError(f"{pull.asked}: {type(exc).__name__}: {exc}")
            pull.at("error")
            pull.move(PullState.FAILED)
        finally:
            self.on_outcome(pull.source or "unknown", pull.state.value if pull.state in FINISHED else "failed")
            self.active.pop(pull.key, None)
            self.finished[pull.key] = pull
            while len(self.finished) > MAX_FINISHED:
                self.finished.pop(next(iter(self.finished)))
            if pull.state is PullState.DONE:
                log.info("pulled %s (%d bytes) in %.1f s", pull.name, pull.total, time.monotonic() - pull.started)
            else:
                log.warning("pull of %s %s: %s", pull.asked, pull.state.value, pull.error)

    def _plan(self, pull: Pull, candidates: tuple[HubName, ...]) -> Plan:
        """The first candidate the hubs know (blocking). A name no hub knows is a ``NotFound``."""
        with transfer.stopping(pull.cancelled):
            return self._plan_any(pull, candidates)

    def _plan_any(self, pull: Pull, candidates: tuple[HubName, ...]) -> Plan:
        transfer.install_client()
        stores = self._stores()
        missed: list[transfer.PullError] = []
        for name in candidates:
            if pull.cancelled.is_set():
                raise transfer.Cancelled(f"{pull.asked}: cancelled")
            try:
                return self._plan_one(pull, name, stores)
            except (transfer.NotFound, transfer.Unreachable, transfer.TimedOut, transfer.Offline) as exc:
                if len(candidates) == 1:
                    raise
                missed.append(exc)
        # a name one hub does not know is unknown, though another could not be asked
        reasons = "; ".join(str(e) for e in missed)
        if any(isinstance(e, transfer.NotFound) for e in missed):
            raise transfer.NotFound(f"{pull.asked}: no hub or registry has it ({reasons})")
        raise missed[0]

    def _plan_one(self, pull: Pull, name: HubName, stores: Stores) -> Plan:
        if isinstance(name, HFName):
            if stores.huggingface is None:
                raise transfer.NoStore("no Hugging Face store to pull into (server.discover_default_stores is false)")
            return huggingface.plan(name, stores.huggingface)
        if stores.ollama is None:
            raise transfer.NoStore("no Ollama store to pull into (server.discover_default_stores is false)")
        return ollama.plan(name, stores.ollama, pull.insecure)

    def _progress(self, pull: Pull, step: str, blob: Blob | None, held: int) -> None:
        if pull.state in FINISHED:
            return
        if blob is not None and (f := pull.files.get(blob.digest)) is not None:
            grew = held - f.completed
            if grew > 0 and step == "pulling":
                self.on_bytes(pull.source, grew)
            f.completed = held
            pull.current = blob.digest
            if step in ("starting", "exists"):  # bytes already on disk are no speed of this pull
                pull.restart_rate()
        pull.at({"pulling": "pulling", "waiting": "pulling", "exists": "pulling", "starting": "pulling",
                 "verified": "verifying sha256 digest"}.get(step, step))
        pull._sample()
        pull.touch()
