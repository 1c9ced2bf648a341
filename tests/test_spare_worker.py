"""The spare worker (``backends.spawning.Spare``): a worker process started after each load, its
interpreter up and llama.cpp imported, that the next load takes instead of starting one."""

import asyncio
import os
import sys
from pathlib import Path

import pytest

from gateway.backends.local import LocalWorkers
from gateway.models import testmodels as tm
from gateway.models.config import ModelSpec, ServerConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for child processes")


def workers() -> set[int]:
    """This process's children that are model workers."""
    me = os.getpid()
    out = set()
    for pid in map(int, Path(f"/proc/{me}/task/{me}/children").read_text().split()):
        try:
            if b"gateway.worker.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.add(pid)
        except OSError:
            pass
    return out


async def until(check, seconds=120.0):  # how long before the test fails: a loaded machine spawns slowly
    for _ in range(int(seconds / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


HOOKS = {"on_exit": lambda b, e: None, "on_busy": lambda: None, "on_progress": lambda f: None}


async def test_the_next_load_takes_the_spare_started_after_the_last(tmp_path):
    tm.plain(tmp_path / "a.gguf")
    tm.thinking(tmp_path / "b.gguf")
    local = LocalWorkers()
    server = ServerConfig(kv_cache_max_bytes=0)
    a = await local(ModelSpec("a", tmp_path / "a.gguf"), server, **HOOKS)
    await until(lambda: len(workers()) == 2)  # a's, and the spare
    (spare,) = workers() - {a.pid}
    await a.stop()
    b = await local(ModelSpec("b", tmp_path / "b.gguf"), server, **HOOKS)
    assert b.pid == spare and b.info["n_ctx"] > 0
    await until(lambda: len(workers()) == 2)  # the next spare
    await b.stop()
    await local.close()
    await until(lambda: workers() == set())  # nothing left behind


async def test_a_spare_that_died_is_replaced_not_used(tmp_path):
    tm.plain(tmp_path / "a.gguf")
    local = LocalWorkers()
    server = ServerConfig(kv_cache_max_bytes=0)
    a = await local(ModelSpec("a", tmp_path / "a.gguf"), server, **HOOKS)
    await until(lambda: len(workers()) == 2)
    (spare,) = workers() - {a.pid}
    os.kill(spare, 9)
    await until(lambda: workers() == {a.pid})
    again = await local(ModelSpec("a2", tmp_path / "a.gguf"), server, **HOOKS)
    assert again.pid != spare and again.alive
    for backend in (a, again):
        await backend.stop()
    await local.close()
    await until(lambda: workers() == set())


async def test_without_a_spare_no_process_waits(tmp_path):
    tm.plain(tmp_path / "a.gguf")
    local = LocalWorkers(spare=False)
    a = await local(ModelSpec("a", tmp_path / "a.gguf"), ServerConfig(kv_cache_max_bytes=0), **HOOKS)
    await asyncio.sleep(1.0)
    assert workers() == {a.pid}
    await a.stop()
    await local.close()


async def test_a_spare_killed_as_the_next_load_takes_it_is_replaced(tmp_path):
    """Killed and not yet reaped when the load takes it, a spare looks alive: the load it never
    read is made again in a process of its own."""
    tm.plain(tmp_path / "a.gguf")
    local = LocalWorkers()
    server = ServerConfig(kv_cache_max_bytes=0)
    a = await local(ModelSpec("a", tmp_path / "a.gguf"), server, **HOOKS)
    await until(lambda: len(workers()) == 2)
    assert local.spare is not None and local.spare._next is not None
    spawned = await local.spare._next
    spawned.proc.send_signal(9)
    again = await local(ModelSpec("a2", tmp_path / "a.gguf"), server, **HOOKS)
    assert again.pid != spawned.proc.pid and again.alive
    for backend in (a, again):
        await backend.stop()
    await local.close()
    await until(lambda: workers() == set())
