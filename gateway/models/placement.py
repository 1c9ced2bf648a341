"""Placement policy: pure functions of the state they are handed, so a test can hand them a
state and read the decision. The registry gathers the state and carries the decision out.

A loaded model's prompt cache (``Resident.cache``: its worker's saved KV states in host memory)
counts in its RAM, so ``server.memory_budget`` covers caches, but it is reclaimable: where RAM
is short, ``make_room`` has caches trimmed (``Room.TRIM``, how far by ``cache_trims``) before
it evicts a model for RAM, and a model is too large only if it would not fit with every cache
dropped (pinned models' too) and every unpinned model unloaded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..hardware.sysmem import RAM
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
    # bytes its prompt cache holds in RAM besides ``memory`` (its worker's last report): counted,
    # and reclaimable by trimming the cache without unloading the model
    cache: int = 0


class Room(Enum):
    FITS = "fits"  # load now
    TRIM = "trim"  # trim the loaded models' prompt caches as ``cache_trims`` says, then ask again
    EVICT = "evict"  # unload the named model first, then ask again
    WAIT = "wait"  # every loaded model is busy: wait for one to go idle
    NEVER = "never"  # pinned models alone fill the limit: nothing will ever make room
    TOO_LARGE = "too_large"  # the model does not fit even with every other model unloaded


def _loaded(others: Sequence[Resident]) -> list[Resident]:
    return [r for r in others if r.state in (ModelState.LOADING, ModelState.READY)]


def _held(pool: str, among: Sequence[Resident], caches: bool = True) -> int:
    """What ``among`` hold in ``pool``: their memory, and in RAM their prompt caches (``caches``)."""
    return sum(r.memory.get(pool, 0) + (r.cache if caches and pool == RAM else 0) for r in among)


def make_room(others: Sequence[Resident], limit: int, need: Mapping[str, int] | None = None,
              capacity: Mapping[str, int] | None = None) -> tuple[Room, str | None]:
    """Whether one more model, taking ``need`` bytes by pool, may load beside ``others``: under
    ``server.max_loaded_models`` (``limit``; 0: no limit), and in each pool within ``capacity``,
    the bytes the gateway's models may hold there in all (a pool it does not name is not
    counted), their prompt caches counted in RAM. Loading models count. Where RAM alone is short,
    under the limit, and trimming the loaded models' caches would make room, they are trimmed
    first (``Room.TRIM``: ``cache_trims`` says how far). Else, past a bound, the least recently
    used ready model with nothing in flight is evicted (the first of equals), among those holding
    memory (not only a cache: trimming frees that) in a pool that is short when one is; a model
    with requests in flight never is, nor a pinned one. A model that would not fit in some pool
    even with every cache dropped and every unpinned model unloaded is ``TOO_LARGE``."""
    need, capacity = need or {}, capacity or {}
    loaded = _loaded(others)
    if any(n > capacity[pool] - _held(pool, [r for r in loaded if r.pinned], caches=False)
           for pool, n in need.items() if pool in capacity):
        return Room.TOO_LARGE, None
    short = [pool for pool, n in need.items() if n and pool in capacity and _held(pool, loaded) + n > capacity[pool]]
    over_count = bool(limit) and len(loaded) >= limit
    if not short and not over_count:
        return Room.FITS, None
    if over_count and sum(r.pinned for r in loaded) >= limit:
        return Room.NEVER, None
    if not over_count and cache_trims(others, need, capacity):
        return Room.TRIM, None
    idle = [r for r in _candidates(loaded, short) if r.in_flight == 0]
    if not idle:
        return Room.WAIT, None
    return Room.EVICT, min(idle, key=lambda r: r.last_used).name


def _candidates(loaded: Sequence[Resident], short: Sequence[str]) -> list[Resident]:
    """The ready, unpinned models whose unloading would help: any, or where memory is short one
    that holds some there (unloading a model that holds nothing there would not help)."""
    ready = [r for r in loaded if r.state is ModelState.READY and not r.pinned]
    return [r for r in ready if any(r.memory.get(pool, 0) for pool in short)] if short else ready


def busy_victim(others: Sequence[Resident], need: Mapping[str, int] | None = None,
                capacity: Mapping[str, int] | None = None) -> str | None:
    """Where ``make_room`` said ``WAIT`` (every model whose unloading would help is busy): the one
    to drain for a swap that waited too long (``swap``'s ``CLOSE``), the least recently used, or None."""
    need, capacity = need or {}, capacity or {}
    loaded = _loaded(others)
    short = [pool for pool, n in need.items() if n and pool in capacity and _held(pool, loaded) + n > capacity[pool]]
    busy = [r for r in _candidates(loaded, short) if r.in_flight > 0]
    return min(busy, key=lambda r: r.last_used).name if busy else None


# --- swaps: which waiting model loads next, and when the loaded one makes room ---------------
@dataclass(frozen=True)
class Pending:
    """A model waiting for room that only an unloading gives: its name, when its longest-waiting
    request began to wait, and how many wait (``time.monotonic()``; a load without a request: its own start)."""

    name: str
    oldest: float
    count: int


def next_load(pending: Sequence[Pending], now: float, max_wait: float) -> str | None:
    """Which of the models waiting for room may make it next: one whose oldest request has waited
    ``max_wait`` first (the oldest such), else the one with the most requests waiting, then the
    oldest; None where none waits. One at a time: two loads that each unloaded a model for
    themselves would swap twice where once serves both in turn."""
    if not pending:
        return None
    overdue = [p for p in pending if now - p.oldest >= max_wait]
    if overdue:
        return min(overdue, key=lambda p: (p.oldest, p.name)).name
    return min(pending, key=lambda p: (-p.count, p.oldest, p.name)).name


class Swap(Enum):
    GO = "go"  # unload the victim now
    HOLD = "hold"  # not yet: the loaded model's clients' next requests come first
    CLOSE = "close"  # the victim is busy and the wait has lasted max_wait: it takes no new request


def swap(idle_for: float | None, waited: float, hold: float, max_wait: float) -> tuple[Swap, float]:
    """Whether a waiting model may unload the loaded one it needs room from, and in how many
    seconds the answer may change. ``idle_for``: seconds since the victim's last request ended
    (None: it has requests in flight); ``waited``: the waiting model's oldest request's wait.
    A busy victim is waited for (it keeps taking new requests) until ``max_wait``, then closed
    to new ones; an idle one goes once idle ``hold`` seconds (``server.swap_hold_seconds``), or at
    once past ``max_wait`` (``server.max_swap_wait``)."""
    due = max(0.0, max_wait - waited)
    if idle_for is None:
        return (Swap.CLOSE, 0.0) if due == 0 else (Swap.HOLD, due)
    if due == 0 or idle_for >= hold:
        return Swap.GO, 0.0
    return Swap.HOLD, min(hold - idle_for, due)


def cache_trims(others: Sequence[Resident], need: Mapping[str, int],
                capacity: Mapping[str, int]) -> dict[str, int]:
    """Where RAM is the one pool short for ``need`` (as ``make_room`` counts it) and the loaded
    models' prompt caches hold at least what it is short by: the bytes each cache to trim may
    keep, by model name. The least recently used models' caches go first (their conversations
    are the least likely to come back soon), busy and pinned models' too (a cache is trimmed
    between two decode steps; a pin keeps a model loaded, not its cache), each only as far as
    still needed. Empty where trimming caches alone would not make room (or none is needed)."""
    loaded = _loaded(others)
    short = {pool: _held(pool, loaded) + n - capacity[pool] for pool, n in need.items()
             if n and pool in capacity and _held(pool, loaded) + n > capacity[pool]}
    over = short.get(RAM, 0)
    if set(short) != {RAM} or over > sum(r.cache for r in loaded):
        return {}
    keep: dict[str, int] = {}
    for r in sorted((r for r in loaded if r.cache > 0), key=lambda r: r.last_used):
        if over <= 0:
            break
        take = min(r.cache, over)
        keep[r.name], over = r.cache - take, over - take
    return keep


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
