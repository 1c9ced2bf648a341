"""Worker processes before their model: one spawned (``spawn``: a fresh interpreter with a pipe
each way, which readies llama.cpp and waits for its ``Load``), and one kept ready ahead of need
(``Spare``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass


class LoadFailed(Exception):
    """The worker could not load its model; the message says why."""


@dataclass
class Spawned:
    """A worker process and the gateway's ends of its pipes, before any command."""

    proc: asyncio.subprocess.Process
    cmd_w: int
    ev_r: int

    def discard(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        for fd in (self.cmd_w, self.ev_r):
            with contextlib.suppress(OSError):
                os.close(fd)


async def spawn() -> Spawned:
    """A new worker process, which readies llama.cpp and waits for its ``Load``; raises
    ``LoadFailed`` where none can start."""
    cmd_r, cmd_w = os.pipe()
    ev_r, ev_w = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.worker.worker", str(cmd_r), str(ev_w),
            pass_fds=(cmd_r, ev_w), stdin=asyncio.subprocess.DEVNULL, stdout=2,
            start_new_session=True,  # Ctrl-C in a terminal reaches the gateway, which stops workers
        )
    except OSError as e:  # cannot exec the interpreter (permissions, resources): a failed load
        for fd in (cmd_w, ev_r):
            os.close(fd)
        raise LoadFailed(f"cannot start a model worker ({sys.executable}): {e.strerror or e}") from None
    finally:
        os.close(cmd_r)
        os.close(ev_w)
    return Spawned(proc, cmd_w, ev_r)


class Spare:
    """One worker process started ahead of need, its interpreter up and llama.cpp imported
    (a few tenths of a second of a model switch), waiting for the next model to load. ``take``
    gives it (or a new process, where none is ready); ``refill`` starts the next one."""

    def __init__(self) -> None:
        self._next: asyncio.Future[Spawned] | None = None

    async def take(self) -> Spawned:
        waiting, self._next = self._next, None
        if waiting is not None:
            try:
                spawned = await waiting
            except LoadFailed:
                pass
            else:
                if spawned.proc.returncode is None:
                    return spawned
                spawned.discard()
        return await spawn()

    def refill(self) -> None:
        if self._next is None:
            self._next = asyncio.ensure_future(spawn())
            self._next.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved in take

    async def close(self) -> None:
        waiting, self._next = self._next, None
        if waiting is None:
            return
        try:
            spawned = await waiting
        except (LoadFailed, asyncio.CancelledError):
            return
        spawned.discard()
        await spawned.proc.wait()
