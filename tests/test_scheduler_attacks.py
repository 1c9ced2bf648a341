"""The scheduler attacked from outside, in process against real worker processes and scripted
models: loads that wait for room together, clients that leave at each stage of a swap, and what
each leaves behind (``/admin/queues`` empty, a new request served at once)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.access.claims import Claim
from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.serving import fairness
from gateway.serving.slots import FairSlots, Slot, Unkeyed
from tests.helpers import ServerProcess, request

ROOT = "root-key"
HEADERS = {"Authorization": f"Bearer {ROOT}"}


def chat(model: str, n: int = 2, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": n, **kw}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("scheduler")
    for name in "abc":
        tm.endless(d / f"{name}.gguf", context_length=65536)
    return d


def swap_config(write_config, files, extra: str = ""):
    return load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n"
        f"  max_loaded_models: 1\n  swap_hold_seconds: 0.2\n  max_swap_wait: 2\n  load_timeout: 20\n{extra}"
        "models:\n" + "".join(f"  {n}:\n    path: {files}/{n}.gguf\n    n_ctx: 65536\n" for n in "abc")))


async def post(client, body):
    began = time.monotonic()
    r = await client.post("/v1/chat/completions", json=body, headers=HEADERS)
    return r.status, time.monotonic() - began, await r.text()


async def test_two_loads_waiting_for_one_place_do_not_wait_for_each_other(aiohttp_client, write_config, files):
    """Room for one model, one loaded, and requests for two others at once: each load is one swap
    after the other, not both waiting (each counting the other's load under way as a loaded
    model) until the load timeout."""
    client = await aiohttp_client(create_app(swap_config(write_config, files)))
    assert (await post(client, chat("a")))[0] == 200
    answers = await asyncio.gather(post(client, chat("b")), post(client, chat("c")))
    for status, seconds, text in answers:
        assert status == 200, text
        assert seconds < 15, seconds
    queues = await (await client.get("/admin/queues", headers=HEADERS)).json()
    assert queues == {"queues": []}


async def queues(client) -> list[dict]:
    return (await (await client.get("/admin/queues", headers=HEADERS)).json())["queues"]


async def row(client, model: str) -> dict | None:
    return next((r for r in await queues(client) if r["model"] == model), None)


async def until(check, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_a_swap_whose_requests_all_left_is_given_up_and_the_closed_model_reopens(aiohttp_client, write_config,
                                                                                        tmp_path):
    """A request for b waits past max_swap_wait, which closes the busy a to new requests; then it
    leaves. The swap is for nobody now: a opens again at once (a request for it answers while a's
    long answer still runs), nothing is unloaded, and no load of b is left waiting."""
    tm.endless(tmp_path / "a.gguf", context_length=65536)
    tm.endless(tmp_path / "b.gguf", context_length=65536)
    client = await aiohttp_client(create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n"
        "  max_loaded_models: 1\n  swap_hold_seconds: 0.2\n  max_swap_wait: 1\n  load_timeout: 60\n"
        f"models:\n  a:\n    path: {tmp_path}/a.gguf\n    n_ctx: 65536\n  b: {tmp_path}/b.gguf\n"))))
    assert (await post(client, chat("a")))[0] == 200
    long = asyncio.create_task(post(client, chat("a", 60000)))  # holds a slot of a for a long while
    await until(lambda: _running(client, "a"))
    wants_b = asyncio.create_task(post(client, chat("b")))
    await until(lambda: _closed(client, "a"))
    wants_b.cancel()
    await asyncio.gather(wants_b, return_exceptions=True)
    status, seconds, text = await post(client, chat("a"))
    assert status == 200, text
    assert seconds < 5, seconds
    assert not long.done()
    assert [r["model"] for r in await queues(client)] == ["a"]  # the long answer only: no load of b
    long.cancel()
    await asyncio.gather(long, return_exceptions=True)
    await until(lambda: _empty(client))
    metrics = await (await client.get("/metrics", headers=HEADERS)).text()
    assert "gguf_gateway_swaps_total{" not in metrics


async def _running(client, model: str) -> bool:
    found = await row(client, model)
    return found is not None and found["running"] > 0


async def _closed(client, model: str) -> bool:
    found = await row(client, model)
    return found is not None and found["closed"]


async def _empty(client) -> bool:
    return await queues(client) == []


@pytest.mark.slow
def test_the_load_whose_turn_it_is_gets_the_place_it_made(files, tmp_path):
    """Room for one, a loaded and idle; a request for b, then at once one for c. b's waited
    longest, so b unloads a: the place is b's, not c's, though c's load looks while a's worker
    stops (c then waits for b's answer and its hold, a swap later). Through the server as a
    process, where a's stop takes long enough for c's load to look (in process it rarely does)."""
    config = tmp_path / "models.yaml"
    config.write_text(f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n"
                      "  max_loaded_models: 1\n  swap_hold_seconds: 1\n  max_swap_wait: 3\n  load_timeout: 20\n"
                      "models:\n" + "".join(f"  {n}:\n    path: {files}/{n}.gguf\n    n_ctx: 65536\n" for n in "abc"))
    with ServerProcess("--config", str(config), env={"HOME": str(tmp_path)}) as srv:
        assert request(srv.url + "/v1/chat/completions", chat("a"), headers=HEADERS)[0] == 200
        with ThreadPoolExecutor(2) as pool:
            b = pool.submit(request, srv.url + "/v1/chat/completions", chat("b"), headers=HEADERS)
            time.sleep(0.01)
            c = pool.submit(request, srv.url + "/v1/chat/completions", chat("c"), headers=HEADERS)
            assert b.result()[0] == c.result()[0] == 200
        srv.stop()
        swaps = [line.split("swap: ")[1][:30] for line in srv.output().splitlines() if "swap: unloading" in line]
    assert swaps == ["unloading 'a' to load 'b' (idl", "unloading 'b' to load 'c' (idl"], swaps


async def test_waiters_that_leave_as_a_slot_frees_leave_with_their_cancel_and_no_ghost():
    """Many clients leave in the same turn of the event loop in which a slot frees: the freed
    slot's hand-out passes over (and takes out) the waiters already cancelled, and each of those
    leaves with its cancel (it answered 500 with a ValueError traceback each: hundreds at once
    through the server, as seen with 300 clients leaving a full model), the slot going to the
    first waiter still there."""
    slots = FairSlots("m", 1, Unkeyed())
    held = await slots.take(Claim("holder"))
    waiters = [asyncio.create_task(slots.take(Claim(f"addr:{i}"))) for i in range(20)]
    await asyncio.sleep(0)
    for w in waiters[:10]:
        w.cancel()
    slots.give(held)  # the same turn: the hand-out meets the ten cancelled first
    results = await asyncio.gather(*waiters[:11], return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results[:10]), results[:10]
    granted = results[10]
    assert isinstance(granted, Slot) and granted.share == "addr:10"
    assert slots.busy == 1 and len(slots.waiting()) == 9
    for w in waiters[11:]:
        w.cancel()
    await asyncio.gather(*waiters[11:], return_exceptions=True)
    slots.give(granted)
    assert slots.busy == 0 and slots.waiting() == [] and slots.running() == {}
    assert (await slots.take(Claim("late"))).share == "late"  # at once: nothing left behind


def test_a_request_overdue_is_not_starved_by_its_keys_low_weight():
    """Key bob of weight 0.001 beside alice of 1000 on one slot: bob's one request set its virtual
    time ~10^4 s ahead, and while alice kept requests coming bob's next request waited for all of
    them (15 s of 15 through the server, 8 clients of alice's, priority_max_wait 3; 3.0 s after).
    Once overdue it goes before a share ahead of the clock; before that, and for alice's old
    backlog against a fresh share, fairness decides as before."""
    clock, now, wait = 100.0, 500.0, 3.0
    vtimes = {"alice": clock + 0.001, "bob": clock + 1e4}
    steady = [fairness.Waiter("alice", 1, now - 1 + i / 10) for i in range(5)]  # a steady stream
    assert fairness.pick([*steady, fairness.Waiter("bob", 1, now - 1)], vtimes, clock, now, wait) == 0
    assert fairness.pick([*steady, fairness.Waiter("bob", 1, now - wait)], vtimes, clock, now, wait) == 5
    # alice's backlog grown old against carol's fresh request (an idle share, at the clock): carol,
    # as alice was let in lately and carol never
    backlog = [fairness.Waiter("alice", 1, now - 60 + i) for i in range(5)]
    served = {"alice": now - 0.5, "bob": now - 400}
    assert fairness.pick([*backlog, fairness.Waiter("carol", 1, now)], vtimes, clock, now, wait, served) == 5
    # alice's old backlog against bob's overdue request, both level at the clock: bob, let in least
    # recently (it waited for alice's whole backlog before: 35.8 s of it, priority_max_wait 1)
    old_bob = fairness.Waiter("bob", 1, now - wait)
    assert fairness.pick([*backlog, old_bob], vtimes, clock, now, wait, served) == 5
