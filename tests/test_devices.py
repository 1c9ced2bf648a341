"""GPU memory in placement: llama.cpp's devices as ggml lists them (``gateway/worker/devices``,
read by a probe process: ``gateway/devices``), the layers llama.cpp gives each device
(``memory.layer_devices``, checked against llama.cpp's ``load_tensors`` rule), the estimate
split by device, each device's capacity, and a model refused for a GPU's memory.

This machine has no GPU: the probe is run for real (it lists the CPU), and a GPU is described
to the gateway by a stand-in probe command printing what ggml would. What llama.cpp allocates
on a real GPU against the estimate is not checked here."""

import json
import sys
from pathlib import Path

import pytest
from helpers import tiny_random_model

from gateway.api.appkeys import REGISTRY
from gateway.app import create_app
from gateway.hardware import devices, sysmem
from gateway.models import testmodels as tm
from gateway.models.config import ModelSpec, load_config
from gateway.models.ggufmeta import read_info
from gateway.models.memory import GPU_CONTEXT, RAM, RPC, estimate, layer_devices, model_devices, pool_of
from gateway.protocol.topology import Device

GiB, MiB = 2**30, 2**20
HI = [{"role": "user", "content": "hi"}]


def gpu(name: str, free: int = 8 * GiB, kind: str = "gpu", total: int = 16 * GiB) -> Device:
    return Device(name, f"{name} card", kind, free, total)


def probe_command(found: list[Device], calls: Path | None = None) -> list[str]:
    """A stand-in for ``python -m gateway.worker.device_probe`` that prints ``found`` (and counts its runs)."""
    script = f"import sys; print({json.dumps(json.dumps([d.describe() for d in found]))})"
    if calls is not None:
        script = f"open({str(calls)!r}, 'a').write('x'); " + script
    return [sys.executable, "-c", script]


def test_llama_cpp_lists_its_devices_and_the_cpus_memory():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "gateway.worker.device_probe"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    found = [Device.parse(d) for d in json.loads(out)]
    cpu = [d for d in found if d.kind == "cpu"]
    assert len(cpu) == 1 and cpu[0].pool == RAM
    mem = sysmem.read()
    if mem is not None:  # ggml's CPU device reports the system's memory
        assert abs(cpu[0].total / mem.total - 1) < 0.1, (cpu[0], mem)
    for d in found:
        assert 0 <= d.free <= d.total or d.total == 0, d


@pytest.mark.parametrize(("n_gpu_layers", "gpus", "tensor_split", "want"), [
    (-1, ["cuda0"], (), ["cuda0"] * 5),  # every layer and the output
    (0, ["cuda0"], (), [RAM] * 5),
    (-1, [], (), [RAM] * 5),  # no GPU
    (2, ["cuda0"], (), [RAM, RAM, RAM, "cuda0", "cuda0"]),  # the output layer first, then the last layers
    (4, ["cuda0"], (), [RAM, "cuda0", "cuda0", "cuda0", "cuda0"]),
    (99, ["cuda0"], (), ["cuda0"] * 5),
    (-1, ["cuda0", "cuda1"], (), ["cuda0", "cuda0", "cuda0", "cuda1", "cuda1"]),  # equal free memory
    (-1, ["cuda0", "cuda1"], (1.0, 3.0), ["cuda0", "cuda0", "cuda1", "cuda1", "cuda1"]),
    (-1, ["cuda0", "cuda1"], (0.0, 0.0), ["cuda0", "cuda0", "cuda0", "cuda1", "cuda1"]),  # zeros: by free memory
    (3, ["cuda0", "cuda1"], (), [RAM, RAM, "cuda0", "cuda0", "cuda1"]),
])
def test_layers_go_where_llama_cpp_puts_them(n_gpu_layers, gpus, tensor_split, want):
    assert layer_devices(4, n_gpu_layers, [gpu(name.upper()) for name in gpus], tensor_split) == want


def test_layers_are_spread_by_free_memory():
    assert layer_devices(4, -1, [gpu("CUDA0", free=3 * GiB), gpu("CUDA1", free=1 * GiB)]) == ["cuda0"] * 4 + ["cuda1"]


