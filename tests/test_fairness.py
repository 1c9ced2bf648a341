"""The pure scheduling policy (``serving/fairness.py``) over random arrival sequences: ``pick`` on
its own, and a small discrete-event simulation that drives ``pick``, ``admit``, ``settle`` and
``mean`` as ``slots.FairSlots`` does (on integer times, so "waited ``max_wait``" is exact)."""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.serving import fairness
from gateway.serving.fairness import Waiter

INF = math.inf

# --- pick on its own ---------------------------------------------------------------------
waiters_st = st.lists(st.builds(Waiter, share=st.sampled_from("abcde"), priority=st.integers(0, 2),
                                arrived=st.integers(0, 100).map(float)), min_size=1, max_size=20)
vtimes_st = st.dictionaries(st.sampled_from("abcde"), st.floats(0, 200, allow_nan=False))


def starts(waiters, vtimes, clock):
    return [fairness.start(vtimes.get(w.share), clock) for w in waiters]


served_st = st.dictionaries(st.sampled_from("abcde"), st.integers(0, 200).map(float))


@given(waiters_st, vtimes_st, st.floats(0, 200), st.integers(0, 200).map(float), st.integers(1, 100).map(float),
       served_st)
def test_pick_priority_fairness_and_a_shares_turn(waiters, vtimes, clock, now, max_wait, served):
    i = fairness.pick(waiters, vtimes, clock, now, max_wait, served)
    chosen = waiters[i]
    last = [served.get(w.share, -math.inf) for w in waiters]
    # (f) a share not let in since its request has waited max_wait: overdue, first, whatever its
    # priority and virtual time; the share overdue longest first, then the earlier arrival
    overdue = [j for j, w in enumerate(waiters) if now - max(w.arrived, last[j]) >= max_wait]
    if overdue:
        assert i in overdue
        assert (last[i], chosen.arrived, i) == min((last[j], waiters[j].arrived, j) for j in overdue)
        return
    # (a) strict priority: nothing of a lower priority while a higher one waits
    assert chosen.priority == min(w.priority for w in waiters)
    # fairness within the priority: the least start goes first
    s = starts(waiters, vtimes, clock)
    top = [j for j, w in enumerate(waiters) if w.priority == chosen.priority]
    assert s[i] == min(s[j] for j in top)
    # (e) ties (same start): the share let in least recently, then the earlier arrival, then the earlier place
    tied = [j for j in top if s[j] == s[i]]
    assert (last[i], chosen.arrived, i) == min((last[j], waiters[j].arrived, j) for j in tied)


def test_pick_examples():
    w = [Waiter("a", 2, 0.0), Waiter("b", 0, 5.0), Waiter("c", 1, 1.0)]
    assert fairness.pick(w, {}, 0.0, 6.0, 30.0) == 1  # interactive first
    assert fairness.pick(w, {}, 0.0, 30.0, 30.0) == 0  # batch, but overdue: eligible, and the earliest of equals
    # overdue, its share far ahead (a light key's debt): it goes first all the same
    assert fairness.pick(w, {"a": 5e6}, 0.0, 30.0, 30.0) == 0
    # a share let in lately is not overdue, however old its request: the other one's turn
    late = [Waiter("a", 1, 0.0), Waiter("b", 1, 1.0)]
    assert fairness.pick(late, {"a": 0.0, "b": 9e9}, 0.0, 40.0, 30.0, {"a": 38.0, "b": 2.0}) == 1
    assert fairness.pick(late, {}, 0.0, 40.0, 30.0, {"a": 2.0, "b": 38.0}) == 0
    assert fairness.pick(w, {}, 0.0, 31.0, 30.0) == 0  # two overdue: the oldest of equal shares
    same = [Waiter("x", 1, 3.0), Waiter("y", 1, 2.0), Waiter("z", 1, 2.0)]
    assert fairness.pick(same, {}, 0.0, 4.0, 30.0) == 1  # a tie: the earlier arrival, then the earlier place
    # a share behind the clock starts at the clock: no credit for it
    assert fairness.pick([Waiter("old", 1, 0.0), Waiter("new", 1, 1.0)], {"old": -50.0, "new": 9.0}, 10.0, 2.0,
                         30.0) == 0
    assert fairness.pick([Waiter("old", 1, 0.0), Waiter("new", 1, 1.0)], {"old": 11.0}, 10.0, 2.0, 30.0) == 1


@given(st.one_of(st.none(), st.floats(-1e6, 1e6)), st.floats(0, 1e6), st.floats(0.001, 100),
       st.floats(0.001, 1000), st.floats(0, 100))
