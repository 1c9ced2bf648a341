"""Per-key limits (gateway/access/limits.py): rpm, tpm, max_parallel and budgets, with every
time passed in, so nothing sleeps."""

from __future__ import annotations

import asyncio
import calendar
import math
import time

import pytest

from gateway.access.limits import (
    Limit,
    Limiter,
    Limits,
    Period,
    Refusal,
    Ticket,
    decide,
    period_end,
    period_start,
)

T0 = 1_790_000_000.0  # a Tuesday in 2026, well inside a day; any epoch time would do


def at(text: str) -> float:
    """'2026-03-01 23:59:00' (UTC) as epoch seconds."""
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S")))


def ticket(got: Ticket | Refusal) -> Ticket:
    assert isinstance(got, Ticket), got
    return got


def refusal(got: Ticket | Refusal, limit: Limit) -> Refusal:
    assert isinstance(got, Refusal), got
    assert got.limit is limit
    assert "'alice'" in got.message and limit.value in got.message
    return got


# ---- Limits ----

def test_limits_any_and_checks():
    assert not Limits().any
    assert Limits(rpm=1).any and Limits(tpm=1).any and Limits(max_parallel=1).any and Limits(budget=1).any
    assert not Limits(budget_period=Period.DAY).any
    for bad in (0, -1, 1.5, True, "5"):
        with pytest.raises(ValueError, match="rpm"):
            Limits(rpm=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget_period"):
        Limits(budget_period="day")  # type: ignore[arg-type]


def test_a_key_with_no_limits_gets_tickets_and_keeps_no_window():
    lim = Limiter()
    tickets = [ticket(lim.admit("free", Limits(), T0)) for _ in range(1000)]
    assert lim.state("free", Limits(), T0)["in_flight"] == 1000
    assert lim._keys["free"].admitted is None and lim._keys["free"].buckets is None
    for t in tickets:
        lim.release(t, 10, T0 + 1)
    state = lim.state("free", Limits(), T0 + 1)
    assert state["in_flight"] == 0 and state["tokens_last_minute"] is None and state["spent"] == 10_000
    assert state["budget"] is None and state["remaining"] is None and state["resets"] is None


# ---- rpm ----

def test_rpm_refuses_at_exactly_its_number():
    lim, limits = Limiter(), Limits(rpm=5)
    for i in range(5):
        ticket(lim.admit("alice", limits, T0 + i))
    got = refusal(lim.admit("alice", limits, T0 + 10), Limit.RPM)
    assert got.retry_after == pytest.approx(50.0)  # the admission at T0 leaves at T0 + 60
    assert got.message == "Key 'alice' reached its rpm limit: 5 requests per minute. Retry after 50 s."
    assert got.seconds == 50


def test_the_rpm_window_slides():
    lim, limits = Limiter(), Limits(rpm=2)
    ticket(lim.admit("alice", limits, T0))
    ticket(lim.admit("alice", limits, T0 + 0.5))
    refusal(lim.admit("alice", limits, T0 + 30), Limit.RPM)  # both still in the window
    assert lim.state("alice", limits, T0 + 30)["requests_last_minute"] == 2
    refusal(lim.admit("alice", limits, T0 + 59.9), Limit.RPM)
    ticket(lim.admit("alice", limits, T0 + 60))  # the first left at exactly 60 s
    got = refusal(lim.admit("alice", limits, T0 + 60.2), Limit.RPM)
    assert got.retry_after == pytest.approx(0.3)  # T0 + 0.5 leaves at T0 + 60.5
    assert got.seconds == 1  # a header never says 0
    ticket(lim.admit("alice", limits, T0 + 61))
    assert lim.state("alice", limits, T0 + 61)["requests_last_minute"] == 2


def test_a_refusal_takes_nothing():
    lim, limits = Limiter(), Limits(rpm=1)
    ticket(lim.admit("alice", limits, T0))
    for i in range(100):
        refusal(lim.admit("alice", limits, T0 + i * 0.5), Limit.RPM)
    assert len(lim._keys["alice"].admitted or ()) == 1
    assert lim.state("alice", limits, T0 + 50)["in_flight"] == 1
    ticket(lim.admit("alice", limits, T0 + 60))


def test_a_lowered_rpm_waits_for_enough_admissions_to_leave():
    lim = Limiter()
    for i in range(4):
        ticket(lim.admit("alice", Limits(rpm=10), T0 + i))
    got = refusal(lim.admit("alice", Limits(rpm=2), T0 + 5), Limit.RPM)
    assert got.retry_after == pytest.approx(57.0)  # T0 + 2 must leave (at T0 + 62) to be under 2


# ---- tpm ----

def test_tpm_refuses_once_the_window_holds_its_number():
    lim, limits = Limiter(), Limits(tpm=100)
    lim.release(ticket(lim.admit("alice", limits, T0)), 99, T0 + 1)
    t = ticket(lim.admit("alice", limits, T0 + 2))  # 99 < 100: admitted
    lim.release(t, 1, T0 + 3)
    got = refusal(lim.admit("alice", limits, T0 + 4), Limit.TPM)
    # under 100 again once T0 + 1's bucket leaves, at T0 + 61
    assert got.retry_after == pytest.approx(57.0)
    assert got.message == ("Key 'alice' reached its tpm limit: 100 tokens per minute, 100 in the last minute. "
                           "Retry after 57 s.")
    ticket(lim.admit("alice", limits, T0 + 61))


def test_tpm_retry_after_counts_the_buckets_that_must_leave():
    lim, limits = Limiter(), Limits(tpm=100)
    for i, n in enumerate([30, 30, 30, 30]):  # 120 tokens in four seconds
        lim.release(ticket(lim.admit("alice", limits, T0 + i)), n, T0 + i + 0.25)
    got = refusal(lim.admit("alice", limits, T0 + 10), Limit.TPM)
    # 120 -> 90 when T0's bucket leaves (T0 + 60): one bucket is enough
    assert got.retry_after == pytest.approx(50.0)
    for i in range(3):  # three answers admitted before the window filled end now: 210 tokens
        lim.release(Ticket("alice", limits, T0), 30, T0 + 11 + i)
    got = refusal(lim.admit("alice", limits, T0 + 20), Limit.TPM)
    # 210 -> 180 -> 150 -> 120 -> 90: the four oldest buckets must leave, T0 + 3's at T0 + 63
    assert got.retry_after == pytest.approx(43.0)


def test_tpm_buckets_slide():
    lim, limits = Limiter(), Limits(tpm=1000)
    lim.release(ticket(lim.admit("alice", limits, T0)), 400, T0 + 0.2)
    lim.release(ticket(lim.admit("alice", limits, T0)), 300, T0 + 0.9)  # same second, same bucket
    lim.release(ticket(lim.admit("alice", limits, T0)), 200, T0 + 30.5)
    assert len(lim._keys["alice"].buckets or ()) == 2
    assert lim.state("alice", limits, T0 + 59.9)["tokens_last_minute"] == 900
    assert lim.state("alice", limits, T0 + 60)["tokens_last_minute"] == 200  # T0's second left
    assert lim.state("alice", limits, T0 + 90)["tokens_last_minute"] == 0
    ticket(lim.admit("alice", limits, T0 + 90))
    assert lim._keys["alice"].buckets is None  # an empty window is dropped


def test_tokens_are_charged_after_so_one_answer_may_run_past_tpm():
    lim, limits = Limiter(), Limits(tpm=100)
    t = ticket(lim.admit("alice", limits, T0))
    lim.release(t, 5000, T0 + 1)
    assert lim.state("alice", limits, T0 + 1)["tokens_last_minute"] == 5000
    refusal(lim.admit("alice", limits, T0 + 2), Limit.TPM)


# ---- max_parallel ----

def test_max_parallel_refuses_at_exactly_its_number_and_release_frees_a_place():
    lim, limits = Limiter(), Limits(max_parallel=2)
    a = ticket(lim.admit("alice", limits, T0))
    ticket(lim.admit("alice", limits, T0))
    got = refusal(lim.admit("alice", limits, T0), Limit.MAX_PARALLEL)
    assert got.retry_after == 1.0
    assert got.message == "Key 'alice' reached its max_parallel limit: 2 requests at once. Retry after 1 s."
    lim.release(a, 10, T0 + 1)
    c = ticket(lim.admit("alice", limits, T0 + 1))
    refusal(lim.admit("alice", limits, T0 + 1), Limit.MAX_PARALLEL)
    lim.release(a, 10, T0 + 2)  # a second release of the same ticket: nothing
    refusal(lim.admit("alice", limits, T0 + 2), Limit.MAX_PARALLEL)
    assert lim.state("alice", limits, T0 + 2)["in_flight"] == 2
    assert lim.state("alice", limits, T0 + 2)["tokens_last_minute"] is None  # no tpm: no window
    assert lim.state("alice", limits, T0 + 2)["spent"] == 10  # charged once
    lim.release(c, 0, T0 + 3)
    ticket(lim.admit("alice", limits, T0 + 3))


def test_the_checks_go_in_order():
    lim = Limiter()
    limits = Limits(rpm=1, tpm=10, max_parallel=1, budget=10, budget_period=Period.DAY)
    t = ticket(lim.admit("alice", limits, T0))
    refusal(lim.admit("alice", limits, T0), Limit.MAX_PARALLEL)  # all four reached: the first
    lim.release(t, 50, T0 + 30)
    refusal(lim.admit("alice", limits, T0 + 31), Limit.RPM)
    refusal(lim.admit("alice", limits, T0 + 60), Limit.TPM)  # the admission left; the tokens not yet
    got = refusal(lim.admit("alice", limits, T0 + 90), Limit.BUDGET)  # they left; the day's budget stays
    assert got.retry_after == pytest.approx(period_end(Period.DAY, T0) - (T0 + 90))


def test_decide_is_pure_given_the_windows():
    from collections import deque
    limits = Limits(rpm=2, tpm=10)
    assert decide("alice", limits, 0, deque([T0]), deque([(int(T0), 9)]), 0, T0 + 1) is None
    got = decide("alice", limits, 0, deque([T0, T0 + 1]), deque(), 0, T0 + 2)
    assert got is not None and got.limit is Limit.RPM and got.retry_after == pytest.approx(58.0)


# ---- budgets and periods ----

@pytest.mark.parametrize("period,now,start,end", [
    (Period.DAY, "2026-11-28 13:45:10", "2026-11-28 00:00:00", "2026-11-29 00:00:00"),
    (Period.DAY, "2026-11-28 00:00:00", "2026-11-28 00:00:00", "2026-11-29 00:00:00"),
    (Period.DAY, "2026-12-31 23:59:59", "2026-12-31 00:00:00", "2027-01-01 00:00:00"),
    (Period.WEEK, "2026-03-01 23:59:00", "2026-02-23 00:00:00", "2026-03-02 00:00:00"),  # a Sunday
    (Period.WEEK, "2026-03-02 00:00:00", "2026-03-02 00:00:00", "2026-03-09 00:00:00"),  # the Monday
    (Period.WEEK, "2026-12-31 12:00:00", "2026-12-28 00:00:00", "2027-01-04 00:00:00"),  # across a year
    (Period.MONTH, "2026-12-31 23:59:59", "2026-12-01 00:00:00", "2027-01-01 00:00:00"),
    (Period.MONTH, "2027-01-01 00:00:00", "2027-01-01 00:00:00", "2027-02-01 00:00:00"),
    (Period.MONTH, "2028-02-29 18:00:00", "2028-02-01 00:00:00", "2028-03-01 00:00:00"),  # a leap year
    (Period.MONTH, "2027-02-28 18:00:00", "2027-02-01 00:00:00", "2027-03-01 00:00:00"),
    (Period.DAY, "2028-02-28 23:00:00", "2028-02-28 00:00:00", "2028-02-29 00:00:00"),
])
def test_period_start_and_end(period, now, start, end):
    assert period_start(period, at(now)) == at(start)
    assert period_end(period, at(now)) == at(end)
    assert period_start(period, at(end)) == at(end)  # the end is the next period's start
    assert period_end(period, at(end) - 0.001) == at(end)


def test_budget_refuses_once_spent_and_names_when_it_resets():
    lim, limits = Limiter(), Limits(budget=1000, budget_period=Period.DAY)
    now = at("2026-11-28 10:00:00")
    t = ticket(lim.admit("alice", limits, now))
    lim.release(t, 999, now + 1)
    t = ticket(lim.admit("alice", limits, now + 2))  # 999 < 1000: one more
    lim.release(t, 43, now + 3)  # runs past by its own size
    got = refusal(lim.admit("alice", limits, now + 4), Limit.BUDGET)
    assert got.retry_after == pytest.approx(at("2026-11-29 00:00:00") - (now + 4))
    assert got.message == ("Key 'alice' reached its budget: 1000 tokens per day, 1042 spent; "
                           "it resets at 2026-11-29T00:00:00Z.")
    assert lim.state("alice", limits, now + 4) == {
        "in_flight": 0, "rpm": None, "requests_last_minute": None, "tpm": None, "tokens_last_minute": None,
        "budget": 1000,
        "budget_period": "day", "spent": 1042, "remaining": 0, "resets": "2026-11-29T00:00:00Z"}
    # the next day starts at 0
    ticket(lim.admit("alice", limits, at("2026-11-29 00:00:00")))
    assert lim.state("alice", limits, at("2026-11-29 00:00:01"))["spent"] == 0


def test_a_weekly_budget_resets_on_monday():
    lim, limits = Limiter(), Limits(budget=100, budget_period=Period.WEEK)
    sunday = at("2026-03-01 23:59:00")
    lim.release(ticket(lim.admit("alice", limits, sunday)), 100, sunday + 30)
    got = refusal(lim.admit("alice", limits, sunday + 50), Limit.BUDGET)
    assert got.retry_after == pytest.approx(10.0)
    assert "resets at 2026-03-02T00:00:00Z" in got.message
    monday = at("2026-03-02 00:00:00")
    assert lim.state("alice", limits, monday)["spent"] == 0 and lim.state("alice", limits, monday)["remaining"] == 100
    ticket(lim.admit("alice", limits, monday))


def test_a_charge_lands_in_the_period_of_its_release():
    lim, limits = Limiter(), Limits(budget=100, budget_period=Period.MONTH)
    t = ticket(lim.admit("alice", limits, at("2026-12-31 23:59:50")))
    lim.release(t, 70, at("2027-01-01 00:00:05"))  # the answer ended in January
    assert lim.state("alice", limits, at("2027-01-01 00:00:06"))["spent"] == 70
    assert lim.state("alice", limits, at("2027-01-01 00:00:06"))["resets"] == "2027-02-01T00:00:00Z"
    # and a December charge does not follow into January
    lim2 = Limiter()
    lim2.release(ticket(lim2.admit("alice", limits, at("2026-12-31 10:00:00"))), 100, at("2026-12-31 23:59:59"))
    refusal(lim2.admit("alice", limits, at("2026-12-31 23:59:59")), Limit.BUDGET)
    ticket(lim2.admit("alice", limits, at("2027-01-01 00:00:00")))


def test_a_leap_february_budget():
    lim, limits = Limiter(), Limits(budget=10, budget_period=Period.MONTH)
    lim.restore("alice", 10, Period.MONTH, at("2028-02-01 00:00:00"))
    got = refusal(lim.admit("alice", limits, at("2028-02-29 12:00:00")), Limit.BUDGET)
    assert got.retry_after == pytest.approx(12 * 3600)
    assert "resets at 2028-03-01T00:00:00Z" in got.message
    ticket(lim.admit("alice", limits, at("2028-03-01 00:00:00")))


def test_restore_counts_what_a_restart_found_spent():
    limits = Limits(budget=500, budget_period=Period.MONTH)
    now = at("2026-11-15 08:00:00")
    lim = Limiter()
    lim.restore("alice", 450, Period.MONTH, period_start(Period.MONTH, now))
    assert lim.state("alice", limits, now)["spent"] == 450
    assert lim.state("alice", limits, now)["remaining"] == 50
    lim.release(ticket(lim.admit("alice", limits, now)), 60, now + 1)
    assert lim.state("alice", limits, now + 1)["spent"] == 510
    refusal(lim.admit("alice", limits, now + 2), Limit.BUDGET)
    # what was spent in an earlier period is no longer spent
    old = Limiter()
    old.restore("alice", 450, Period.MONTH, at("2026-10-03 00:00:00"))
    assert old.state("alice", limits, now)["spent"] == 0
    ticket(old.admit("alice", limits, now))
    # nothing spent keeps nothing
    none = Limiter()
    none.restore("bob", 0, Period.MONTH, now)
    assert "bob" not in none._keys


# ---- races ----

def test_a_burst_in_one_instant_never_gets_more_than_rpm_or_max_parallel():
    lim = Limiter()
    got = [lim.admit("alice", Limits(rpm=7), T0) for _ in range(1000)]
    assert sum(isinstance(g, Ticket) for g in got) == 7
    got = [lim.admit("bob", Limits(max_parallel=3, rpm=100), T0) for _ in range(1000)]
    assert sum(isinstance(g, Ticket) for g in got) == 3
    assert all(g.limit is Limit.MAX_PARALLEL for g in got if isinstance(g, Refusal))


async def test_concurrent_tasks_never_pass_max_parallel():
    lim, limits = Limiter(), Limits(max_parallel=3)
    in_flight = 0
    most = 0
    served = 0

    async def one(i: int) -> None:
        nonlocal in_flight, most, served
        for _ in range(20):
            got = lim.admit("alice", limits, T0 + i)
            if isinstance(got, Refusal):
                await asyncio.sleep(0)
                continue
            in_flight += 1
            most = max(most, in_flight)
            assert lim.state("alice", limits, T0)["in_flight"] == in_flight <= 3
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            in_flight -= 1
            served += 1
            lim.release(got, 1, T0 + i)

    await asyncio.gather(*(one(i) for i in range(50)))
    assert most == 3 and served > 3
    assert lim.state("alice", limits, T0 + 60)["in_flight"] == 0


# ---- forget and memory ----

def test_forget_keeps_only_the_kept_and_the_keys_in_flight():
    lim, limits = Limiter(), Limits(rpm=10, budget=100)
    flying = ticket(lim.admit("carol", limits, T0))
    lim.release(ticket(lim.admit("alice", limits, T0)), 5, T0)
    lim.release(ticket(lim.admit("bob", limits, T0)), 5, T0)
    lim.forget({"alice"})
    assert set(lim._keys) == {"alice", "carol"}  # bob revoked; carol revoked but in flight
    lim.release(flying, 7, T0 + 1)  # still finds its count
    assert lim.state("carol", limits, T0 + 1)["in_flight"] == 0
    assert lim.state("carol", limits, T0 + 1)["spent"] == 7
    lim.forget(["alice"])
    assert set(lim._keys) == {"alice"}
    assert lim.state("bob", limits, T0 + 1)["spent"] == 0


def test_the_tpm_window_holds_at_most_60_buckets():
    lim, limits = Limiter(), Limits(tpm=10**12)
    for i in range(100_000):
        now = T0 + i * 0.037  # about an hour of requests, 27 a second
        lim.release(ticket(lim.admit("alice", limits, now)), 3, now)
        assert len(lim._keys["alice"].buckets or ()) <= 60
    assert len(lim._keys["alice"].buckets or ()) == 60
    last = T0 + 99_999 * 0.037
    assert 3 * 27 * 59 <= lim.state("alice", limits, last)["tokens_last_minute"] <= 3 * 28 * 60


def test_an_idle_key_holds_at_most_its_budget_counter():
    lim, limits = Limiter(), Limits(rpm=100, tpm=10_000, budget=10**9)
    for i in range(50):
        lim.release(ticket(lim.admit("alice", limits, T0 + i)), 10, T0 + i)
        lim.release(ticket(lim.admit("bob", Limits(rpm=100), T0 + i / 10)), 0, T0 + i)
    lim.admit("carol", Limits(), T0 + 200)  # any admission sweeps, once a minute
    alice = lim._keys["alice"]
    assert alice.admitted is None and alice.buckets is None and alice.in_flight == 0 and alice.spent == 500
    assert "bob" not in lim._keys  # nothing spent: nothing kept
    # reads change nothing
    before = repr(lim._keys)
    lim.state("alice", limits, T0 + 300)
    lim.state("dave", limits, T0 + 300)
    assert repr(lim._keys) == before and "dave" not in lim._keys


def test_the_sweep_drops_a_counter_whose_period_ended():
    lim, limits = Limiter(), Limits(budget=100, budget_period=Period.DAY)
    now = at("2026-11-28 10:00:00")
    lim.release(ticket(lim.admit("alice", limits, now)), 5, now)
    lim.admit("bob", Limits(), now + 86_400)
    assert "alice" not in lim._keys


def test_retry_after_is_never_negative_and_formats_up():
    lim, limits = Limiter(), Limits(rpm=1)
    ticket(lim.admit("alice", limits, T0))
    got = refusal(lim.admit("alice", limits, T0 + 58.2), Limit.RPM)
    assert got.retry_after == pytest.approx(1.8) and got.seconds == 2 == math.ceil(got.retry_after)
    assert "Retry after 2 s." in got.message
