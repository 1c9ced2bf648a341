"""A model's slots and the requests waiting for one (``FairSlots``): the state ``fairness.py``'s
pure policy decides on, kept per model by its supervisor.

A model decodes ``slots`` requests at once (its ``parallel``; an embedding model's sequences). A
request takes a slot at once where one is free and nobody waits (no future is made: the common
case costs a comparison); else it waits, and each slot freed goes to the request ``fairness.pick``
chooses. The terms of a waiting request's key (weight, priority) are read again at each pick,
so a reload that changes them reorders the requests already waiting.

No ghost stays: a request that leaves while it waits is taken out of the queue, and one that
leaves after a slot was handed to it but before it ran gives the slot back. The virtual times
kept are those of shares with something waiting or running, or still ahead of the clock (a share
that ran more than its part lately); the rest are dropped as a share's last request ends or
leaves (one the clock passes later reads as the clock, as if dropped), and past ``MAX_SHARES``
the idle ones least ahead go, so the table stays bounded. Everything runs on the event loop;
nothing here waits but a request for its slot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from ..access.claims import Claim, Priority, Terms
from ..base.errors import ApiError
from ..models.config import ServerConfig
from . import fairness

MAX_SHARES = 4096  # virtual times kept past their shares' requests: the most ahead of the clock stay


@dataclass
class Slot:
    """One request's slot: its share, its priority and weight as let in, when, after what wait,
    and what it was charged (``fairness.admit``)."""

    share: str
    label: str
    named: bool
    priority: Priority
    weight: float
    began: float
    waited: float
    estimate: float


class Keys(Protocol):
    """What a model's slots ask of the gateway: the keys' terms and policy as in force now, and
    where each request's wait and service are told (the metrics)."""

    def terms(self, key: str) -> Terms | None:
        """A key's terms by its name as the keys in force have them; None for a key gone."""

    def max_wait(self) -> float:
        """``server.priority_max_wait``, as the running configuration has it."""

    def waited(self, model: str, slot: Slot) -> None:
        """A request of ``model`` got its slot after ``slot.waited`` seconds."""

    def served(self, model: str, slot: Slot, seconds: float) -> None:
        """A request of ``model`` gave its slot back after holding it ``seconds``."""


def in_force(keys: Keys, claim: Claim) -> Terms:
    """A request's terms as the keys in force have them: its key's now, else (no key, or a key a
    reload removed) those it was admitted with."""
    current = keys.terms(claim.key) if claim.key is not None else None
    return current or claim.terms


class Unkeyed:
    """``Keys`` where nothing is configured: no key's terms, the default policy, nothing told."""

    def terms(self, key: str) -> Terms | None:
        return None

    def max_wait(self) -> float:
        return ServerConfig.priority_max_wait

    def waited(self, model: str, slot: Slot) -> None:
        pass

    def served(self, model: str, slot: Slot, seconds: float) -> None:
        pass


@dataclass(eq=False)  # by identity: taken out of the queue as itself, never as an equal
class _Entry:
    claim: Claim
    arrived: float
    granted: asyncio.Future[Slot] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    queued: bool = True  # still counted as waiting (a request gone is left in its line, skipped when reached)