def test_admit_and_settle(vtime, clock, estimate, weight, held):
    after, new_clock = fairness.admit(vtime, clock, estimate, weight)
    begun = fairness.start(vtime, clock)
    assert begun >= clock and new_clock == max(clock, begun)  # the clock never goes back
    assert math.isclose(after - begun, estimate / weight, rel_tol=1e-9, abs_tol=1e-6)
    settled = fairness.settle(after, estimate, held, weight)
    assert math.isclose(settled, begun + held / weight, rel_tol=1e-9, abs_tol=1e-6)  # charged what it held


# --- a simulation driving the policy as FairSlots does ----------------------------------------
@dataclass
class Req:
    seq: int
    share: str
    priority: int
    arrived: int
    hold: int
    granted: int | None = None


@dataclass
class Pick:
    now: int
    waiting: list[Req]
    chosen: Req


def simulate(reqs: list[Req], slots: int, max_wait: float, weights: dict[str, float] | None = None,
             until: int | None = None, refill: frozenset[str] = frozenset()) -> list[Pick]:
    """Serve ``reqs`` (arrival order = their order) on ``slots`` slots; each holds its slot ``hold``.
    At each moment: slots freed first (``settle``), then arrivals, then every free slot handed out
    (``pick``, ``admit``). A share in ``refill`` sends a like request each time one of its own is let
    in (always backlogged, with a short queue). Stops past ``until``. Returns every pick, in order."""
    weights = weights or {}
    seq = len(reqs)
    arrivals = sorted(reqs, key=lambda r: (r.arrived, r.seq))
    running: list[tuple[int, int, Req, float]] = []  # (ends, seq, request, estimate)
    waiting: list[Req] = []
    vtimes: dict[str, float] = {}
    served: dict[str, float] = {}
    clock, estimate_mean, picks, a = 0.0, 1.0, [], 0
    while a < len(arrivals) or running or waiting:
        now = min(([arrivals[a].arrived] if a < len(arrivals) else []) + ([running[0][0]] if running else []))
        if until is not None and now > until:
            break
        while running and running[0][0] == now:
            _, _, r, est = heapq.heappop(running)
            w = weights.get(r.share, 1.0)
            vtimes[r.share] = fairness.settle(vtimes[r.share], est, r.hold, w)
            estimate_mean = fairness.mean(estimate_mean, r.hold)
        while a < len(arrivals) and arrivals[a].arrived == now:
            waiting.append(arrivals[a])
            a += 1
        while len(running) < slots and waiting:
            i = fairness.pick([Waiter(r.share, r.priority, float(r.arrived)) for r in waiting], vtimes, clock,
                              float(now), max_wait, served)
            picks.append(Pick(now, list(waiting), waiting[i]))
            r = waiting.pop(i)
            r.granted = now
            served[r.share] = now
            vtimes[r.share], clock = fairness.admit(vtimes.get(r.share), clock, estimate_mean,
                                                    weights.get(r.share, 1.0))
            heapq.heappush(running, (now + r.hold, r.seq, r, estimate_mean))
            if r.share in refill:
                waiting.append(Req(seq, r.share, r.priority, now, r.hold))
                seq += 1
    return picks


arrivals_st = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 2), st.integers(0, 40), st.integers(1, 6)),
                       min_size=1, max_size=60)


def requests(rows) -> list[Req]:
    rows = sorted(rows, key=lambda x: x[2])
    return [Req(i, share, prio, at, hold) for i, (share, prio, at, hold) in enumerate(rows)]


@settings(max_examples=150, deadline=None)
@given(arrivals_st, st.integers(1, 3), st.integers(1, 30),
       st.dictionaries(st.sampled_from("abcd"), st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0])))
def test_simulated_picks_keep_the_order_and_every_wait_is_bounded(rows, slots, max_wait, weights):
    reqs = requests(rows)
    picks = simulate(reqs, slots, max_wait, weights)
    assert all(r.granted is not None for r in reqs)  # finite arrivals: everyone is served
    for p in picks:  # (a) strict priority, but (f) a request waiting max_wait (its share not let in since) goes first
        assert p.chosen.priority == min(r.priority for r in p.waiting) or p.now - p.chosen.arrived >= max_wait
    # within one share and one priority, first come first served
    for share in "abcd":
        for prio in range(3):
            mine = [r for r in reqs if r.share == share and r.priority == prio]
            assert [r.granted for r in mine] == sorted(r.granted for r in mine)  # type: ignore[type-var]
    # (b) every request is served (above), and no later than every request that arrived before it
    # or while it waited, one after another: a bound that starvation would break
    hold = max(r.hold for r in reqs)
    for r in reqs:
        assert r.granted is not None
        before = sum(1 for q in reqs if q.seq != r.seq and q.arrived <= r.granted)
        assert r.granted - r.arrived <= max_wait + math.ceil((before + 1) / slots) * hold, r


