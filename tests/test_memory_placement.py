"""Loading by memory with real workers: ``server.memory_budget`` small enough for one model's
estimate, not two; a model too large for it is refused before any load; the machine's memory
as /proc/meminfo and vm_stat say."""

import pytest

from gateway.app import create_app
from gateway.hardware import sysmem
from gateway.models.config import ConfigError, load_config

HI = [{"role": "user", "content": "hi"}]


async def states(client) -> dict[str, str]:
    return {m["id"]: m["state"] for m in (await (await client.get("/models")).json())["data"]}


async def estimates(client) -> dict[str, int]:
    return {m["id"]: m["memory_estimate"]["total"] for m in (await (await client.get("/models")).json())["data"]}


def gateway(write_config, model_dir, budget: str, extra: str = ""):
    return create_app(load_config(write_config(f"""
server:
  discover_default_stores: false
  max_loaded_models: 0
  memory_budget: {budget}
models:
  a:
    path: {model_dir}/plain.gguf
    n_ctx: 2048
{extra}  b:
    path: {model_dir}/thinker.gguf
    n_ctx: 2048
""")))


async def test_a_model_that_does_not_fit_beside_another_makes_room(aiohttp_client, write_config, model_dir):
    probe = await aiohttp_client(gateway(write_config, model_dir, "1GiB"))
    need = await estimates(probe)
    await probe.close()
    budget = int(max(need.values()) * 1.5)  # one model, not two
    client = await aiohttp_client(gateway(write_config, model_dir, str(budget)))
    assert (await client.post("/v1/chat/completions", json={"model": "a", "messages": HI})).status == 200
    assert (await client.post("/v1/chat/completions", json={"model": "b", "messages": HI})).status == 200
    assert await states(client) == {"a": "unloaded", "b": "ready"}  # a made room, with no count limit


async def test_a_model_larger_than_the_budget_is_refused_before_any_load(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(gateway(write_config, model_dir, "1MiB"))
    r = await client.post("/v1/chat/completions", json={"model": "a", "messages": HI})
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "model_too_large" and body["error"]["param"] == "model"
    assert "needs about" in body["error"]["message"] and "server.memory_budget 1 MiB" in body["error"]["message"]
    assert (await states(client))["a"] == "unloaded"  # never tried
    assert (await client.get("/health")).status == 200


async def test_a_pinned_model_is_never_the_one_that_makes_room(aiohttp_client, write_config, model_dir):
    probe = await aiohttp_client(gateway(write_config, model_dir, "1GiB"))
    need = await estimates(probe)
    await probe.close()
    budget = int(max(need.values()) * 1.5)
    client = await aiohttp_client(gateway(write_config, model_dir, str(budget), extra="    pin: true\n"))
    assert (await states(client))["a"] == "ready"  # pinned: loaded at start
    r = await client.post("/v1/chat/completions", json={"model": "b", "messages": HI})
    assert r.status == 503 and (await r.json())["error"]["code"] == "model_too_large"
    assert await states(client) == {"a": "ready", "b": "unloaded"}


@pytest.mark.parametrize(("reserve", "want"), [("10%", -10), ("0%", 0), ("2GiB", 2 * 2**30), (1024, 1024)])
def test_the_reserve_is_a_size_or_a_share(write_config, reserve, want):
    assert load_config(write_config(f"server:\n  memory_reserve: {reserve}\n")).server.memory_reserve == {"default": want}
    assert sysmem.reserve_bytes(want, 1000 * 2**20) == (100 * 2**20 if want == -10 else 0 if want == 0 else want)


def test_reserve_and_budget_per_device(write_config):
    server = load_config(write_config("server:\n  memory_reserve: {ram: 2GiB, CUDA0: 5%, default: 1GiB}\n"
                                      "  memory_budget: {cuda1: 8GiB}\n")).server
    assert server.memory_reserve == {"ram": 2 * 2**30, "cuda0": -5, "default": 2**30}
    assert server.memory_budget == {"cuda1": 8 * 2**30}
    assert load_config(write_config("server:\n  memory_budget: 4GiB\n")).server.memory_budget == {"ram": 4 * 2**30}


@pytest.mark.parametrize("reserve", ["100%", "-5%", "lots%", "lots", "{cuda0: lots}"])
def test_a_bad_reserve_names_its_place(write_config, reserve):
    with pytest.raises(ConfigError) as e:
        load_config(write_config(f"server:\n  memory_reserve: {reserve}\n"))
    assert "server.memory_reserve:" in str(e.value) or "server.memory_reserve.cuda0:" in str(e.value)


def test_meminfo_and_vm_stat():
    mem = sysmem.parse_meminfo("MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:   8000000 kB\n")
    assert mem == sysmem.Memory(16000000 * 1024, 8000000 * 1024)
    vm = ("Mach Virtual Memory Statistics: (page size of 16384 bytes)\nPages free:   1000.\n"
          "Pages active:  5000.\nPages inactive:  2000.\nPages speculative:  100.\nPages purgeable:  50.\n")
    assert sysmem.parse_vm_stat(vm, 2**34) == sysmem.Memory(2**34, (1000 + 2000 + 100 + 50) * 16384)
    assert sysmem.parse_meminfo("nothing") is None
    here = sysmem.read()
    assert here is None or 0 < here.available <= here.total