def test_the_devices_a_model_may_use():
    cpu, a, b = Device("CPU", "cpu", "cpu", 1, 1), gpu("CUDA0"), gpu("CUDA1")
    igpu, blas = gpu("Vulkan0", kind="igpu"), Device("BLAS", "blas", "accel", 0, 0)
    assert model_devices([cpu, a, b, blas]) == [a, b]
    assert model_devices([cpu, a, b], "none", main_gpu=1) == [b]
    assert model_devices([cpu, a, b], "none", main_gpu=2) == []  # llama.cpp refuses it; nothing counted there
    assert model_devices([cpu, igpu, a]) == [a]  # an integrated GPU only where there is no other
    assert model_devices([cpu, igpu]) == [igpu]
    # models.yaml devices: those named, in its order (an integrated GPU too); none: no device
    assert model_devices([cpu, a, b, igpu], names=["cuda1", "Vulkan0"]) == [b, igpu]
    assert model_devices([cpu, a, b], names=[]) == []
    assert model_devices([cpu, a, b], "none", main_gpu=1, names=["CUDA1", "CUDA0"]) == [a]
    assert model_devices([cpu, a], names=["CPU", "CUDA9"]) == []  # not devices to offload to: llama.cpp refuses them


def test_buffers_are_counted_in_their_devices_pool():
    assert [pool_of(name) for name in ("cpu", "cuda0", "cuda", "mtl0", "vulkan1", "rpc0[10.0.0.2:50052]")] == \
        [RAM, "cuda0", RAM, "mtl0", "vulkan1", RPC]


@pytest.mark.parametrize("model", ["scripted", "qwen2"])
def test_the_estimate_is_split_by_device(tmp_path, model):
    path = tm.plain(tmp_path / "m.gguf").path if model == "scripted" else tiny_random_model("qwen2", seed=7)
    info = read_info(path)
    assert sum(info.layer_bytes) + info.input_bytes + info.output_bytes == info.weight_bytes
    spec = ModelSpec("m", path, n_ctx=1024, parallel=2)
    cpu_only = estimate(info, spec)
    assert cpu_only.devices == {RAM: cpu_only.total}

    offloaded = estimate(info, spec, [gpu("CUDA0")])
    assert set(offloaded.devices) == {RAM, "cuda0"} and sum(offloaded.devices.values()) == offloaded.total
    assert offloaded.kv == cpu_only.kv and offloaded.weights == cpu_only.weights  # not tied: no second head
    assert offloaded.devices["cuda0"] >= info.weight_bytes - info.input_bytes + offloaded.kv + GPU_CONTEXT
    assert offloaded.devices[RAM] < cpu_only.devices[RAM] - info.output_bytes  # only the input layer and buffers

    # no layer on the GPU: the weights and the cache in RAM as without one; on the GPU its runtime
    # and the products llama.cpp sends it (op offload), the head's with its logits and a copy of
    # its weights (as a CUDA GPU showed, scripts/bench.py --memory), which RAM no longer computes
    kept = estimate(info, ModelSpec("m", path, n_ctx=1024, parallel=2, n_gpu_layers=0), [gpu("CUDA0")])
    logits_rows = 4 * 512 * info.n_vocab  # one micro-batch's logits
    assert cpu_only.devices[RAM] - kept.devices[RAM] == logits_rows
    head_on_gpu = GPU_CONTEXT + info.output_bytes + logits_rows
    assert head_on_gpu < kept.devices["cuda0"] < head_on_gpu + 64 * MiB
    # devices: none keeps it off the GPU altogether, as if there were none
    assert estimate(info, ModelSpec("m", path, n_ctx=1024, parallel=2, devices=()), [gpu("CUDA0")]) == cpu_only
    two = estimate(info, ModelSpec("m", path, n_ctx=1024, parallel=2, devices=("CUDA1",)), [gpu("CUDA0"), gpu("CUDA1")])
    assert set(two.devices) == {RAM, "cuda1"}
    rpc = estimate(info, ModelSpec("m", path, n_ctx=1024, parallel=2, rpc=("10.0.0.2:50052",)), [gpu("CUDA0")])
    assert set(rpc.devices) == {RAM, RPC}  # the layers are the rpc-servers' to hold


@pytest.mark.real
def test_a_tied_output_head_stays_on_the_cpu():
    """Gemma's output head is its token embeddings: llama.cpp keeps them with the input layer,
    one copy, and computes the logits there (seen with its Vulkan backend: the note of issue 24)."""
    from realmodel import gemma_path

    info = read_info(gemma_path())
    assert info.tied_output and len(info.layer_bytes) == info.shape["block_count"]
    spec = ModelSpec("gemma", gemma_path())
    cpu_only, offloaded = estimate(info, spec), estimate(info, spec, [gpu("CUDA0")])
    assert offloaded.weights == cpu_only.weights
    logits_rows = 4 * 512 * info.n_vocab  # one micro-batch's logits
    assert offloaded.devices[RAM] > info.input_bytes + logits_rows
    assert offloaded.devices["cuda0"] - GPU_CONTEXT < info.weight_bytes - info.input_bytes + offloaded.kv + logits_rows


