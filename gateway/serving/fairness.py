"""Who goes first into a model's free slot: a pure policy over the requests waiting for one.

``pick`` chooses:
1. **Priority.** Interactive before normal before batch: batch work takes a slot only while
   nothing of a higher priority waits. A running request is never cut short for priority.
2. **Fairness among those.** Start-time fair queueing over slot time: each share (a key, or
   without keys a client address) has a virtual time, the slot-seconds it was served divided by
   its weight; the share with the least goes first, its oldest request first. A share that was
   idle starts at the virtual clock (the start of the last request let in), so idleness banks no
   credit, and a share that used the model least recently, weighted, is served next. Within a
   share, requests go in arrival order; among equals, the share let in least recently first.
3. **A share's turn, at least every ``priority_max_wait``.** A share whose request has waited
   ``server.priority_max_wait`` and that was not let in meanwhile is overdue: its oldest request
   goes first, whatever its priority and however far ahead its share is (a key of weight 0.001
   beside one of 1000 runs far ahead after one request), the share overdue longest first. Once
   let in it is overdue again only after as long again: a lower priority or a light weight is put
   off, never starved, and a busy share's backlog, however old, is never first-come order ahead
   of the others (it was let in lately: fairness decides for it as for everyone).

No request waits without bound: its share is let in at least once every ``priority_max_wait``,
give or take a slot freeing and one turn of each other overdue share; its share's requests go in
arrival order.

Why slot time and not tokens: a slot is what a waiting request waits for, and the time a request
holds one covers its prompt, its answer and its client's pace alike; tokens are unknown until the
answer ends (``max_tokens`` is only a ceiling). A request is charged an estimate when it is let
in (``admit``: the model's recent mean, so two requests let in at once by one free-up go to two
shares), corrected by what it really held when it ends (``settle``). Deficit round robin would
need a quantum in those same unknown units.

Every function here is pure: the caller (``slots.FairSlots``) keeps the state and hands it in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiter:
    """A request waiting for a slot: whose share, at what priority (smaller first), since when
    (``time.monotonic()``)."""

    share: str
    priority: int
    arrived: float


def start(vtime: float | None, clock: float) -> float:
    """A share's next request's start: its own virtual time, never behind the clock."""
    return clock if vtime is None or vtime < clock else vtime


def pick(waiters: Sequence[Waiter], vtimes: Mapping[str, float], clock: float, now: float,
         max_wait: float, served: Mapping[str, float] | None = None) -> int:
    """The index in ``waiters`` (not empty) of the request to let in next, as the module says.
    ``served``: when each share was last let in (none: never). Ties go to the share let in least
    recently, then to the earlier arrival, then to the earlier place in ``waiters``."""
    served = served or {}

    def last(w: Waiter) -> float:
        return served.get(w.share, -math.inf)

    overdue = [i for i, w in enumerate(waiters) if now - max(w.arrived, last(w)) >= max_wait]
    if overdue:
        return min(overdue, key=lambda i: (last(waiters[i]), waiters[i].arrived, i))
    top = min(w.priority for w in waiters)
    return min((i for i, w in enumerate(waiters) if w.priority == top),
               key=lambda i: (start(vtimes.get(waiters[i].share), clock), last(waiters[i]), waiters[i].arrived, i))


def admit(vtime: float | None, clock: float, estimate: float, weight: float) -> tuple[float, float]:
    """A request let in: (the share's virtual time after its estimated charge, the new clock)."""
    begun = start(vtime, clock)
    return begun + estimate / weight, max(clock, begun)


def settle(vtime: float, estimate: float, held: float, weight: float) -> float:
    """A request ended after holding its slot ``held`` seconds: its share's virtual time with the
    estimate it was charged replaced by what it held."""
    return vtime + (held - estimate) / weight


def mean(previous: float, held: float, alpha: float = 0.2) -> float:
    """The model's recent mean slot time (an exponentially weighted mean), the next estimate."""
    return previous + alpha * (held - previous)
