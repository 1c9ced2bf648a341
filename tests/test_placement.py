"""The placement policy and the lifecycle's moves, as pure functions: a state in, a decision out."""

from dataclasses import replace

import pytest

from gateway.models.lifecycle import MOVES, ModelState, move
from gateway.models.placement import (
    Replica,
    Resident,
    Room,
    backoff,
    cache_trims,
    cpu_shares,
    make_room,
    replica_order,
)

U, L, R, F = ModelState.UNLOADED, ModelState.LOADING, ModelState.READY, ModelState.FAILED


@pytest.mark.parametrize("others, limit, decision", [
    ([], 1, (Room.FITS, None)),
    ([Resident("a", R)], 0, (Room.FITS, None)),  # 0: no limit
    ([Resident("a", R), Resident("b", R)], 3, (Room.FITS, None)),
    ([Resident("a", U), Resident("b", F)], 1, (Room.FITS, None)),  # neither holds memory
    ([Resident("a", R, last_used=5), Resident("b", R, last_used=2)], 2, (Room.EVICT, "b")),  # least recently used
    ([Resident("a", R, in_flight=1, last_used=1), Resident("b", R, last_used=9)], 2, (Room.EVICT, "b")),
    ([Resident("a", R, in_flight=1), Resident("b", L)], 2, (Room.WAIT, None)),  # busy, and a load under way
    ([Resident("a", L)], 1, (Room.WAIT, None)),  # a loading model counts and cannot be evicted
    ([Resident("a", R, last_used=3), Resident("b", R, last_used=3)], 1, (Room.EVICT, "a")),  # first of equals
    ([Resident("a", R, last_used=1), Resident("b", R, last_used=2), Resident("c", R, last_used=3)], 2,
     (Room.EVICT, "a")),  # over the limit (lowered by a reload): one at a time
    ([Resident("a", R, last_used=1, pinned=True), Resident("b", R, last_used=2)], 2, (Room.EVICT, "b")),  # pinned stay
    ([Resident("a", R, pinned=True), Resident("b", R, in_flight=1)], 2, (Room.WAIT, None)),  # b will go idle
    ([Resident("a", R, pinned=True), Resident("b", L, pinned=True)], 2, (Room.NEVER, None)),  # nothing will free
    ([Resident("a", R, pinned=True)], 2, (Room.FITS, None)),
])
def test_make_room(others, limit, decision):
    assert make_room(others, limit) == decision


@pytest.mark.parametrize("busy, cpus, shares", [
    ([], 8, {}),
    ([("a", None)], 8, {"a": 8}),
    ([("a", None), ("b", None)], 8, {"a": 4, "b": 4}),
    ([("a", 2), ("b", None)], 8, {"a": 2, "b": 4}),  # never more than configured
    ([("a", None), ("b", None), ("c", None)], 2, {"a": 1, "b": 1, "c": 1}),  # at least one each
    ([("a", None), ("b", None), ("c", None)], 16, {"a": 5, "b": 5, "c": 5}),
])
def test_cpu_shares(busy, cpus, shares):
    assert cpu_shares(busy, cpus) == shares


def test_the_lifecycle_moves():
    assert move(U, L) is L and move(L, R) is R and move(R, U) is U and move(L, F) is F and move(F, L) is L
    assert move(R, R) is R  # staying is not a move
    for bad in [(U, R), (U, F), (R, L), (R, F), (F, R), (F, U)]:
        with pytest.raises(ValueError):
            move(*bad)
    assert set(MOVES) == set(ModelState)


@pytest.mark.parametrize("replicas, order", [
    ([], []),
    ([Replica("a", True, 0, 4), Replica("b", True, 0, 4)], ["a", "b"]),  # equals keep the configured order
    ([Replica("a", True, 3, 4), Replica("b", True, 1, 4)], ["b", "a"]),  # more free slots first
    ([Replica("a", True, 2, 8), Replica("b", True, 1, 2)], ["a", "b"]),  # 6 free beats 1 free
    ([Replica("a", True, 6, 4), Replica("b", True, 5, 2)], ["a", "b"]),  # 2 waiting beat 3 waiting
    ([Replica("a", False, 0, 4), Replica("b", True, 9, 1)], ["b"]),  # not ready: never tried
    ([Replica("a", True, 4, 4), Replica("b", True, 1, 1)], ["b", "a"]),  # both full: fewer in flight first
])
def test_replica_order(replicas, order):
    assert replica_order(replicas) == order


@pytest.mark.parametrize("failures, wait", [(1, 5.0), (2, 10.0), (3, 20.0), (7, 300.0), (30, 300.0)])
def test_backoff_doubles_up_to_its_cap(failures, wait):
    assert backoff(failures, 5.0, 300.0) == wait


MiB = 2**20


def ram(n: int) -> dict[str, int]:
    return {"ram": n}


