"""``slots.FairSlots``, ``Door`` and ``Waits`` on a real event loop: who gets a freed slot, and
that a request leaving (while waiting, or once handed a slot) leaves nothing behind. The keys'
terms come through the gateway's own ``queues.KeyQueues`` (its ``key_terms`` as the gate sets it)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.access.claims import Claim, Priority, Terms
from gateway.base.errors import ApiError
from gateway.models.config import ServerConfig
from gateway.serving import slots as slots_module
from gateway.serving.queues import KeyQueues
from gateway.serving.slots import Door, FairSlots, Unkeyed, Waits


def keyed(terms: dict[str, Terms], max_wait: float = 30.0) -> KeyQueues:
    server = dataclasses.replace(ServerConfig(), priority_max_wait=max_wait)
    keys = KeyQueues(lambda: server, lambda: None)
    keys.key_terms = terms.get  # read at each pick, as the gate's registry is after a reload
    return keys


def claim(name: str, terms: dict[str, Terms], asked: Priority | None = None) -> Claim:
    return Claim(name, name, terms.get(name, Terms()), asked=asked)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def no_ghosts(fs: FairSlots) -> None:
    """What is kept stays bounded and agrees with itself: the busy count with the shares running,
    the queued count with the queue. (A share's virtual time left behind the clock may stay until
    the table is trimmed: ``fairness.start`` reads it as the clock, as if it were gone.)"""
    assert len(fs._vtime) <= slots_module.MAX_SHARES
    assert fs.busy == sum(fs.running().values())
    assert len(fs._entries()) == len(fs.waiting()) == sum(fs._queued.values())


class Served:
    """Workers that each take a slot, note their name, hold it ``hold`` seconds, and give it back."""

    def __init__(self, fs: FairSlots, hold: float = 0.0):
        self.fs, self.hold, self.order = fs, hold, []  # type: ignore[var-annotated]

    def start(self, c: Claim, name: str) -> asyncio.Task:
        async def work() -> None:
            slot = await self.fs.take(c)
            try:
                self.order.append(name)
                await asyncio.sleep(self.hold)
            finally:
                self.fs.give(slot)
        return asyncio.create_task(work())


async def test_grant_order_under_contention():
    terms = {"a": Terms(), "b": Terms(), "c": Terms(priority=Priority.BATCH), "d": Terms(priority=Priority.INTERACTIVE)}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))  # free and nobody waits: at once
    assert fs.busy == 1 and fs.running() == {"h": 1}
    served = Served(fs)
    tasks = [served.start(claim(n, terms), label) for n, label in
             (("c", "c1"), ("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("d", "d1"))]
    await settle()
    assert [(label, prio) for label, prio, _ in fs.waiting()] == [
        ("c", "batch"), ("a", "normal"), ("a", "normal"), ("a", "normal"), ("b", "normal"), ("d", "interactive")]
    fs.give(holder)
    await asyncio.gather(*tasks)
    # interactive first; then a and b in turns (b's first before a's second, though it came later);
    # batch only once nothing else waits
    assert served.order == ["d1", "a1", "b1", "a2", "a3", "c1"]
    assert fs.busy == 0 and fs.waiting() == [] and fs.running() == {}
    no_ghosts(fs)


async def test_a_request_may_lower_its_priority_never_raise_it():
    terms = {"a": Terms(), "b": Terms(priority=Priority.BATCH)}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))
    served = Served(fs)
    tasks = [served.start(claim("a", terms, asked=Priority.BATCH), "a-lowered"),
             served.start(claim("b", terms, asked=Priority.INTERACTIVE), "b-raised"),
             served.start(claim("a", terms), "a")]
    await settle()
    assert [p for _, p, _ in fs.waiting()] == ["batch", "batch", "normal"]
    fs.give(holder)
    await asyncio.gather(*tasks)
    # a's key normal: its own request first; then both batch, b first (a just had its turn)
    assert served.order == ["a", "b-raised", "a-lowered"]


async def test_a_waiter_cancelled_while_waiting_leaves_no_ghost():
    terms: dict[str, Terms] = {}
    fs = FairSlots("m", 2, keyed(terms))
    first, second = await fs.take(claim("x", terms)), await fs.take(claim("h", terms))
    leaving = asyncio.create_task(fs.take(claim("gone", terms)))
    staying = Served(fs)
    stays = staying.start(claim("y", terms), "y")
    await settle()
    assert len(fs.waiting()) == 2
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert [label for label, _, _ in fs.waiting()] == ["y"] and fs.busy == 2
    assert "gone" not in fs._vtime  # never let in, nothing kept of it
    no_ghosts(fs)
    fs.give(first)
    await stays
    fs.give(second)
    assert staying.order == ["y"] and fs.busy == 0 and fs.waiting() == [] and fs.running() == {}
    no_ghosts(fs)


async def test_a_share_that_leaves_behind_the_clock_is_forgotten():
    terms: dict[str, Terms] = {}
    fs = FairSlots("m", 1, keyed(terms))
    fs.give(await fs.take(claim("x", terms)))  # x is served at once: ahead of the clock by what it held
    assert fs._vtime["x"] > fs._clock
    y = await fs.take(claim("y", terms))
    await asyncio.sleep(0.05)
    fs.give(y)  # y held its slot far longer than x ...
    y = await fs.take(claim("y", terms))  # ... so its next start moves the clock past x's time
    assert fs._vtime["x"] <= fs._clock
    leaving = asyncio.create_task(fs.take(claim("x", terms)))
    await settle()
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert "x" not in fs._vtime and fs.waiting() == [] and fs.running() == {"y": 1}
    fs.give(y)


async def test_a_waiter_cancelled_after_its_slot_was_handed_gives_it_back():
    terms: dict[str, Terms] = {}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))
    handed = asyncio.create_task(fs.take(claim("a", terms)))
    served = Served(fs)
    after = served.start(claim("b", terms), "b")
    await settle()
    fs.give(holder)  # the slot goes to a's future ...
    assert fs.running() == {"a": 1}
    handed.cancel()  # ... but a leaves before its task runs again
    with pytest.raises(asyncio.CancelledError):
        await handed
    await after
    assert served.order == ["b"] and fs.busy == 0 and fs.running() == {} and fs.waiting() == []
    no_ghosts(fs)


async def test_a_waiter_cancelled_just_before_its_slot_frees_leaves_quietly():
    # the client leaves (its task cancelled, so its future is) and, before its task runs, a slot
    # frees: the freed slot skips it, and it still ends as cancelled, nothing else raised
    terms: dict[str, Terms] = {}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))
    leaving = asyncio.create_task(fs.take(claim("a", terms)))
    served = Served(fs)
    after = served.start(claim("b", terms), "b")
    await settle()
    leaving.cancel()
    fs.give(holder)
    with pytest.raises(asyncio.CancelledError):
        await leaving
    await after
    assert served.order == ["b"] and fs.busy == 0 and fs.waiting() == [] and fs.running() == {}
    no_ghosts(fs)


async def test_a_reload_changing_a_keys_priority_reorders_the_waiting():
    terms = {"a": Terms(), "b": Terms()}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))
    served = Served(fs, hold=0.01)
    tasks = [served.start(claim("a", terms), "a1"), served.start(claim("a", terms), "a2"),
             served.start(claim("b", terms), "b1"), served.start(claim("b", terms), "b2")]
    await settle()
    fs.give(holder)
    await settle()
    assert served.order == ["a1"]
    terms["b"] = Terms(priority=Priority.INTERACTIVE)  # the keys file reloaded while they wait
    assert [p for label, p, _ in fs.waiting() if label == "b"] == ["interactive", "interactive"]
    await asyncio.gather(*tasks)
    assert served.order == ["a1", "b1", "b2", "a2"]


async def test_a_reload_changing_a_keys_weight_reorders_the_waiting():
    terms = {"a": Terms(), "b": Terms()}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))
    served = Served(fs, hold=0.02)
    tasks = [served.start(claim(n, terms), f"{n}{i}") for i in (1, 2, 3, 4) for n in "ab"]
    await settle()
    terms["a"] = Terms(weight=1000.0)  # a's share now weighs a thousand b's
    fs.give(holder)
    await asyncio.gather(*tasks)
    # weights 1:1 would alternate a b a b ...; at 1000:1 b gets one turn, a's charge is nearly nothing
    assert served.order == ["a1", "b1", "a2", "a3", "a4", "b2", "b3", "b4"]


async def test_ten_thousand_waiters_of_one_share_do_not_hold_back_another():
    terms: dict[str, Terms] = {}
    fs = FairSlots("m", 1, keyed(terms))
    holder = await fs.take(claim("h", terms))
    served = Served(fs)
    many = [served.start(claim("batch-job", terms), "a") for _ in range(10_000)]
    one = served.start(claim("editor", terms), "b")
    await settle()
    assert len(fs.waiting()) == 10_001
    began = time.monotonic()
    fs.give(holder)
    await one
    assert served.order[:2] == ["a", "b"]  # the editor's request: at the second free slot, not the 10,001st
    for t in many:
        t.cancel()
    await asyncio.gather(*many, return_exceptions=True)
    assert fs.waiting() == [] and fs.busy == 0 and fs.running() == {}
    no_ghosts(fs)
    assert time.monotonic() - began < 30  # it completes (no timing claim beyond that)


async def test_the_virtual_time_table_stays_bounded_with_many_address_shares():
    fs = FairSlots("m", 1, Unkeyed())
    n = slots_module.MAX_SHARES + 500
    for i in range(n):
        slot = await fs.take(Claim(f"addr:10.0.{i // 256}.{i % 256}"))
        fs.give(slot)
        assert len(fs._vtime) <= slots_module.MAX_SHARES
    no_ghosts(fs)


async def test_door_closed_waits_then_503_model_loading_and_opens():
    door = Door()
    assert not door.closed
    await asyncio.wait_for(door.through("m", 0.01), 1)  # open: at once
    door.close()
    door.close()  # twice: still one closing
    assert door.closed
    with pytest.raises(ApiError) as e:
        await door.through("m", 0.05)
    assert e.value.status == 503 and e.value.code == "model_loading" and e.value.param == "model"
    assert "Retry-After" in e.value.headers and "'m'" in e.value.message
    waiting = [asyncio.create_task(door.through("m", 5)) for _ in range(3)]
    await settle()
    assert not any(t.done() for t in waiting)
    door.open()
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert not door.closed
    door.open()  # open twice: nothing


async def test_waits_counts_the_oldest_and_cleans_up_on_exceptions():
    waits = Waits()
    assert len(waits) == 0 and waits.oldest() is None
    before = time.monotonic()
    with waits.one():
        first = waits.oldest()
        assert first is not None and first >= before and len(waits) == 1
        with pytest.raises(RuntimeError):
            with waits.one():
                assert len(waits) == 2 and waits.oldest() == first  # the oldest is still the first
                raise RuntimeError("the client left")
        assert len(waits) == 1 and waits.oldest() == first
    assert len(waits) == 0 and waits.oldest() is None

    async def wait_then_cancelled() -> None:
        with waits.one():
            await asyncio.sleep(10)

    t = asyncio.create_task(wait_then_cancelled())
    await settle()
    assert len(waits) == 1
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert len(waits) == 0


ops = st.lists(st.one_of(
    st.tuples(st.just("take"), st.sampled_from("abc"), st.sampled_from(list(Priority))),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
    st.tuples(st.just("give"), st.integers(0, 40)),
    st.tuples(st.just("tick"))), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 3))
def test_any_sequence_of_takes_leaves_and_gives_keeps_the_books(script, n):
    """Random takes, cancellations (before, at and after a slot is handed) and gives, with or
    without the loop running between them: the books always agree, a free slot never stays free
    while someone waits, and at the end nothing is left."""

    async def scene() -> None:
        terms = {"a": Terms(), "b": Terms(priority=Priority.BATCH), "c": Terms(weight=3.0)}
        fs = FairSlots("m", n, keyed(terms))
        tasks: list[asyncio.Task] = []
        held: list = []
        seen: set[int] = set()

        def collect() -> None:
            for i, t in enumerate(tasks):
                if i not in seen and t.done():
                    seen.add(i)
                    if not t.cancelled():
                        held.append(t.result())  # raises what take raised, were it anything else

        def books() -> None:
            assert 0 <= fs.busy <= fs.slots and fs.busy == sum(fs.running().values())
            assert len(fs._entries()) == sum(fs._queued.values())
            live = [e for e in fs._entries() if not e.granted.done()]
            assert not live or fs.busy == fs.slots  # work-conserving

        for op in script:
            if op[0] == "take":
                tasks.append(asyncio.create_task(fs.take(claim(op[1], terms, asked=op[2]))))
            elif op[0] == "cancel" and tasks:
                tasks[op[1] % len(tasks)].cancel()
            elif op[0] == "give" and held:
                fs.give(held.pop(op[1] % len(held)))
            else:
                await asyncio.sleep(0)
                collect()
            books()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        collect()
        for slot in held:
            fs.give(slot)
        assert fs.busy == 0 and fs.waiting() == [] and fs.running() == {} and not fs._queued
        assert len(fs._vtime) <= slots_module.MAX_SHARES

    asyncio.run(scene())
