"""The free space pulls write into, claimed across every pull of the process.

``SPACE`` holds what each pull will still write, by disk (``Claim.left``: less each byte written,
more after a restart). A pull starts only when the disk's free space covers its own bytes, every
other pull's and the reserve (``Space.claim``, checked and taken in one step), and checks again as
its bytes arrive (``Claim.check``): two pulls never both spend one window, nor does one pull
spend a window something else has since filled.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from .errors import NoSpace


def free_bytes(folder: Path) -> int:
    """Free space where ``folder`` is (or would be: its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _short(what: str, needed: int, folder: Path, free: int, reserve: int, others: int = 0) -> str:
    return (f"{what} needs {_mib(needed)} more and {folder} has {_mib(free)} free"
            + (f", {_mib(others)} of it claimed by other pulls" if others else "")
            + (f" (keeping {_mib(reserve)} free: server.pull_keep_free_bytes)" if reserve else ""))


def _disk(folder: Path) -> int:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe.stat().st_dev


class Claim:
    """One pull's claim on a disk: the bytes it will still write (``left``, less each byte
    written, more after a restart). ``check``: the disk's free space still covers every claim
    on it and the pull's reserve; else ``NoSpace``."""

    def __init__(self, space: Space, disk: int, folder: Path, left: int, reserve: int, what: str):
        self.space, self.disk, self.folder = space, disk, folder
        self.left, self.reserve, self.what = left, reserve, what

    def wrote(self, n: int) -> None:
        with self.space.lock:
            self.left = max(self.left - n, 0)

    def check(self) -> None:
        free = free_bytes(self.folder)
        with self.space.lock:
            others = sum(c.left for c in self.space.claims.get(self.disk, ()) if c is not self)
            mine = self.left
        if mine + others + self.reserve > free:
            raise NoSpace(_short(self.what, mine, self.folder, free, self.reserve, others))

    def release(self) -> None:
        with self.space.lock:
            self.space.claims.get(self.disk, set()).discard(self)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Space:
    """What the process's pulls will still write, by disk (see the module's docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: dict[int, set[Claim]] = {}

    def claim(self, folder: Path, needed: int, reserve: int, what: str) -> Claim:
        """A claim on ``folder``'s disk for ``needed`` bytes, where its free space covers them, every
        other claim there and ``reserve``; else ``NoSpace`` before the first byte."""
        disk = _disk(folder)
        with self.lock:  # checked and taken in one step: two pulls cannot both take one window
            free = free_bytes(folder)
            others = sum(c.left for c in self.claims.get(disk, ()))
            if needed + others + reserve > free:
                raise NoSpace(_short(what, needed, folder, free, reserve, others))
            claim = Claim(self, disk, folder, needed, reserve, what)
            self.claims.setdefault(disk, set()).add(claim)
        return claim


SPACE = Space()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
