"""The swap policy (``models/placement.py``): whether a waiting model may unload a loaded one
(``swap``), which waiting model loads next (``next_load``), and which busy model drains for a
swap that waited too long (``busy_victim``). Pure: a state in, a decision out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.models.lifecycle import ModelState
from gateway.models.placement import Pending, Resident, Swap, busy_victim, next_load, swap

R, L = ModelState.READY, ModelState.LOADING
times = st.integers(0, 400).map(lambda n: n / 4)  # quarter seconds: exact, so edges are exact
maybe_idle = st.one_of(st.none(), times)


# --- swap -----------------------------------------------------------------------------------
@pytest.mark.parametrize("idle_for, waited, hold, max_wait, decision", [
    (0.0, 0.0, 2.0, 30.0, (Swap.HOLD, 2.0)),  # the loaded model just finished: its clients come first
    (1.5, 0.0, 2.0, 30.0, (Swap.HOLD, 0.5)),
    (2.0, 0.0, 2.0, 30.0, (Swap.GO, 0.0)),  # idle for the hold: unload it
    (0.0, 29.0, 2.0, 30.0, (Swap.HOLD, 1.0)),  # max_wait comes before the hold ends
    (0.5, 30.0, 2.0, 30.0, (Swap.GO, 0.0)),  # waited max_wait: the hold is over
    (None, 10.0, 2.0, 30.0, (Swap.HOLD, 20.0)),  # busy: wait, until max_wait
    (None, 30.0, 2.0, 30.0, (Swap.CLOSE, 0.0)),  # busy at max_wait: it takes no new request
    (None, 45.0, 2.0, 30.0, (Swap.CLOSE, 0.0)),
    (0.0, 0.0, 0.0, 30.0, (Swap.GO, 0.0)),  # swap_hold_seconds 0: llama-swap's, a swap at every change
])
def test_swap(idle_for, waited, hold, max_wait, decision):
    assert swap(idle_for, waited, hold, max_wait) == decision


@given(maybe_idle, times, times, times)
def test_swap_never_holds_past_max_wait_and_its_after_is_the_next_change(idle_for, waited, hold, max_wait):
    decision, after = swap(idle_for, waited, hold, max_wait)
    if waited >= max_wait:  # a request waited max_wait: it forces its swap
        assert decision is (Swap.CLOSE if idle_for is None else Swap.GO) and after == 0
        return
    if idle_for is not None and idle_for >= hold:
        assert (decision, after) == (Swap.GO, 0.0)
        return
    assert decision is Swap.HOLD and after > 0
    # "after" is at most the time to the next change: up to it the answer is still HOLD, at it it changes
    assert after <= max_wait - waited
    later = None if idle_for is None else idle_for + after
    assert swap(later, waited + after, hold, max_wait)[0] is not Swap.HOLD
    for part in (0.25, 0.5, 0.75):
        if after * part > 0:
            still = None if idle_for is None else idle_for + after * part
            assert swap(still, waited + after * part, hold, max_wait)[0] is Swap.HOLD


@given(maybe_idle, times, times, times)
def test_swap_of_an_idle_model_with_no_hold_goes_at_once(idle_for, waited, hold, max_wait):
    assert swap(0.0 if idle_for is None else idle_for, waited, 0.0, max_wait) == (Swap.GO, 0.0)


# --- next_load ------------------------------------------------------------------------------
@pytest.mark.parametrize("pending, now, decision", [
    ([], 100.0, None),
    ([Pending("a", 90.0, 1)], 100.0, "a"),
    ([Pending("a", 90.0, 1), Pending("b", 95.0, 5)], 100.0, "b"),  # the most waiting
    ([Pending("a", 90.0, 3), Pending("b", 95.0, 3)], 100.0, "a"),  # as many: the oldest
    ([Pending("b", 90.0, 3), Pending("a", 90.0, 3)], 100.0, "a"),  # and then by name
    ([Pending("a", 60.0, 1), Pending("b", 99.0, 50)], 100.0, "a"),  # overdue: first, whatever the counts
    ([Pending("a", 65.0, 9), Pending("b", 50.0, 1), Pending("c", 99.0, 50)], 100.0, "b"),  # the oldest overdue
])
def test_next_load(pending, now, decision):
    assert next_load(pending, now, 30.0) == decision


pendings = st.lists(st.builds(Pending, name=st.sampled_from("abcdefgh"), oldest=times, count=st.integers(1, 20)),
                    max_size=8, unique_by=lambda p: p.name)


@given(pendings, times, st.integers(1, 200).map(lambda n: n / 4))
def test_next_load_overdue_oldest_first_else_most_then_oldest(pending, now, max_wait):
    name = next_load(pending, now, max_wait)
    if not pending:
        assert name is None
        return
    chosen = next(p for p in pending if p.name == name)
    overdue = [p for p in pending if now - p.oldest >= max_wait]
    if overdue:
        assert chosen in overdue and all(chosen.oldest <= p.oldest for p in overdue)
    else:
        assert all(chosen.count >= p.count for p in pending)
        assert all(chosen.oldest <= p.oldest for p in pending if p.count == chosen.count)


# --- busy_victim ----------------------------------------------------------------------------
def ram(n: int) -> dict[str, int]:
    return {"ram": n}


@pytest.mark.parametrize("others, need, capacity, victim", [
    ([], None, None, None),
    ([Resident("a", R, in_flight=2, pinned=True)], None, None, None),  # pinned: never
    ([Resident("a", R, in_flight=0)], None, None, None),  # idle: make_room evicts it, no drain needed
    ([Resident("a", L, in_flight=1)], None, None, None),  # loading: not drained mid-load
    ([Resident("a", R, in_flight=1, last_used=5), Resident("b", R, in_flight=3, last_used=2)], None, None, "b"),  # LRU
    ([Resident("a", R, in_flight=1, last_used=5), Resident("b", R, in_flight=1, last_used=2, pinned=True)], None, None,
     "a"),
    # RAM short: only a model holding RAM would help, though the other is used less recently
    ([Resident("a", R, in_flight=1, last_used=5, memory=ram(400)),
      Resident("b", R, in_flight=1, last_used=1, memory={"cuda0": 400})], ram(200), ram(500), "a"),
    ([Resident("b", R, in_flight=1, last_used=1, memory={"cuda0": 400})], ram(200), ram(100), None),
    # nothing short (the count limit): any busy model
    ([Resident("a", R, in_flight=1, last_used=5, memory=ram(10)),
      Resident("b", R, in_flight=1, last_used=1, memory={"cuda0": 10})], ram(20), ram(500), "b"),
])
def test_busy_victim(others, need, capacity, victim):
    assert busy_victim(others, need, capacity) == victim


residents = st.lists(st.builds(Resident, name=st.sampled_from("abcdefgh"), state=st.sampled_from([R, L]),
                               in_flight=st.integers(0, 2), last_used=times, pinned=st.booleans()),
                     max_size=6, unique_by=lambda r: r.name)


@given(residents)
def test_busy_victim_is_a_busy_ready_unpinned_model_the_least_recently_used(others):
    name = busy_victim(others)
    fit = [r for r in others if r.state is R and not r.pinned and r.in_flight > 0]
    if not fit:
        assert name is None
        return
    chosen = next(r for r in others if r.name == name)
    assert chosen in fit and all(chosen.last_used <= r.last_used for r in fit)
