"""Per-key rate limits and token budgets, like LiteLLM's virtual keys.

A key may carry four limits (``Limits``):

- ``rpm``: requests admitted in the last 60 s (a sliding window, exact to the admission);
- ``tpm``: tokens (prompt plus generated) charged in the last 60 s (a sliding window kept in
  per-second buckets: a charge made at ``t`` leaves the window at ``floor(t) + 60``);
- ``max_parallel``: requests admitted and not yet released;
- ``budget``: tokens per ``budget_period``, a UTC calendar period: a day from 00:00 UTC, a week
  from Monday 00:00 UTC, a month from the 1st 00:00 UTC.

The contract:

- ``Limiter.admit`` is a plain function (no await), and the gateway runs on one asyncio event
  loop, so its check-and-take is atomic: concurrent requests of one key never get more tickets
  than ``rpm`` in a window or ``max_parallel`` at once. No locks are needed, and none are taken.
- It checks max_parallel, rpm, tpm, then budget; the first one reached is the ``Refusal``, and a
  refusal takes nothing. An admitted request counts in flight and in the rpm window at once.
- A request's tokens are all known only once it ends, however it ends (an answer, an error,
  a client that left: ``api/access``), so tpm and the budget are checked BEFORE a request
  (refused when the tokens already charged reach the limit) and charged AFTER it
  (``Limiter.release``). One answer may therefore run past either limit by its own size, and
  at most ``max_parallel`` answers can overlap that way; the next request is then refused.
- A charge lands in the budget period that ``release``'s ``now`` falls in; the spent count
  starts again from 0 when a new period starts. ``Limiter.restore`` gives back, at start, what
  the usage store says was spent in the current period, so a restart keeps a budget spent.
- Memory is bounded whatever the traffic: per key, the rpm window holds at most ``rpm`` times
  (a refused request is not added), the tpm window at most 60 buckets, and a key unused for a
  minute holds at most its budget counter (a sweep once a minute drops the empty windows).
  ``Limiter.forget`` drops the keys a reload revoked.

Every time is passed in (``now``, epoch seconds), so the policies are testable without sleeping.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

WINDOW = 60.0  # seconds of the rpm and tpm windows


class Limit(Enum):
    RPM = "rpm"
    TPM = "tpm"
    MAX_PARALLEL = "max_parallel"
    BUDGET = "budget"


class Period(Enum):
    DAY = "day"
    WEEK = "week"
    MONTH = "month"


@dataclass(frozen=True)
class Limits:
    """A key's limits; None is no limit. Each one set is a whole number of 1 or more."""

    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget: int | None = None
    budget_period: Period = Period.MONTH

    def __post_init__(self) -> None:
        # A 0 or a negative limit would refuse every request with no time after which a retry
        # could succeed; a key that may not ask is a key to remove, so such a value is an error.
        for limit in Limit:
            value = getattr(self, limit.value)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{limit.value} must be a whole number of 1 or more, not {value!r}")
        if not isinstance(self.budget_period, Period):
            raise ValueError(f"budget_period must be a Period, not {self.budget_period!r}")

    @property
    def any(self) -> bool:
        return any(getattr(self, limit.value) is not None for limit in Limit)


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused. ``retry_after`` is the exact wait in seconds; ``seconds`` is
    what a Retry-After header says (whole seconds, rounded up, at least 1)."""

    limit: Limit
    retry_after: float
    message: str

    @property
    def seconds(self) -> int:
        return wait_seconds(self.retry_after)


@dataclass
class Ticket:
    """One admitted request, handed back to ``Limiter.release`` once its tokens are known. It
    carries the limits it was admitted under: those say which windows its tokens are charged to."""

    name: str
    limits: Limits = field(default_factory=Limits)
    at: float = 0.0  # when it was admitted
    released: bool = False


# ---- pure: calendar periods and the decision given the windows ----

def _utc(now: float) -> datetime:
    return datetime.fromtimestamp(now, timezone.utc)


def iso(when: float) -> str:
    """Epoch seconds as ISO-8601 UTC, to the second: ``2026-12-01T00:00:00Z``."""
    return _utc(when).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_seconds(retry_after: float) -> int:
    """Whole seconds to wait, as a header and a message give them: rounded up, at least 1."""
    return max(1, math.ceil(retry_after))


def _start(period: Period, now: float) -> datetime:
    day = _utc(now).replace(hour=0, minute=0, second=0, microsecond=0)
    if period is Period.DAY:
        return day
    if period is Period.WEEK:
        return day - timedelta(days=day.weekday())  # weekday(): Monday is 0
    return day.replace(day=1)


def period_start(period: Period, now: float) -> float:
    """The start (epoch seconds) of the UTC calendar period that ``now`` falls in."""
    return _start(period, now).timestamp()


def period_end(period: Period, now: float) -> float:
    """The start of the period after the one ``now`` falls in."""
    start = _start(period, now)
    if period is Period.DAY:
        return (start + timedelta(days=1)).timestamp()
    if period is Period.WEEK:
        return (start + timedelta(days=7)).timestamp()
    # timedelta has no months: the 1st of the next month, December rolling into January
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start.replace(year=year, month=month).timestamp()


Buckets = deque[tuple[int, int]]  # (whole second, tokens charged in it), oldest first


def _second_leaves(second: int) -> float:
    return second + WINDOW


def requests_in_window(admitted: Collection[float], now: float) -> int:
    return sum(1 for t in admitted if t > now - WINDOW)


def tokens_in_window(buckets: Buckets, now: float) -> int:
    return sum(n for second, n in buckets if _second_leaves(second) > now)


def rpm_wait(admitted: deque[float], rpm: int, now: float) -> float | None:
    """None when one more request fits in the rpm window (``admitted``: the admission times
    still in the window, oldest first); otherwise the seconds until it does: the admission
    whose leaving brings the count under ``rpm`` (the oldest, unless a reload lowered rpm)."""
    if len(admitted) < rpm:
        return None
    return admitted[len(admitted) - rpm] + WINDOW - now


def tpm_wait(buckets: Buckets, tpm: int, now: float) -> float | None:
    """None when the tokens in the window are under ``tpm``; otherwise the seconds until enough
    buckets leave the window to bring them under it."""
    total = tokens_in_window(buckets, now)
    if total < tpm:
        return None
    for second, n in buckets:
        total -= n
        if total < tpm:
            return _second_leaves(second) - now
    return WINDOW  # not reached: the total falls to 0, under any tpm of 1 or more


def decide(name: str, limits: Limits, in_flight: int, admitted: deque[float], buckets: Buckets,
           spent: int, now: float) -> Refusal | None:
    """The first limit that refuses one more request of key ``name``, given its windows (pruned
    to ``now``) and what it spent in the current budget period; None when all admit it."""
    who = f"Key {name!r} reached its"
    if limits.max_parallel is not None and in_flight >= limits.max_parallel:
        # a place frees when some answer ends, which nothing here can foresee: poll soon
        return _refusal(Limit.MAX_PARALLEL, 1.0,
                        f"{who} max_parallel limit: {limits.max_parallel} requests at once")
    if limits.rpm is not None and (wait := rpm_wait(admitted, limits.rpm, now)) is not None:
        return _refusal(Limit.RPM, wait, f"{who} rpm limit: {limits.rpm} requests per minute")
    if limits.tpm is not None and (wait := tpm_wait(buckets, limits.tpm, now)) is not None:
        return _refusal(Limit.TPM, wait, f"{who} tpm limit: {limits.tpm} tokens per minute, "
                                         f"{tokens_in_window(buckets, now)} in the last minute")
    if limits.budget is not None and spent >= limits.budget:
        end = period_end(limits.budget_period, now)
        return Refusal(Limit.BUDGET, end - now,
                       f"{who} budget: {limits.budget} tokens per {limits.budget_period.value}, "
                       f"{spent} spent; it resets at {iso(end)}.")
    return None


def _refusal(limit: Limit, wait: float, what: str) -> Refusal:
    wait = max(wait, 0.0)
    return Refusal(limit, wait, f"{what}. Retry after {wait_seconds(wait)} s.")


# ---- the per-key windows ----

@dataclass
class _Key:
    """One key's state. The windows are None while empty, so an idle key costs a few ints."""

    in_flight: int = 0
    admitted: deque[float] | None = None  # rpm: admission times in the window, oldest first
    buckets: Buckets | None = None  # tpm: per-second token counts in the window, oldest first
    spent: int = 0  # tokens charged in the budget period that starts at `since`
    period: Period = Period.MONTH
    since: float = 0.0

    def prune(self, now: float) -> None:
        """Drop what left the windows, and the windows themselves once empty."""
        if self.admitted is not None:
            while self.admitted and self.admitted[0] + WINDOW <= now:
                self.admitted.popleft()
            if not self.admitted:
                self.admitted = None
        if self.buckets is not None:
            while self.buckets and _second_leaves(self.buckets[0][0]) <= now:
                self.buckets.popleft()
            if not self.buckets:
                self.buckets = None

    def spent_in(self, period: Period, now: float) -> int:
        """The tokens spent in the ``period`` that ``now`` falls in (0 once a new one started)."""
        return self.spent if (self.period, self.since) == (period, period_start(period, now)) else 0

    def roll(self, period: Period, now: float) -> None:
        """Start counting afresh when ``now`` is in another period than the stored one."""
        start = period_start(period, now)
        if (self.period, self.since) != (period, start):
            self.period, self.since, self.spent = period, start, 0

    @property
    def idle(self) -> bool:
        return not self.in_flight and self.admitted is None and self.buckets is None and not self.spent