def test_capacities_per_device():
    ram = sysmem.Memory(total=64 * GiB, available=40 * GiB)
    reading = devices.Reading((gpu("CUDA0", free=10 * GiB, total=24 * GiB), gpu("CUDA1", free=2 * GiB, total=8 * GiB)),
                              {"cuda0": 4 * GiB})
    got = devices.capacities(ram, 6 * GiB, reading, {}, {"default": -10})
    assert {pool: n for pool, (n, _) in got.items()} == {
        RAM: 40 * GiB + 6 * GiB - int(6.4 * GiB),  # available, plus what the models hold, less 10%
        "cuda0": 10 * GiB + 4 * GiB - int(2.4 * GiB),  # free when read, plus what they held then
        "cuda1": 2 * GiB - int(0.8 * GiB)}
    assert "free on CUDA0 (CUDA0 card)" in got["cuda0"][1]
    got = devices.capacities(ram, 0, reading, {"cuda1": 512 * MiB, RAM: 100 * GiB}, {"cuda0": 0, "default": GiB})
    assert {pool: n for pool, (n, _) in got.items()} == {RAM: 39 * GiB, "cuda0": 14 * GiB, "cuda1": 512 * MiB}
    assert got["cuda1"][1] == "server.memory_budget 512 MiB on cuda1"
    assert devices.capacities(None, 0, devices.Reading(), {}, {}) == {}  # nothing known: nothing counted


def test_a_unified_gpus_free_memory_is_the_probes_own():
    reading = devices.Reading((gpu("MTL0", free=20 * GiB, total=20 * GiB),), {"mtl0": 5 * GiB})
    got = devices.capacities(None, 0, reading, {}, {"default": 0})
    assert got["mtl0"][0] == 20 * GiB  # Metal's free memory is per process: the models' 5 GiB are not in it


def test_unified_memory_counts_in_ram_too():
    metal, cuda = gpu("MTL0"), gpu("CUDA0")
    assert devices.with_unified({RAM: 1, "mtl0": 10}, [metal]) == {RAM: 11, "mtl0": 10}
    assert devices.with_unified({RAM: 1, "cuda0": 10}, [cuda]) == {RAM: 1, "cuda0": 10}


async def test_the_probe_runs_once_where_there_is_no_gpu(tmp_path):
    calls = tmp_path / "calls"
    inventory = devices.Inventory(probe_command([Device("CPU", "cpu", "cpu", GiB, GiB)], calls))
    assert (await inventory.read(lambda: {})).gpus == ()
    assert (await inventory.read(lambda: {}, max_age=0)).gpus == ()
    assert calls.read_text() == "x"


async def test_the_probe_runs_again_where_there_are_gpus_and_the_reading_is_old(tmp_path):
    calls = tmp_path / "calls"
    inventory = devices.Inventory(probe_command([gpu("CUDA0")], calls))
    first = await inventory.read(lambda: {"cuda0": 5})
    assert [d.pool for d in first.gpus] == ["cuda0"] and first.held == {"cuda0": 5}
    await inventory.read(lambda: {})
    await inventory.read(lambda: {}, max_age=devices.GPU_READING_MAX_AGE)
    assert calls.read_text() == "x"  # recent enough
    await inventory.read(lambda: {}, max_age=0)
    assert calls.read_text() == "xx"
    # a worker's reading with its model loaded stands for a recent one
    inventory.take([gpu("CUDA0", free=GiB).describe()], lambda: {"cuda0": 7})
    assert (await inventory.read(lambda: {}, max_age=devices.GPU_READING_MAX_AGE)).held == {"cuda0": 7}
    assert calls.read_text() == "xx"
    inventory.take([{"name": "broken"}], dict)  # ignored, logged
    assert inventory.gpus[0].free == GiB


async def test_a_reading_of_some_gpus_keeps_the_others(tmp_path):
    inventory = devices.Inventory(probe_command([gpu("CUDA0", free=5 * GiB), gpu("CUDA1", free=6 * GiB)]))
    first = await inventory.read(lambda: {"cuda0": 1, "cuda1": 2})
    # a worker told to use CUDA1 only reads that one (asking CUDA0 would start its runtime there)
    inventory.take([gpu("CUDA1", free=GiB).describe()], lambda: {"cuda0": 7, "cuda1": 4}, partial=True)
    now = inventory.last
    assert [d.free for d in now.gpus] == [5 * GiB, GiB] and now.held == {"cuda0": 1, "cuda1": 4}
    assert now.at == first.at  # not a fresh reading of the others