@pytest.mark.parametrize("others, limit, need, capacity, decision", [
    ([], 0, ram(100 * MiB), None, (Room.FITS, None)),  # memory not counted
    ([Resident("a", R, memory=ram(300 * MiB))], 0, ram(100 * MiB), ram(500 * MiB), (Room.FITS, None)),
    ([Resident("a", R, memory=ram(450 * MiB), last_used=1), Resident("b", R, memory=ram(10 * MiB), last_used=2)], 0,
     ram(100 * MiB), ram(500 * MiB), (Room.EVICT, "a")),  # least recently used first, whatever it holds
    ([Resident("a", R, memory=ram(450 * MiB), in_flight=1)], 0, ram(100 * MiB), ram(500 * MiB), (Room.WAIT, None)),
    ([Resident("a", L, memory=ram(450 * MiB))], 0, ram(100 * MiB), ram(500 * MiB),
     (Room.WAIT, None)),  # a load holds its estimate
    ([], 0, ram(600 * MiB), ram(500 * MiB), (Room.TOO_LARGE, None)),  # not even alone
    ([Resident("a", R, memory=ram(300 * MiB), pinned=True)], 0, ram(300 * MiB), ram(500 * MiB),
     (Room.TOO_LARGE, None)),
    ([Resident("a", R, memory=ram(100 * MiB), pinned=True), Resident("b", R, memory=ram(300 * MiB))], 0,
     ram(300 * MiB), ram(500 * MiB), (Room.EVICT, "b")),  # the pinned one stays
    ([Resident("a", R, memory=ram(10 * MiB), last_used=1), Resident("b", R, memory=ram(10 * MiB), last_used=2)], 2,
     ram(10 * MiB), ram(500 * MiB), (Room.EVICT, "a")),  # memory enough, the count not
    ([Resident("a", U, memory={})], 1, ram(400 * MiB), ram(500 * MiB), (Room.FITS, None)),
])
def test_make_room_by_memory(others, limit, need, capacity, decision):
    assert make_room(others, limit, need, capacity) == decision


GPU = {"ram": 2000 * MiB, "cuda0": 1000 * MiB, "cuda1": 1000 * MiB}


@pytest.mark.parametrize("others, need, decision", [
    # each pool on its own: RAM has room, the GPU not; the model holding GPU memory goes, though
    # another was used less recently
    ([Resident("cpu-only", R, memory=ram(100 * MiB), last_used=1),
      Resident("on-gpu", R, memory={"ram": 50 * MiB, "cuda0": 800 * MiB}, last_used=2)],
     {"ram": 50 * MiB, "cuda0": 300 * MiB}, (Room.EVICT, "on-gpu")),
    # the other GPU is full, this one is not: nothing to unload
    ([Resident("a", R, memory={"cuda1": 900 * MiB})], {"cuda0": 900 * MiB}, (Room.FITS, None)),
    # short on the GPU, and the only model there is busy: wait for it, not for the CPU-only one
    ([Resident("cpu-only", R, memory=ram(100 * MiB), last_used=1),
      Resident("busy", R, memory={"cuda0": 900 * MiB}, in_flight=2)], {"cuda0": 200 * MiB}, (Room.WAIT, None)),
    # a GPU the model needs more of than it has at all
    ([], {"ram": 10 * MiB, "cuda1": 1100 * MiB}, (Room.TOO_LARGE, None)),
    # a pool no capacity names (another machine's: rpc) is not counted
    ([], {"ram": 10 * MiB, "rpc": 10**12}, (Room.FITS, None)),
    # short in two pools: any model holding memory in either may go, least recently used first
    ([Resident("x", R, memory={"cuda0": 900 * MiB}, last_used=5),
      Resident("y", R, memory={"cuda1": 900 * MiB}, last_used=3)],
     {"cuda0": 200 * MiB, "cuda1": 200 * MiB}, (Room.EVICT, "y")),
])
def test_make_room_counts_each_device(others, need, decision):
    assert make_room(others, 0, need, GPU) == decision


# --- prompt caches: counted in RAM, trimmed before a model is evicted ----------------------------

def settle(others: list[Resident], need: dict[str, int], capacity: dict[str, int], limit: int = 0):
    """Carry ``make_room``'s decisions out as the placer does (trim, evict; each then asked again)
    until it fits or cannot; the decisions made and the residents left."""
    made = []
    while True:
        room, name = make_room(others, limit, need, capacity)
        made.append((room, name))
        if room is Room.TRIM:
            keep = cache_trims(others, need, capacity)
            assert keep
            made[-1] = (room, keep)
            others = [replace(r, cache=keep.get(r.name, r.cache)) for r in others]
        elif room is Room.EVICT:
            others = [r for r in others if r.name != name]
        else:
            return made, others


