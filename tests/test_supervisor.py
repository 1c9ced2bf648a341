"""The registry's parts in isolation: one model's supervisor driven through its host, and the
registry carrying out placement, each with a stand-in backend (no process, no model file).
The real worker behind the same calls is tested in test_registry.py and test_generation.py."""

import asyncio
import math
import time
from pathlib import Path

import pytest

from gateway.backends.local import CHAT, TOKENIZE, StartFailed
from gateway.base.errors import ApiError
from gateway.models.config import Config, ModelSpec, ServerConfig
from gateway.models.lifecycle import ModelState
from gateway.serving.registry import Registry
from gateway.serving.supervisor import ModelSupervisor, Timing


class StandIn:
    """A backend that answers nothing: the supervisor only starts, leases and stops it."""

    serves = frozenset({CHAT, TOKENIZE})
    device = "cpu"
    pid = None
    busy = False

    def __init__(self, name: str):
        self.name, self.info, self.alive, self.in_flight, self.stops = name, {}, True, 0, 0

    async def stop(self, timeout: float = 5.0) -> None:
        self.stops += 1
        self.alive = False

    def set_threads(self, n: int) -> None:
        pass

    def abort_all(self, message: str) -> None:
        pass


class Host:
    """Starts stand-ins when ``gate`` opens (or fails them while ``fail`` is set), and notes
    what the supervisor tells it."""

    def __init__(self):
        self.gate, self.fail = asyncio.Event(), None
        self.gate.set()
        self.started, self.finished = [], []

    async def make_room(self, supervisor):
        pass

    async def start_backend(self, supervisor):
        await self.gate.wait()
        if self.fail:
            raise StartFailed(self.fail)
        backend = StandIn(supervisor.spec.name)
        self.started.append(backend)
        return backend

    def went_idle(self, supervisor):
        pass

    def load_finished(self, supervisor, seconds):
        self.finished.append(seconds)


def supervisor(host=None, parallel=1, **timing):
    return ModelSupervisor(ModelSpec("m", Path("m.gguf")), host or Host(), Timing(**timing), parallel)


async def error_of(awaitable) -> ApiError:
    with pytest.raises(ApiError) as e:
        await awaitable
    return e.value


async def settle(until, seconds=60.0):  # only how long before the test fails
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if until():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


