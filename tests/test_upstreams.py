"""Upstreams' health and listed models (gateway/backends/upstream_health.py, upstream_table.py), without
a network: the state machine and its back-off, what discovered models inherit, and what a
reload keeps."""

import time

import pytest

from gateway.backends.upstream_health import Health
from gateway.backends.upstream_table import Upstreams
from gateway.models.config import ModelSpec, Upstream


def entry(name="box", **kw):
    return ModelSpec(name=name, upstream=Upstream("http://box:8080/v1", discover=True, prefix="box/"), **kw)


def test_health_goes_down_with_a_doubling_back_off_and_up_again():
    ups = Upstreams(backoff=(2.0, 5.0))
    h = ups.health(entry())
    assert h.state is Health.UNKNOWN and h.wait == 0
    h.failed("refused")
    assert h.state is Health.DOWN and 1.5 < h.wait <= 2.0 and h.unavailable().code == "upstream_unavailable"
    h.failed("refused")
    assert 3.5 < h.wait <= 4.0
    h.failed("refused")
    assert 4.5 < h.wait <= 5.0  # the cap
    assert h.describe() == {"state": "down", "error": "refused", "retry_after": round(h.wait, 1)}
    h.succeeded()
    assert h.state is Health.UP and h.wait == 0 and h.failures == 0 and h.error is None


def test_discovered_models_inherit_the_entry_and_share_its_health():
    ups = Upstreams()
    spec = entry(reasoning="think", defaults={"temperature": 0.1}, keep_alive=60.0, aliases=("b",))
    ups.sync([spec])
    h = ups.health(spec)
    ups.listed(h, ["qwen3:8b", "llama3"])
    found = {s.name: s for s in ups.discovered()}
    assert set(found) == {"box/qwen3:8b", "box/llama3"}
    q = found["box/qwen3:8b"]
    assert (q.reasoning, q.defaults, q.keep_alive, q.aliases) == ("think", {"temperature": 0.1}, 60.0, ())
    assert q.upstream.model == "qwen3:8b" and not q.upstream.discover
    assert ups.health(q) is h and ups.resolve("box/llama3").upstream.model == "llama3"


def test_a_reload_keeps_what_is_still_configured():
    ups = Upstreams()
    a, b = entry("a"), entry("b")
    ups.sync([a, b])
    ups.health(a).failed("x")
    ups.sync([a])
    assert [h.name for h in ups.known()] == ["a"] and ups.health(a).state is Health.DOWN
    assert ups._due(ups.health(a), time.monotonic() + 10)  # down: due once its back-off is over


async def test_within_never_loses_a_cancellation_and_discards_what_it_abandons():
    """asyncio.wait_for before Python 3.12 returns a step's result when the caller is cancelled
    as the step finishes: under a flood every read finishes at once, so a client's going was lost."""
    import asyncio

    from gateway.backends.upstream import within

    async def reader(n: int) -> None:
        for _ in range(n):
            await within(asyncio.sleep(0, "chunk"), 10)  # finishes at once, as a read under a flood does

    task = asyncio.ensure_future(reader(1000))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async def stubborn() -> str:  # a step that makes its result all the same (a response that came as time ran out)
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            pass
        return "response"

    discarded: list[str] = []
    with pytest.raises(asyncio.TimeoutError):  # what comes after its time is not taken: discarded
        await within(stubborn(), 0.01, discarded.append)
    await asyncio.sleep(0.05)
    assert discarded == ["response"]
    assert await within(asyncio.sleep(0, "ok"), None) == "ok"


def test_a_list_is_made_anew_only_when_it_changed():
    ups = Upstreams()
    spec = entry()
    ups.sync([spec])
    h = ups.health(spec)
    ups.listed(h, ["a"])
    table = ups._found
    ups.listed(h, ["a"])
    assert ups._found is table
    ups.listed(h, ["a", "b"])
    assert set(ups._found) == {"box/a", "box/b"}
