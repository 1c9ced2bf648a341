"""The Responses store (gateway/server/response_store.py): bounded by count and by bytes, least
recently used dropped first, shared out by owner (a key that floods it pushes out its own)."""

import tracemalloc

from gateway.server.response_store import ResponseStore, Stored, encode


def stored(text: str) -> Stored:
    return Stored({"id": "r", "output_text": text}, [{"role": "user", "content": text}])


def test_the_least_recently_used_go_first_past_the_count():
    store = ResponseStore(2)
    store.put("a", stored("1"))
    store.put("b", stored("2"))
    assert store.get("a") is not None  # a is now the most recent
    store.put("c", stored("3"))
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None
    assert store.delete("a") and not store.delete("a")
    assert ResponseStore(0).get("x") is None


def test_bytes_bound_what_is_kept_and_stay_counted():
    one = stored("x" * 300)
    size = ResponseStore.size("0", encode(one))
    store = ResponseStore(100, max_bytes=2000)
    for i in range(10):
        store.put(str(i), stored("x" * 300))
    kept = [str(i) for i in range(10) if store.get(str(i)) is not None]
    assert kept == [str(i) for i in range(10 - 2000 // size, 10)] and store.bytes == len(kept) * size <= 2000
    store.put("big", stored("x" * 5000))  # larger than the whole bound: not kept, nothing dropped for it
    assert store.get("big") is None and store.get("9") is not None
    store.put("9", stored("y"))  # kept again under the same id: counted once
    for key in kept:
        assert store.delete(key)
    assert store.bytes == 0


def test_a_response_belongs_to_the_key_that_made_it():
    store = ResponseStore(10)
    store.put("r1", stored("alice's"), owner="alice")
    assert store.get("r1", "alice") is not None
    assert store.get("r1", "bob") is None and store.get("r1") is None  # as if unknown
    assert not store.delete("r1", "bob") and store.get("r1", "alice") is not None
    assert store.delete("r1", "alice") and store.bytes == 0
    store.put("r2", stored("anyone's"))  # a server without keys: no owner
    assert store.get("r2") is not None and store.get("r2", "alice") is None


def test_memory_held_stays_near_the_bound_with_many_tiny_messages():
    """The bound is on what the store really holds: a conversation of many tiny messages kept
    as Python objects took several times its JSON size."""
    bound = 4 * 2**20
    store = ResponseStore(100_000, max_bytes=bound)
    tiny = [{"role": "user", "content": "a"}] * 2000
    tracemalloc.start()
    try:
        for i in range(200):
            store.put(f"r{i}", Stored({"id": f"r{i}"}, [dict(m) for m in tiny]))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.bytes <= bound and len(store) < 200  # the bound dropped some
    assert held < 1.5 * bound, f"the store holds {held} bytes of Python memory for a bound of {bound}"
    assert store.get("r199").messages == tiny  # what comes back is what went in


def test_an_owner_over_its_share_gives_up_its_own_first():
    """Past either bound, the owner holding the most loses its least recently used: another
    owner within its share keeps everything it stored, whichever came first."""
    store = ResponseStore(4)
    store.put("alice-1", stored("a"), owner="alice")
    for i in range(10):
        store.put(f"bob-{i}", stored("b"), owner="bob")
    assert store.get("alice-1", "alice") is not None and len(store) == 4
    assert [i for i in range(10) if store.get(f"bob-{i}", "bob")] == [7, 8, 9]
    one = ResponseStore.size("alice-1", encode(stored("x" * 300)))
    store = ResponseStore(100, max_bytes=5 * one)
    store.put("alice-1", stored("x" * 300), owner="alice")
    store.put("alice-2", stored("x" * 300), owner="alice")
    for i in range(10):
        store.put(f"bob-{i:03d}", stored("x" * 300), owner="bob")  # ids as long as the others
    assert store.get("alice-1", "alice") and store.get("alice-2", "alice")
    assert store.bytes <= 5 * one and store.held("bob") == 3 * one and store.held("alice") == 2 * one
    # an owner holding more than its share is brought down to it by another's stores
    for i in range(10):
        store.put(f"carol-{i}", stored("x" * 300), owner="carol")
    assert store.held("alice") == 2 * one and store.held("bob") <= 2 * one and store.bytes <= 5 * one