async def test_concurrent_requests_share_one_load():
    host = Host()
    host.gate.clear()
    sup = supervisor(host)
    waiters = [asyncio.ensure_future(sup.ready()) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert sup.state is ModelState.LOADING and sup.load is not None
    host.gate.set()
    backends = await asyncio.gather(*waiters)
    assert len(host.started) == 1 and all(b is host.started[0] for b in backends)
    assert sup.state is ModelState.READY and sup.backend is host.started[0]
    assert len(host.finished) == 1 and host.finished[0] >= 0


async def test_a_failed_start_backs_off_doubling_to_its_cap():
    host = Host()
    host.fail = "no such file"
    sup = supervisor(host, backoff=(0.05, 0.08))
    first = await error_of(sup.ready())
    assert first.status == 503 and first.code == "model_load_failed" and "no such file" in first.message
    assert first.headers["Retry-After"] == "1" and sup.state is ModelState.FAILED and sup.failures == 1
    again = await error_of(sup.ready())  # inside the back-off: refused without trying
    assert again.code == "model_load_failed" and sup.failures == 1 and host.finished == [None]
    await asyncio.sleep(0.06)
    await error_of(sup.ready())  # tried again: fails again, and waits twice as long, up to the cap
    assert sup.failures == 2 and host.finished == [None, None]
    await asyncio.sleep(0.09)
    await error_of(sup.ready())
    loop_now = asyncio.get_running_loop().time()
    assert sup.failures == 3 and 0 < sup.retry_at - loop_now <= 0.08 + 0.01  # capped, not 0.2
    await asyncio.sleep(0.09)
    host.fail = None
    backend = await sup.ready()
    assert sup.state is ModelState.READY and sup.failures == 0 and sup.error is None and backend.alive


async def test_a_load_slower_than_the_load_timeout_answers_503_and_goes_on():
    host = Host()
    host.gate.clear()
    sup = supervisor(host, load_timeout=0.01)
    err = await error_of(sup.ready())
    assert err.status == 503 and err.code == "model_loading" and err.headers["Retry-After"] == "5"
    assert sup.state is ModelState.LOADING  # the caller gave up, the load did not
    host.gate.set()
    await settle(lambda: sup.state is ModelState.READY)
    assert len(host.started) == 1


async def test_stopping_a_loading_model_tells_its_waiters():
    host = Host()
    host.gate.clear()
    sup = supervisor(host)
    waiter = asyncio.ensure_future(sup.ready())
    await asyncio.sleep(0.01)
    await sup.stop()
    err = await error_of(waiter)
    assert err.status == 503 and err.code == "model_unloaded"
    assert sup.state is ModelState.UNLOADED and sup.load is None and host.started == []


async def test_idle_for_keep_alive_unloads_and_the_next_request_loads_again():
    host = Host()
    sup = supervisor(host, keep_alive=0.03)
    async with sup.lease(CHAT, max_queue=4) as backend:
        await asyncio.sleep(0.06)  # busy past keep_alive: not unloaded under a request
        assert sup.state is ModelState.READY and sup.in_flight == 1
    # the state moves at once; the backend's stop runs as a task of its own (a caller that
    # leaves must not cut it short), so it is waited for too
    await settle(lambda: sup.state is ModelState.UNLOADED and backend.stops == 1)
    assert sup.backend is None
    async with sup.lease(CHAT, max_queue=4) as again:
        assert again is not backend and len(host.started) == 2


async def test_keep_alive_forever_never_unloads():
    sup = supervisor(keep_alive=math.inf)
    async with sup.lease(CHAT, max_queue=4):
        pass
    await asyncio.sleep(0.03)
    assert sup.state is ModelState.READY


async def test_a_full_queue_is_429_and_an_unserved_kind_501():
    sup = supervisor(parallel=1, keep_alive=math.inf)
    async with sup.lease(CHAT, max_queue=1):
        second = asyncio.ensure_future(sup.lease(CHAT, max_queue=1).__aenter__())  # one waits for the slot
        await asyncio.sleep(0.01)
        assert sup.slots.queued == 1 and sup.in_flight == 2  # in flight, waiting for the slot
        err = await error_of(sup.lease(CHAT, max_queue=1).__aenter__())
        assert err.status == 429 and err.code == "queue_full" and err.headers["Retry-After"] == "2"
        assert not second.done()  # the slot is the first's until it leaves
    await second
    assert sup.in_flight == 1 and not sup.waits  # the second holds the one slot now
    unserved = await error_of(sup.lease("embeddings", max_queue=4).__aenter__())
    assert unserved.status == 501 and unserved.param == "model" and unserved.code == "unsupported_model"
    assert sup.in_flight == 1  # the unserved request took nothing (the second lease was never left)


async def test_stop_refuses_a_busy_model():
    sup = supervisor(keep_alive=math.inf)
    async with sup.lease(CHAT, max_queue=4):
        err = await error_of(sup.stop())
        assert err.status == 409 and err.code == "model_busy"
    await sup.stop()
    assert sup.state is ModelState.UNLOADED


async def test_retiring_unloads_once_the_last_request_ends():
    host = Host()
    busy, idle = supervisor(host, keep_alive=math.inf), supervisor(host, keep_alive=math.inf)
    await idle.ready()
    idle.retire()
    await settle(lambda: idle.state is ModelState.UNLOADED)
    async with busy.lease(CHAT, max_queue=4):
        busy.retire()
        await asyncio.sleep(0.01)
        assert busy.state is ModelState.READY  # its request goes on
    await settle(lambda: busy.state is ModelState.UNLOADED)
    assert not busy.holds and not idle.holds


async def test_a_backend_that_exits_by_itself_is_started_again_on_the_next_request():
    host = Host()
    sup = supervisor(host, keep_alive=math.inf)
    first = await sup.ready()
    sup.backend_exited(StandIn("another"))  # not its backend: ignored
    assert sup.backend is first
    sup.backend_exited(first)
    assert sup.state is ModelState.UNLOADED and sup.backend is None
    assert await sup.ready() is not first and len(host.started) == 2


def test_a_state_changes_only_along_the_lifecycle():
    sup = supervisor()
    with pytest.raises(ValueError):
        sup.move(ModelState.READY)  # never ready without loading
    sup.move(ModelState.LOADING)
    sup.move(ModelState.FAILED)
    with pytest.raises(ValueError):
        sup.move(ModelState.UNLOADED)


# --- the registry with a stand-in backend factory ---------------------------------------------

def registry(tmp_path, names, **server):
    specs = tuple(ModelSpec(n, tmp_path / f"{n}.gguf", keep_alive=math.inf) for n in names)
    started: list[str] = []

    async def backends(spec, server_config, *, on_exit, on_busy, on_progress):
        started.append(spec.name)
        return StandIn(spec.name)

    reg = Registry(Config(server=ServerConfig(discover_default_stores=False, **server), models=specs),
                   backends=backends)
    return reg, started


async def test_the_registry_evicts_the_least_recently_used_idle_model(tmp_path):
    reg, started = registry(tmp_path, ["a", "b", "c"], max_loaded_models=2)
    for name in ("a", "b", "a", "c"):
        async with reg.lease(name):
            pass
    assert started == ["a", "b", "c"] and set(reg.loaded()) == {"a", "c"}  # b was the least recently used
    async with reg.lease("a"):  # busy: never evicted
        async with reg.lease("b"):
            assert set(reg.loaded()) == {"a", "b"}


async def test_the_registry_waits_for_room_while_every_model_is_busy(tmp_path):
    reg, started = registry(tmp_path, ["a", "b"], max_loaded_models=1, load_timeout=5)
    order = []

    async def use_b():
        async with reg.lease("b"):
            order.append("b")

    async with reg.lease("a"):
        waiting = asyncio.ensure_future(use_b())
        await asyncio.sleep(0.02)
        assert started == ["a"] and reg.supervisor(reg.resolve("b")).state is ModelState.LOADING
        order.append("a done")
    await waiting
    assert order == ["a done", "b"] and set(reg.loaded()) == {"b"}


async def test_a_backend_that_exits_unexpectedly_counts_as_a_worker_failure(tmp_path):
    exits = []

    async def backends(spec, server_config, *, on_exit, on_busy, on_progress):
        backend = StandIn(spec.name)
        exits.append(lambda expected: on_exit(backend, expected))
        return backend

    reg = Registry(Config(server=ServerConfig(discover_default_stores=False),
                          models=(ModelSpec("a", tmp_path / "a.gguf"),)), backends=backends)
    await reg.load("a")
    exits[0](True)  # asked to stop: not a failure
    assert reg.worker_failures == 0
    await reg.load("a")
    exits[1](False)
    assert reg.worker_failures == 1 and reg.supervisor(reg.resolve("a")).state is ModelState.UNLOADED


def slow_load(monkeypatch, after: float, every: float):
    """A supervisor whose load waits for its host's gate, progress told after ``after`` and
    every ``every`` seconds, and a callback that notes what it is told."""
    from gateway.serving import supervisor as sup_module
    monkeypatch.setattr(sup_module, "PROGRESS_AFTER", after)
    monkeypatch.setattr(sup_module, "PROGRESS_EVERY", every)
    host = Host()
    host.gate.clear()
    told: list[float] = []

    async def tell(fraction: float) -> None:
        told.append(fraction)

    return host, supervisor(host), told, tell


async def test_a_waiter_is_told_a_loads_progress_after_a_while_then_at_each_report(monkeypatch):
    host, sup, told, tell = slow_load(monkeypatch, after=0.05, every=10.0)
    quick, patient = asyncio.ensure_future(sup.ready()), asyncio.ensure_future(sup.ready(tell))
    await asyncio.sleep(0.01)
    sup.loaded_part(0.2)  # a report before the wait has lasted PROGRESS_AFTER: not told
    await asyncio.sleep(0.01)
    assert told == [] and sup.progress == 0.2
    await settle(lambda: told == [0.2])  # told once the wait has lasted PROGRESS_AFTER
    sup.loaded_part(0.5)
    await settle(lambda: told == [0.2, 0.5])
    sup.loaded_part(7.0)  # reports are clamped to 0..1
    await settle(lambda: told == [0.2, 0.5, 1.0])
    host.gate.set()
    assert await patient is await quick
    assert sup.state is ModelState.READY


async def test_a_silent_load_is_still_told_every_so_often_and_a_new_load_starts_at_zero(monkeypatch):
    host, sup, told, tell = slow_load(monkeypatch, after=0.0, every=0.03)
    sup.progress = 0.9  # what a previous load left
    waiter = asyncio.ensure_future(sup.ready(tell))
    await settle(lambda: len(told) >= 3)
    assert set(told) == {0.0}
    host.gate.set()
    await waiter


async def test_a_failing_progress_callback_ends_that_wait_alone(monkeypatch):
    host, sup, _, _ = slow_load(monkeypatch, after=0.0, every=10.0)

    async def gone(fraction: float) -> None:
        raise ConnectionResetError("the client left")

    with pytest.raises(ConnectionResetError):
        await sup.ready(gone)
    assert sup.load is not None and not sup.load.done()  # the load goes on for whoever else wants it
    host.gate.set()
    assert (await sup.ready()).alive