_EMPTY_TIMES: deque[float] = deque()
_EMPTY_BUCKETS: Buckets = deque()


class Limiter:
    """The per-key windows of one gateway, used from its event loop only (see the module's
    docstring for the contract). Keys are named by their names; state is made at first use."""

    def __init__(self) -> None:
        self._keys: dict[str, _Key] = {}
        self._next_sweep = -math.inf

    def admit(self, name: str, limits: Limits, now: float) -> Ticket | Refusal:
        """A ticket for one more request of key ``name``, or the limit that refuses it. No await
        in here: the check and the take happen in one step of the event loop."""
        self._sweep(now)
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = _Key()
        if limits.any:  # a key with no limits keeps no window: only its count in flight
            key.prune(now)
            if limits.rpm is None:
                key.admitted = None  # a reload took rpm away: its window would grow unbounded
            key.roll(limits.budget_period, now)
            refusal = decide(name, limits, key.in_flight, key.admitted or _EMPTY_TIMES,
                             key.buckets or _EMPTY_BUCKETS, key.spent, now)
            if refusal is not None:
                if key.idle:  # a refusal takes nothing, not even an entry
                    del self._keys[name]
                return refusal
            if limits.rpm is not None:
                if key.admitted is None:
                    key.admitted = deque()
                # kept in order even if the clock stepped back, so pruning from the left holds
                key.admitted.append(max(now, key.admitted[-1]) if key.admitted else now)
        key.in_flight += 1
        return Ticket(name, limits, now)

    def release(self, ticket: Ticket, tokens: int, now: float) -> None:
        """The end of an admitted request: it leaves the count in flight, and its ``tokens``
        are charged to the tpm window and to the budget of the period ``now`` falls in. Once
        per ticket: a second release does nothing."""
        if ticket.released:
            return
        ticket.released = True
        key = self._keys.get(ticket.name)
        if key is None:  # only a ticket of another Limiter, or one made by hand, gets here
            key = self._keys[ticket.name] = _Key()
        key.in_flight = max(0, key.in_flight - 1)
        tokens = max(0, tokens)
        limits = ticket.limits
        if tokens and limits.tpm is not None:
            key.prune(now)
            self._charge_window(key, tokens, now)
        if tokens or key.spent:  # an unused key makes no budget counter
            key.roll(limits.budget_period, now)
            key.spent += tokens
        if key.idle:
            del self._keys[ticket.name]

    @staticmethod
    def _charge_window(key: _Key, tokens: int, now: float) -> None:
        second = math.floor(now)
        if key.buckets is None:
            key.buckets = deque()
        if key.buckets and key.buckets[-1][0] >= second:
            # this second's bucket (or, if the clock stepped back, the newest): never a 61st
            last, n = key.buckets[-1]
            key.buckets[-1] = (last, n + tokens)
        else:
            key.buckets.append((second, tokens))

    def restore(self, name: str, spent: int, period: Period, since: float) -> None:
        """At start: the tokens key ``name`` already spent in the ``period`` that ``since``
        falls in (read from the usage store), so a restart keeps a budget spent."""
        key = self._keys.get(name)
        if key is None:
            key = self._keys[name] = _Key()
        key.period, key.since, key.spent = period, period_start(period, since), max(0, spent)
        if key.idle:
            del self._keys[name]

    def state(self, name: str, limits: Limits, now: float) -> dict[str, Any]:
        """Key ``name``'s standing, for GET /usage and the page. A read: it changes nothing.
        The windows are counted where the limits keep them (requests for rpm, tokens for tpm),
        None elsewhere."""
        key = self._keys.get(name) or _Key()
        spent = key.spent_in(limits.budget_period, now)
        budget = limits.budget
        return {
            "in_flight": key.in_flight,
            # None where the key's limits keep no such window (no rpm, no tpm): not a count of 0
            "rpm": limits.rpm,
            "requests_last_minute": None if limits.rpm is None else requests_in_window(key.admitted or (), now),
            "tpm": limits.tpm,
            "tokens_last_minute": None if limits.tpm is None else tokens_in_window(key.buckets or _EMPTY_BUCKETS,
                                                                                     now),
            "budget": budget,
            "budget_period": limits.budget_period.value,
            "spent": spent,
            "remaining": None if budget is None else max(0, budget - spent),
            "resets": None if budget is None else iso(period_end(limits.budget_period, now)),
        }

    def forget(self, keep: Collection[str]) -> None:
        """Drop every key's state but ``keep``'s (a reload revoked the others), except keys
        with requests in flight: their releases still come, and must find their count."""
        keep = set(keep)
        for name in [n for n, key in self._keys.items() if n not in keep and not key.in_flight]:
            del self._keys[name]

    def _sweep(self, now: float) -> None:
        """Once a minute, empty the windows that time emptied and drop keys left with nothing,
        so keys that stopped asking do not hold their windows (or their entries) forever."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + WINDOW
        for name in list(self._keys):
            key = self._keys[name]
            key.prune(now)
            key.roll(key.period, now)
            if key.idle:
                del self._keys[name]
