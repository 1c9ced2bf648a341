"""The dashboard's live data (``gateway.server.live``): pure, driven with events and a clock."""

from gateway.server.live import Live


def event(t, model="m", status=200, tokens=5, ttft=0.5, endpoint="/v1/chat/completions", finish="stop"):
    return {"time": t, "model": model, "endpoint": endpoint, "status": status, "completion_tokens": tokens,
            "time_to_first_token_s": ttft, "finish_reason": finish}


def test_events_are_counted_per_model_in_their_interval():
    live = Live(interval=5, points=10)
    live.record(event(100.0))
    live.record(event(101.0, ttft=1.5, tokens=7))
    live.record(event(102.0, model="n", status=503, tokens=0, ttft=None, finish=None))
    live.record(event(106.0, finish="error"))
    points = live.series(now=107.0)["points"]
    assert [p["t"] for p in points] == [100.0, 105.0]
    m = points[0]["models"]["m"]
    assert (m["requests"], m["errors"], m["tokens"], m["ttft_count"]) == (2, 0, 12, 2)
    assert m["ttft_sum"] == 2.0
    assert points[0]["models"]["n"]["errors"] == 1 and points[0]["models"]["n"]["ttft_count"] == 0
    assert points[1]["models"]["m"]["errors"] == 1  # an answer cut short by an error counts as one


def test_the_window_keeps_only_the_last_points_and_drops_old_ones_by_time():
    live = Live(interval=1, points=3)
    for t in range(10):
        live.record(event(float(t)))
    assert [p["t"] for p in live.series(now=9.5)["points"]] == [7.0, 8.0, 9.0]
    assert live.series(now=100.0)["points"] == []  # nothing happened in the last three seconds
    assert live.series(now=9.5)["interval_s"] == 1


def test_recent_is_newest_first_bounded_and_skips_the_gateways_own_requests():
    live = Live(recent=3)
    for i in range(5):
        live.record(event(float(i), model=f"m{i}"))
    live.record(event(9.0, endpoint="/models/load"))
    live.record(event(9.0, endpoint="/models"))
    assert [e["model"] for e in live.recent(everyone=True)] == ["m4", "m3", "m2"]
    assert all(p["models"].keys() <= {"m0", "m1", "m2", "m3", "m4"} for p in live.series(now=10.0)["points"])


def test_a_late_event_counts_in_the_newest_point():
    live = Live(interval=5)
    live.record(event(110.0))
    live.record(event(101.0))  # began long ago, ended (and recorded) now
    points = live.series(now=111.0)["points"]
    assert len(points) == 1 and points[0]["models"]["m"]["requests"] == 2


def test_recent_is_each_owners_own_and_the_owner_is_not_in_the_events():
    live = Live()
    live.record(event(1.0, model="a"), owner="key-a")
    live.record(event(2.0, model="b"), owner="key-b")
    live.record(event(3.0, model="open"))  # no key given (an open path)
    assert [e["model"] for e in live.recent(owner="key-a")] == ["a"]
    assert [e["model"] for e in live.recent(owner="key-b")] == ["b"]
    assert live.recent() == [] and live.recent(owner=None) == []  # no owner: none of them
    assert [e["model"] for e in live.recent(everyone=True)] == ["open", "b", "a"]
    assert all("owner" not in e for e in live.recent(everyone=True))
