"""Placement policy: pure functions of the state they are handed, so a test can hand them a
state and read the decision. The registry gathers the state and carries the decision out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from .lifecycle import ModelState


@dataclass(frozen=True)
class Resident:
    """A model that holds memory, or is about to: what placement needs to know of it."""

    name: str
    state: ModelState
    in_flight: int = 0
    last_used: float = 0.0
    pinned: bool = False  # models.yaml ``pin: true``: never evicted
    # bytes it holds (or will, while loading) by pool (``memory.RAM``, ``cuda0``, ...): what
    # llama.cpp allocated, else the estimate
    memory: Mapping[str, int] = field(default_factory=dict)


class Room(Enum):
    FITS = "fits"  # load now
    EVICT = "evict"  # unload the named model first, then ask again
    WAIT = "wait"  # every loaded model is busy: wait for one to go idle
    NEVER = "never"  # pinned models alone fill the limit: nothing will ever make room
    TOO_LARGE = "too_large"  # the model does not fit even with every other model unloaded


def make_room(others: Sequence[Resident], limit: int, need: Mapping[str, int] | None = None,
              capacity: Mapping[str, int] | None = None) -> tuple[Room, str | None]:
    """Whether one more model, taking ``need`` bytes by pool, may load beside ``others``: under
    ``server.max_loaded_models`` (``limit``; 0: no limit), and in each pool within ``capacity``,
    the bytes the gateway's models may hold there in all (a pool it does not name is not
    counted). Loading models count. Past a bound, the least recently used ready model with
    nothing in flight is evicted (the first of equals), among those holding memory in a pool
    that is short when one is; a model with requests in flight never is, nor a pinned one. A
    model that would not fit in some pool even with every unpinned model unloaded is ``TOO_LARGE``."""
    need, capacity = need or {}, capacity or {}
    loaded = [r for r in others if r.state in (ModelState.LOADING, ModelState.READY)]

    def held(pool: str, among: Sequence[Resident]) -> int:
        return sum(r.memory.get(pool, 0) for r in among)

    if any(n > capacity[pool] - held(pool, [r for r in loaded if r.pinned])
           for pool, n in need.items() if pool in capacity):
        return Room.TOO_LARGE, None
    short = [pool for pool, n in need.items() if n and pool in capacity and held(pool, loaded) + n > capacity[pool]]
    over_count = bool(limit) and len(loaded) >= limit
    if not short and not over_count:
        return Room.FITS, None
    if over_count and sum(r.pinned for r in loaded) >= limit:
        return Room.NEVER, None
    idle = [r for r in loaded if r.state is ModelState.READY and r.in_flight == 0 and not r.pinned]
    if short:  # unloading a model that holds nothing where memory is short would not help
        idle = [r for r in idle if any(r.memory.get(pool, 0) for pool in short)]
    if not idle:
        return Room.WAIT, None
    return Room.EVICT, min(idle, key=lambda r: r.last_used).name


def cpu_shares(busy: Sequence[tuple[str, int | None]], cpus: int) -> dict[str, int]:
    """Threads for each busy model, from (name, its configured n_threads or None): the CPUs
    split evenly among them, at least one each, never more than a model is configured for.
    llama.cpp's threads spin while they wait for each other, so two models each using every
    core slow each other down badly (scripts/load.py: 13 requests/s with 2 threads each on 2
    cores, 930 with 1)."""
    if not busy:
        return {}
    share = max(1, cpus // len(busy))
    return {name: min(share, n_threads or share) for name, n_threads in busy}


def backoff(failures: int, first: float, most: float) -> float:
    """Seconds to wait after ``failures`` failures in a row before trying again: ``first``,
    doubling with each further failure, never more than ``most``."""
    return min(first * 2 ** (failures - 1), most)


@dataclass(frozen=True)
class Replica:
    """One backend of a model with replicas: what choosing among them needs to know."""

    name: str
    ready: bool  # running, and not in an upstream's back-off
    in_flight: int = 0
    capacity: int = 1  # requests it answers at once (its ``parallel``)


def replica_order(replicas: Sequence[Replica]) -> list[str]:
    """The replicas to try for one request, best first: the ready ones by free capacity (free
    slots, or fewest waiting past their slots), then fewest in flight; equals keep the
    configured order. A replica that fails before answering passes the request to the next."""
    ready = [r for r in replicas if r.ready]
    return [r.name for r in sorted(ready, key=lambda r: (r.in_flight - r.capacity, r.in_flight))]
