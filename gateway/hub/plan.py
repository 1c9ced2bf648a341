"""What a pull writes, and carrying it out: the same steps for every source.

A source (``huggingface``, ``ollama``) reads the hub's listing or manifest and returns a
``Plan``: the files to fetch (each a ``Blob``: where from, its partial and final paths, its size
and digest, the lock that keeps another process off it) and ``finish``, which makes the model
visible (the snapshot's links, the manifest) once every file is in place. ``execute`` claims
the free space for what is still missing before the first byte (``transfer.SPACE``: beside
every other pull's claim, checked again as the bytes arrive), fetches each missing file under
its lock, and calls ``finish`` last: discovery sees all of a model or none of it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import space, transfer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Blob:
    want: transfer.Want
    final: Path
    lock: Path
    digest: str  # "sha256:HEX" as Ollama shows it, or the hub's etag

    @property
    def size(self) -> int:
        return self.want.size or 0


@dataclass(frozen=True)
class Plan:
    name: str  # the canonical name pulled, as the model then answers to it
    source: str  # huggingface | ollama
    store: Path  # the store folder written into
    blobs: tuple[Blob, ...]
    finish: Callable[[], list[Path]]  # makes the model visible; the model files it made visible


Report = Callable[[str, Blob | None, int], None]  # (step, blob or None, bytes held of it)


def _held(blob: Blob) -> int:
    """What an earlier pull left of ``blob`` in its partial file."""
    return blob.want.partial.stat().st_size if blob.want.partial.exists() else 0


def missing(plan: Plan) -> int:
    """Bytes still to fetch: each file not yet in place, less what its partial file holds."""
    return sum(max(blob.size - _held(blob), 0) for blob in plan.blobs if not blob.final.exists())


def _reporter(report: Report, blob: Blob) -> transfer.Progress:
    return lambda held: report("pulling", blob, held)


def execute(plan: Plan, report: Report, cancelled: threading.Event, keep_free: int = 0) -> list[Path]:
    """Carry ``plan`` out (blocking: a pull's thread). Raises ``transfer.PullError``."""
    for blob in plan.blobs:  # nothing unbounded or unchecked is written, nor any space claimed for it
        if why := transfer.unverifiable(blob.want):
            raise transfer.Unverifiable(why)
    with space.SPACE.claim(plan.store, missing(plan), keep_free, plan.name) as claim:
        _fetch_all(plan, report, cancelled, claim)
    report("writing manifest", None, 0)
    return plan.finish()


LOCK_POLL = 0.5  # seconds between looks at the cancel while another pull holds a file's lock


@contextlib.contextmanager
def _locked(path: Path, cancelled: threading.Event, what: str) -> Iterator[None]:
    """``huggingface_hub``'s lock on a file, waited for as long as it takes, but no longer than the pull's cancel."""
    from filelock import Timeout
    from huggingface_hub.utils import WeakFileLock

    while True:
        if cancelled.is_set():
            raise transfer.Cancelled(f"{what}: cancelled")
        lock = WeakFileLock(path, timeout=LOCK_POLL)
        try:
            lock.__enter__()
        except Timeout:
            continue
        break
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def _fetch_all(plan: Plan, report: Report, cancelled: threading.Event, claim: space.Claim) -> None:
    for blob in plan.blobs:
        blob.final.parent.mkdir(parents=True, exist_ok=True)
        blob.lock.parent.mkdir(parents=True, exist_ok=True)
        if blob.final.exists():
            report("exists", blob, blob.size)
            continue
        report("waiting", blob, 0)
        # another pull of this file, in this process or another, goes first
        with _locked(blob.lock, cancelled, blob.want.name):
            if blob.final.exists():
                report("exists", blob, blob.size)
                continue
            report("starting", blob, _held(blob))  # what an earlier pull left: resumed, not fetched now
            transfer.fetch(blob.want, _reporter(report, blob), cancelled, claim)
            report("verified", blob, blob.size)
            transfer.place(blob.want.partial, blob.final)
        if blob.lock.parent == blob.final.parent:  # a lock beside the blobs (Ollama's store) goes with the partial
            blob.lock.unlink(missing_ok=True)
