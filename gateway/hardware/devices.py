"""The GPUs llama.cpp sees and their free memory, as the gateway's placement counts them.

They are read by a short-lived process (``python -m gateway.worker.device_probe``): initialising a
GPU backend in the gateway's own process would hold GPU memory for as long as it runs. The
first reading tells whether there are GPUs at all; where there are none (a CPU build, or no
device), it is never read again, since a GPU does not appear while the gateway runs. Where
there are, a load that places layers on one reads them again unless a recent reading stands
(``GPU_READING_MAX_AGE``); each worker also reports its devices once its model is loaded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..protocol.topology import Device
from . import sysmem
from .sysmem import RAM

log = logging.getLogger("gguf_gateway.devices")

PROBE_TIMEOUT = 60.0  # a CUDA runtime's first start can take long on a machine with many GPUs
# A reading this recent stands for a load onto a GPU (memory the gateway's own models take or
# give back is counted apart): other programs' use of a GPU is seen this late at worst, and a
# model switch does not wait for a probe's GPU start each time.
GPU_READING_MAX_AGE = 30.0

Held = Callable[[], Mapping[str, int]]  # what the gateway's models hold by pool, asked when needed


@dataclass(frozen=True)
class Reading:
    """The GPUs at one moment, and what the gateway's models held on each then (so that the
    memory they free later is counted as free: ``capacities``)."""

    gpus: tuple[Device, ...] = ()
    held: Mapping[str, int] = field(default_factory=dict)
    at: float = 0.0


def unified(device: Device) -> bool:
    """A GPU whose memory is the system's: an integrated one, or Apple's (Metal)."""
    return device.kind == "igpu" or device.name.upper().startswith(("MTL", "METAL"))


def with_unified(by_pool: Mapping[str, int], gpus: Sequence[Device]) -> dict[str, int]:
    """``by_pool`` with what lies on a unified-memory GPU counted in RAM as well."""
    out = dict(by_pool)
    for d in gpus:
        if unified(d) and d.pool in out:
            out[RAM] = out.get(RAM, 0) + out[d.pool]
    return out


def capacities(ram: sysmem.Memory | None, held_ram: int, reading: Reading, budget: Mapping[str, int],
               reserve: Mapping[str, int]) -> dict[str, tuple[int, str]]:
    """The bytes the gateway's models may hold in each pool, and why that much: what is free
    (RAM read now, beside ``held_ram``, what the models hold now; a GPU as last read, beside
    what they held then), less ``server.memory_reserve`` for the pool, at most
    ``server.memory_budget`` for it. A pool with neither reading nor budget is not counted."""
    out: dict[str, tuple[int, str]] = {}

    def bound(pool: str, n: int, why: str) -> None:
        if pool not in out or n < out[pool][0]:
            out[pool] = (n, why)

    def reserve_of(pool: str, total: int) -> int:
        return sysmem.reserve_bytes(reserve.get(pool, reserve.get("default", sysmem.DEFAULT_RESERVE)), total)

    if ram is not None:
        kept = reserve_of(RAM, ram.total)
        bound(RAM, ram.available + held_ram - kept, f"{gib(ram.available)} of memory available beside the "
              f"{gib(held_ram)} its loaded models hold, less server.memory_reserve {gib(kept)}")
    for d in reading.gpus:
        # Metal counts allocations per process, so the probe sees none of the models': what it
        # reports free is already all that the models may hold
        held = 0 if unified(d) else reading.held.get(d.pool, 0)
        kept = reserve_of(d.pool, d.total)
        bound(d.pool, d.free + held - kept, f"{gib(d.free)} free on {d.name} ({d.description}) beside the "
              f"{gib(held)} its loaded models hold, less server.memory_reserve {gib(kept)}")
    for pool, n in budget.items():
        bound(pool, n, f"server.memory_budget {gib(n)}" + ("" if pool == RAM else f" on {pool}"))
    return out


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


class Inventory:
    """The last reading of llama.cpp's GPUs, and the means to take another."""

    def __init__(self, command: Sequence[str] | None = None):
        self.command = list(command or [sys.executable, "-m", "gateway.worker.device_probe"])
        self.last: Reading | None = None  # None: never read
        self._lock = asyncio.Lock()

    @property
    def gpus(self) -> tuple[Device, ...]:
        return self.last.gpus if self.last is not None else ()

    def describe(self) -> list[dict[str, Any]] | None:
        """The GPUs as last read, with the reading's age in seconds; None: not read yet (the
        first load of a local model reads them)."""
        if self.last is None:
            return None
        age = round(time.monotonic() - self.last.at, 1)
        return [{**d.describe(), "pool": d.pool, "read_seconds_ago": age} for d in self.last.gpus]

    async def read(self, held: Held, max_age: float | None = None) -> Reading:
        """The GPUs: read now if never read, or where there are any and the last reading is older
        than ``max_age`` seconds (None: any age will do); ``held()``: what the gateway's models
        hold on each now, asked only when a probe runs. A reading that fails counts as no GPU
        (logged)."""
        async with self._lock:
            last = self.last
            if last is None or (last.gpus and max_age is not None and time.monotonic() - last.at > max_age):
                before = held()  # what the models held as the probe began
                self.take([d.describe() for d in await self.probe() or []], lambda: before)
            assert self.last is not None
            return self.last

    def take(self, found: Sequence[Any], held: Held, partial: bool = False) -> None:
        """A reading from elsewhere (a worker reports its devices once its model is loaded:
        ``found``, as ``Device.describe`` objects; ``held()``: what the models hold now, asked
        only where there are GPUs). ``partial``: it read only some GPUs; the others keep their
        last reading."""
        try:
            gpus = tuple(d for d in map(Device.parse, found) if d.pool != RAM)
        except ValueError as e:
            log.warning("ignoring a reading of llama.cpp's devices: %s", e)
            return
        if partial:  # each GPU keeps the free memory and the models' share of the same moment
            last = self.last
            if last is None:
                return  # a part is no reading of the whole
            fresh = {d.pool: d for d in gpus}
            now = held() if fresh else {}
            self.last = Reading(tuple(fresh.get(d.pool, d) for d in last.gpus),
                                {**last.held, **{pool: now.get(pool, 0) for pool in fresh}}, last.at)
            return
        self.last = Reading(gpus, dict(held()) if gpus else {}, time.monotonic())

    async def probe(self) -> list[Device] | None:
        """Every device llama.cpp has, read now by the probe process; None (logged) where it fails."""
        try:
            proc = await asyncio.create_subprocess_exec(*self.command, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            log.warning("cannot list llama.cpp's devices (%s): GPU memory is not counted", e)
            return None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("listing llama.cpp's devices took over %.0f s: GPU memory is not counted", PROBE_TIMEOUT)
            return None
        try:
            if proc.returncode:
                raise ValueError(err.decode("utf-8", "replace").strip()[-500:] or f"exit status {proc.returncode}")
            return [Device.parse(d) for d in json.loads(out)]
        except ValueError as e:
            log.warning("cannot list llama.cpp's devices (%s): GPU memory is not counted", e)
            return None