@pytest.mark.parametrize("command", [[sys.executable, "-c", "import sys; sys.exit('no llama.cpp')"],
                                     [sys.executable, "-c", "print('[{\"name\": 1}]')"],
                                     ["/nonexistent/python"]])
async def test_a_failed_probe_counts_as_no_gpu(command, caplog):
    inventory = devices.Inventory(command)
    assert (await inventory.read(lambda: {})).gpus == ()
    assert "GPU memory is not counted" in caplog.text


def gateway(write_config, model_dir, found: list[Device], extra: str = ""):
    app = create_app(load_config(write_config(f"""
server:
  discover_default_stores: false
  max_loaded_models: 0
  memory_reserve: {{cuda0: 0, ram: 10%}}
models:
  a:
    path: {model_dir}/plain.gguf
    n_ctx: 32768
    parallel: 4
  cpu-only:
    path: {model_dir}/thinker.gguf
    n_ctx: 2048
    n_gpu_layers: 0
{extra}""")))
    app[REGISTRY].devices = devices.Inventory(probe_command(found))
    return app


async def gpu_needs(aiohttp_client, write_config, model_dir) -> dict[str, int]:
    """Each model's estimate on a roomy GPU: what it would put there."""
    app = gateway(write_config, model_dir, [gpu("CUDA0", free=64 * GiB, total=80 * GiB)])
    client = await aiohttp_client(app)
    await app[REGISTRY].devices.read(dict)  # what the first load does
    needs = {m["id"]: m["memory_estimate"]["devices"].get("cuda0", 0)
             for m in (await (await client.get("/models")).json())["data"]}
    await client.close()
    return needs


async def test_a_model_too_large_for_the_gpu_is_refused_naming_it(aiohttp_client, write_config, model_dir):
    needs = await gpu_needs(aiohttp_client, write_config, model_dir)
    # a model kept on the CPU still has llama.cpp's GPU runtime there, and its larger products
    # (op offload); the other puts its layers there too
    assert GPU_CONTEXT < needs["cpu-only"] < needs["a"]
    free = (needs["cpu-only"] + needs["a"]) // 2
    client = await aiohttp_client(gateway(write_config, model_dir, [gpu("CUDA0", free=free, total=free)]))
    r = await client.post("/v1/chat/completions", json={"model": "a", "messages": HI})
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "model_too_large" and body["error"]["param"] == "model"
    assert " on cuda0 " in body["error"]["message"] and "free on CUDA0 (CUDA0 card)" in body["error"]["message"]
    models = {m["id"]: m for m in (await (await client.get("/models")).json())["data"]}
    assert set(models["a"]["memory_estimate"]["devices"]) == {RAM, "cuda0"}
    assert models["a"]["state"] == "unloaded"  # never tried
    # the model that fits loads beside the refusal, and the server goes on
    assert (await client.post("/v1/chat/completions", json={"model": "cpu-only", "messages": HI})).status == 200
    models = {m["id"]: m for m in (await (await client.get("/models")).json())["data"]}
    assert models["cpu-only"]["memory_allocated"]["devices"][RAM] == models["cpu-only"]["memory_allocated"]["total"]


async def test_health_and_metrics_show_the_gpus_once_read(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(gateway(write_config, model_dir, [gpu("CUDA0", free=64 * MiB, total=80 * MiB)]))
    assert (await (await client.get("/health")).json())["gpus"] is None  # not read before a load
    assert (await client.post("/v1/chat/completions", json={"model": "a", "messages": HI})).status == 503
    [seen] = (await (await client.get("/health")).json())["gpus"]
    assert seen["name"] == "CUDA0" and seen["pool"] == "cuda0" and seen["free"] == 64 * MiB
    text = await (await client.get("/metrics")).text()
    assert 'gguf_gateway_gpu_memory_free_bytes{description="CUDA0 card",device="CUDA0"} 6.7108864e+07' in text
    assert 'gguf_gateway_gpu_memory_total_bytes{description="CUDA0 card",device="CUDA0"} 8.388608e+07' in text


async def test_a_gpu_with_room_loads_the_model(aiohttp_client, write_config, model_dir):
    client = await aiohttp_client(gateway(write_config, model_dir, [gpu("CUDA0", free=8 * GiB)]))
    assert (await client.post("/v1/chat/completions", json={"model": "a", "messages": HI})).status == 200
    # the loaded worker's own reading replaces the probe's: here, llama.cpp has no GPU
    assert (await (await client.get("/health")).json())["gpus"] == []