def test_a_lower_priority_waits_at_most_max_wait_and_one_hold_behind_endless_higher_work():
    # (b) across priorities: an interactive share always backlogged, a batch request waiting; once
    # the batch request has waited max_wait its share, served nothing so far, goes at the next free slot
    for slots, hold, max_wait in ((1, 3, 10), (2, 5, 12), (3, 1, 7)):
        reqs = [Req(i, "a", 0, 0, hold) for i in range(slots + 1)] + [Req(slots + 1, "b", 2, 1, hold)]
        simulate(reqs, slots, max_wait, until=200, refill=frozenset("a"))
        batch = reqs[-1]
        assert batch.granted is not None and batch.granted - batch.arrived <= max_wait + hold, batch


def test_an_old_backlog_does_not_go_before_another_keys_fresh_request():
    # aging lifts a lower priority, never a share over its equals: key a's 20 requests all grow old
    # on one slot; key b's fresh request still takes the next slot freed
    reqs = [Req(i, "a", 1, 0, 4) for i in range(20)] + [Req(20, "b", 1, 50, 4)]
    simulate(reqs, 1, 5)
    b = reqs[-1]
    assert b.granted is not None and b.granted - b.arrived <= 4
    assert sum(1 for r in reqs[:-1] if r.granted is not None and r.granted > b.granted) >= 5


@settings(max_examples=40, deadline=None)
@given(st.floats(0.25, 4), st.floats(0.25, 4), st.integers(1, 3))
def test_two_backlogged_shares_get_slot_time_in_the_ratio_of_their_weights(w1, w2, slots):
    # (c) both always have work waiting, every request holds its slot 1 (equal costs), no deadline
    reqs = [Req(i, "ab"[i % 2], 1, 0, 1) for i in range(2 * (slots + 1))]
    picks = simulate(reqs, slots, INF, {"a": w1, "b": w2}, until=1000, refill=frozenset("ab"))
    served = Counter(p.chosen.share for p in picks)
    # start-time fair queueing's bound: the services weighted differ by at most one request's
    # charge each, plus what the slots let in at once
    assert abs(served["a"] / w1 - served["b"] / w2) <= (slots + 1) * (1 / w1 + 1 / w2)
    total = served["a"] + served["b"]
    assert total >= 1000 * slots
    assert abs(served["a"] / total - w1 / (w1 + w2)) <= 0.01


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.5, 1.0, 2.0]), st.integers(1, 2),
       st.integers(20, 200), st.integers(0, 30))
def test_an_idle_share_banks_no_credit(wa, wb, slots, idle_until, b_first):
    # (d) b is served a little (b_first requests), then idle while a runs alone (always backlogged)
    # until idle_until, then sends a burst. Over the burst b gets its weighted part, not the time
    # it was away.
    reqs = [Req(i, "b", 1, 0, 1) for i in range(b_first)]
    reqs += [Req(len(reqs) + i, "a", 1, 0, 1) for i in range(slots + 1)]
    reqs += [Req(len(reqs) + i, "b", 1, idle_until, 1) for i in range(400)]
    picks = simulate(reqs, slots, INF, {"a": wa, "b": wb}, until=idle_until + 100, refill=frozenset("a"))
    burst = [p.chosen.share for p in picks if p.now >= idle_until]
    fair_b = wb / (wa + wb)
    assert burst.count("b") < 400  # still backlogged at the end
    for m in range(1, len(burst) + 1):  # every prefix of the burst
        got_b = burst[:m].count("b")
        assert got_b <= m * fair_b + slots + 1, (m, got_b)
    assert abs(burst.count("b") / len(burst) - fair_b) <= 0.03


def test_a_key_with_64_queued_does_not_put_a_later_key_behind_its_queue():
    # two slots, each answer holds one 10; key a sends 64 at once, b one request at 3
    reqs = [Req(i, "a", 1, 0, 10) for i in range(64)] + [Req(64, "b", 1, 3, 1)]
    simulate(reqs, 2, 30, {})
    b = reqs[-1]
    assert b.granted == 10  # the next slot freed, not after a's 62 waiting
    # and at every priority a's backlog keeps: a batch b still waits only for a batch a's slot
    reqs = [Req(i, "a", 2, 0, 10) for i in range(64)] + [Req(64, "b", 2, 3, 1)]
    simulate(reqs, 2, 30, {})
    assert reqs[-1].granted == 10
    # first come, first served would have put b behind all of a's: 31 rounds of 10


def test_an_interactive_request_takes_the_next_slot_before_batch_work_waiting():
    reqs = [Req(i, "batch", 2, 0, 10) for i in range(20)] + [Req(20, "ed", 0, 5, 1), Req(21, "ed", 0, 12, 1)]
    simulate(reqs, 1, 1000, {})
    # the first at the next free (10); the second waits only for the batch request let in at 11
    assert reqs[20].granted == 10 and reqs[21].granted == 21