def test_a_cache_is_trimmed_where_an_eviction_would_have_made_room():
    a = Resident("a", R, memory=ram(300 * MiB), last_used=1, cache=100 * MiB)
    b = Resident("b", R, memory=ram(50 * MiB), last_used=2)
    # the same bytes held as the model's own memory: it would go
    assert make_room([replace(a, memory=ram(400 * MiB), cache=0), b], 0, ram(100 * MiB), ram(500 * MiB)) == \
        (Room.EVICT, "a")
    made, left = settle([a, b], ram(100 * MiB), ram(500 * MiB))
    assert made == [(Room.TRIM, {"a": 50 * MiB}), (Room.FITS, None)]  # a stays loaded, its cache halved
    assert [r.name for r in left] == ["a", "b"]


def test_the_least_recently_used_models_caches_are_trimmed_first_and_only_as_far_as_needed():
    others = [Resident("c", R, memory=ram(100 * MiB), last_used=3, cache=50 * MiB),
              Resident("a", R, memory=ram(100 * MiB), last_used=1, cache=30 * MiB),
              Resident("none", R, memory=ram(100 * MiB), last_used=0),  # the least recently used: nothing to trim
              Resident("b", R, memory=ram(100 * MiB), last_used=2, cache=80 * MiB, in_flight=2)]  # busy: trimmed too
    held = 400 * MiB + 160 * MiB
    made, left = settle(others, ram(100 * MiB), ram(held + 100 * MiB - 60 * MiB))
    assert made == [(Room.TRIM, {"a": 0, "b": 50 * MiB}), (Room.FITS, None)]
    assert sum(r.memory["ram"] + r.cache for r in left) + 100 * MiB == held + 40 * MiB  # exactly the capacity
    assert {r.name: r.cache for r in left} == {"c": 50 * MiB, "a": 0, "none": 0, "b": 50 * MiB}


def test_a_pinned_models_cache_is_reclaimable_and_too_large_means_too_large_without_any_cache():
    pinned = Resident("p", R, memory=ram(200 * MiB), pinned=True, cache=200 * MiB)
    assert settle([pinned], ram(300 * MiB), ram(500 * MiB))[0] == [(Room.TRIM, {"p": 0}), (Room.FITS, None)]
    assert make_room([pinned], 0, ram(301 * MiB), ram(500 * MiB)) == (Room.TOO_LARGE, None)
    # caches and an unpinned model: not enough in the caches alone, so the unpinned model goes
    # (its cache with it), then what is still short comes from the pinned model's cache
    other = Resident("o", R, memory=ram(200 * MiB), last_used=5, cache=100 * MiB)
    made, left = settle([replace(pinned, cache=100 * MiB), other], ram(300 * MiB), ram(500 * MiB))
    assert made == [(Room.EVICT, "o"), (Room.TRIM, {"p": 0}), (Room.FITS, None)]
    assert make_room([replace(pinned, cache=100 * MiB), other], 0, ram(301 * MiB), ram(500 * MiB)) == \
        (Room.TOO_LARGE, None)


@pytest.mark.parametrize("others, need, limit, decision", [
    # nothing cached: the decision of before
    ([Resident("a", R, memory=ram(450 * MiB))], ram(100 * MiB), 0, (Room.EVICT, "a")),
    # the caches hold less than RAM is short by: an eviction is needed anyway, and goes first
    ([Resident("a", R, memory=ram(450 * MiB), cache=20 * MiB)], ram(100 * MiB), 0, (Room.EVICT, "a")),
    # short on a GPU too: trimming RAM would not make room there
    ([Resident("g", R, memory={"ram": 450 * MiB, "cuda0": 900 * MiB}, cache=200 * MiB)],
     {"ram": 100 * MiB, "cuda0": 200 * MiB}, 0, (Room.EVICT, "g")),
    # at the count limit: a model must go whatever the caches hold
    ([Resident("a", R, memory=ram(10 * MiB), cache=400 * MiB)], ram(10 * MiB), 1, (Room.EVICT, "a")),
    # a model holding only a cache in the short pool is trimmed, never evicted for it
    ([Resident("c", R, memory={"cuda0": 100 * MiB}, cache=100 * MiB, last_used=1),
      Resident("busy", R, memory=ram(450 * MiB), in_flight=1)], ram(200 * MiB), 0, (Room.WAIT, None)),
    # the caches fit beside the new model: nothing to trim
    ([Resident("a", R, memory=ram(100 * MiB), cache=300 * MiB)], ram(100 * MiB), 0, (Room.FITS, None)),
])
def test_when_caches_are_not_trimmed(others, need, limit, decision):
    capacity = {"ram": 500 * MiB, "cuda0": 1000 * MiB}
    assert make_room(others, limit, need, capacity) == decision
    assert cache_trims(others, need, capacity) == {}
