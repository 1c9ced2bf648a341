"""The Responses store (gateway/response_store.py): bounded by count and by bytes, least
recently used dropped first."""

import json

from gateway.response_store import ResponseStore, Stored


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
    size = len(json.dumps(one.body)) + len(json.dumps(one.messages))
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