class FairSlots:
    """The requests waiting are kept in lines: one per share and priority asked (a share's
    requests are in arrival order in each, and share one key's terms), so a pick looks at each
    line's first request only, the one ``fairness.pick`` would choose of that line: a pick costs
    the shares waiting, not the requests, however many one key queues."""

    def __init__(self, model: str, slots: int, keys: Keys):
        self.model, self.slots, self._keys = model, max(1, slots), keys
        self.busy = 0
        self._lines: dict[tuple[str, Priority | None], collections.deque[_Entry]] = {}
        self._vtime: dict[str, float] = {}
        self._served: dict[str, float] = {}  # when each share in ``_vtime`` was last let in
        self._clock = 0.0
        self._mean = 1.0  # seconds a slot is held, recently: the estimate each request is charged
        self._running: dict[str, int] = {}  # requests holding a slot, by share
        self._queued: dict[str, int] = {}  # requests waiting, by share

    def terms(self, claim: Claim) -> Terms:
        return in_force(self._keys, claim)

    def _entries(self) -> list[_Entry]:
        """The requests waiting, in arrival order."""
        return sorted((e for line in self._lines.values() for e in line if e.queued), key=lambda e: e.arrived)

    def waiting(self) -> list[tuple[str, str, float]]:
        """(share label, priority, seconds waited) of each request waiting, in arrival order."""
        now = time.monotonic()
        return [(e.claim.label, e.claim.priority(self.terms(e.claim)).label, now - e.arrived) for e in self._entries()]

    def running(self) -> dict[str, int]:
        return dict(self._running)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return sum(self._queued.values())

    def make_way(self, claim: Claim, refusal: ApiError) -> bool:
        """The model's queue is full (``server.max_queue``): whether a request of ``claim`` may wait
        anyway, in the place of the newest request of the share with the most waiting, which is
        turned away with ``refusal``. Only where that share has at least two more waiting than the
        newcomer's would have: one key's flood cannot shut every other key out of a full queue,
        and two shares never take a place back and forth."""
        share, most = max(self._queued.items(), key=lambda kv: kv[1], default=("", 0))
        if most < self._queued.get(claim.share, 0) + 2:
            return False
        newest = max((e for (s, _), line in self._lines.items() if s == share for e in line
                      if e.queued and not e.granted.done()), key=lambda e: e.arrived, default=None)
        if newest is None:
            return False
        self._unqueue(newest)
        newest.granted.set_exception(refusal)
        return True

    async def take(self, claim: Claim) -> Slot:
        """A slot for a request of ``claim``, once the policy lets it in; raises what cancels the
        wait (the client left, a deadline), having left nothing behind."""
        now = time.monotonic()
        if not self._queued and self.busy < self.slots:
            slot = self._grant(claim, now, now)
            self._keys.waited(self.model, slot)
            return slot
        entry = _Entry(claim, now)
        self._lines.setdefault((claim.share, claim.asked), collections.deque()).append(entry)
        self._queued[claim.share] = self._queued.get(claim.share, 0) + 1
        if self.busy < self.slots:  # a slot free, and only requests gone before it (their tasks not yet run)
            self._dispatch()
        try:
            slot = await entry.granted
            self._keys.waited(self.model, slot)
            return slot
        except BaseException:
            if entry.granted.done() and not entry.granted.cancelled():
                self.give(entry.granted.result(), ran=False)  # handed a slot, but gone before it ran
            else:  # left while it waited: no longer counted; its line drops it when it is reached
                if entry.queued:
                    self._unqueue(entry)
                self._forget(claim.share)
                self._dispatch()
            raise

    def give(self, slot: Slot, ran: bool = True) -> None:
        """A request's slot back: its share charged what it held, the slot to the next waiting."""
        held = time.monotonic() - slot.began if ran else 0.0
        if ran:
            self._keys.served(self.model, slot, held)
        self.busy -= 1
        self._running[slot.share] -= 1
        if not self._running[slot.share]:
            del self._running[slot.share]
        if slot.share in self._vtime:
            self._vtime[slot.share] = fairness.settle(self._vtime[slot.share], slot.estimate, held, slot.weight)
        if ran:
            self._mean = fairness.mean(self._mean, held)
        self._forget(slot.share)
        self._dispatch()

    def _grant(self, claim: Claim, arrived: float, now: float) -> Slot:
        terms = self.terms(claim)
        estimate = self._mean
        self._vtime[claim.share], self._clock = fairness.admit(self._vtime.get(claim.share), self._clock,
                                                               estimate, terms.weight)
        self._served[claim.share] = now
        self.busy += 1
        self._running[claim.share] = self._running.get(claim.share, 0) + 1
        return Slot(claim.share, claim.label, claim.named, claim.priority(terms), terms.weight, now, now - arrived,
                    estimate)

    def _unqueue(self, entry: _Entry) -> None:
        entry.queued = False
        share = entry.claim.share
        self._queued[share] -= 1
        if not self._queued[share]:
            del self._queued[share]

    def _heads(self) -> list[tuple[tuple[str, Priority | None], _Entry]]:
        """Each line's first request still waiting (those gone before it dropped; empty lines too)."""
        heads = []
        for key in list(self._lines):
            line = self._lines[key]
            while line and (not line[0].queued or line[0].granted.done()):
                gone = line.popleft()
                if gone.queued:  # cancelled, its task not yet run: no longer counted
                    self._unqueue(gone)
            if line:
                heads.append((key, line[0]))
            else:
                del self._lines[key]
        return heads

    def _dispatch(self) -> None:
        while self.busy < self.slots and self._queued:
            now = time.monotonic()
            heads = self._heads()
            if not heads:
                break
            waiters = [fairness.Waiter(e.claim.share, int(e.claim.priority(self.terms(e.claim))), e.arrived)
                       for _, e in heads]
            key, entry = heads[fairness.pick(waiters, self._vtime, self._clock, now, self._keys.max_wait(),
                                             self._served)]
            self._lines[key].popleft()
            self._unqueue(entry)
            entry.granted.set_result(self._grant(entry.claim, entry.arrived, now))

    def _forget(self, share: str) -> None:
        """Drop what is kept of shares that hold nothing, wait for nothing and are not ahead of the
        clock; past ``MAX_SHARES``, of the idle shares least ahead too, down to three quarters of
        it: one sort of the table per quarter of it let in, not one per request (many clients
        without keys, each its own share, would pay a sort of the whole table each)."""
        if (share not in self._running and share not in self._queued
                and self._vtime.get(share, self._clock) <= self._clock):
            self._vtime.pop(share, None)
            self._served.pop(share, None)
        if len(self._vtime) > MAX_SHARES:
            active = set(self._running) | set(self._queued)
            idle = sorted((v, s) for s, v in self._vtime.items() if s not in active)
            for _, s in idle[: len(self._vtime) - (MAX_SHARES - MAX_SHARES // 4)]:
                del self._vtime[s]
                self._served.pop(s, None)


class Door:
    """Whether a model takes new requests: closed while a swap drains it (``Placer.make_room``,
    after another model's request waited ``server.max_swap_wait``), open again once it is
    unloaded (or the swap is given up). A request at a closed door waits for it to open."""

    def __init__(self) -> None:
        self._opened: asyncio.Event | None = None  # None: open

    @property
    def closed(self) -> bool:
        return self._opened is not None

    def close(self) -> None:
        if self._opened is None:
            self._opened = asyncio.Event()

    def open(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            opened.set()

    async def through(self, model: str, timeout: float) -> None:
        """Return once the door is open (at once where it is); 503 after ``timeout``."""
        opened = self._opened
        if opened is None:
            return
        try:
            await asyncio.wait_for(opened.wait(), timeout)
        except asyncio.TimeoutError:
            raise ApiError(f"model {model!r} is being swapped out; retry shortly", status=503, param="model",
                           code="model_loading", headers={"Retry-After": "5"}) from None


class Waits:
    """The requests waiting for a model (for its door, its load, a slot): how many, and since when."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}  # by ticket: time.monotonic() when it began to wait
        self._tickets = itertools.count()

    def __len__(self) -> int:
        return len(self._since)

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        ticket = next(self._tickets)
        self._since[ticket] = time.monotonic()
        try:
            yield
        finally:
            del self._since[ticket]

    def oldest(self) -> float | None:
        """When the longest-waiting request began to wait (``time.monotonic()``), or None."""
        return min(self._since.values(), default=None)


def queue_full(model: str, max_queue: int, pushed: bool = False) -> ApiError:
    """429 for a request the model's full queue turns away: one that came to it, or (``pushed``)
    one whose place a request of a key with fewer waiting took (``FairSlots.make_way``)."""
    why = "; yours was the newest of the key with the most waiting, and gave its place to another key's" \
        if pushed else ""
    return ApiError(f"model {model!r} already has {max_queue} request(s) waiting (server.max_queue){why}; "
                    "retry shortly", status=429, param="model", code="queue_full", headers={"Retry-After": "2"})
