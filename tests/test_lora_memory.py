"""LoRA adapters in a model's memory estimate (``models/memory.py``): each adapter tensor in the pool
of the model tensor it adapts, padded as ggml pads a buffer's tensors, and llama.cpp's reported
"LoRA buffer size" (the worker's ``lora`` kind of buffers) counted by ``allocated``. The comparison
with a loaded worker's buffers is the worker's tests'; these hold the arithmetic on generated
adapters, by expectations computed here from the adapters' own tensor sizes."""

from pathlib import Path

import gguf
import numpy as np
import pytest

from gateway.models import testmodels as tm
from gateway.models.catalog import ModelCatalog
from gateway.models.config import AdapterSpec, ModelSpec
from gateway.models.ggufmeta import read_info
from gateway.models.ggufwriter import finish
from gateway.models.memory import GPU_ALIGNMENT, LORA_ALIGNMENT, allocated, estimate, lora_bytes
from gateway.protocol.topology import Device

GPU = Device("CUDA0", "a card", "gpu", 80 * 2**30, 80 * 2**30)


def write_adapter(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 1.0)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    finish(w)
    return path


@pytest.fixture
def model(tmp_path) -> Path:
    return tm.plain(tmp_path / "chat.gguf").path


@pytest.fixture
def everywhere(tmp_path, model) -> Path:
    """An adapter of a tensor in each place: the input layer (token_embd), layer 0, the output
    layer (output.weight), and a norm llama.cpp skips. Rank 1 in F32: rows of 4 x n bytes, most not
    a multiple of any alignment, so the padding shows."""
    info = read_info(model)
    e, v = info.embedding_length, info.n_vocab
    f32 = np.float32
    return write_adapter(tmp_path / "everywhere.gguf", {
        "token_embd.weight.lora_a": np.zeros((v, 1), f32), "token_embd.weight.lora_b": np.zeros((e, 1), f32),
        "blk.0.attn_q.weight.lora_a": np.zeros((1, e), f32), "blk.0.attn_q.weight.lora_b": np.zeros((e, 1), f32),
        "output.weight.lora_a": np.zeros((1, e), f32), "output.weight.lora_b": np.zeros((v, 1), f32),
        "blk.0.attn_norm.weight": np.zeros(e, f32)})


def padded(n: int, to: int) -> int:
    return -(-n // to) * to


def sizes(adapter: Path) -> dict[str, list[int]]:
    """Each adapted model tensor's lora_a and lora_b bytes, unpadded, read with gguf's own reader."""
    out: dict[str, list[int]] = {}
    for t in gguf.GGUFReader(str(adapter)).tensors:
        if t.name.endswith((".lora_a", ".lora_b")):
            out.setdefault(t.name[:-7], []).append(int(t.n_bytes))
    return out


def expected(adapter: Path, place: dict[str, str]) -> dict[str, int]:
    """By pool: each lora tensor padded to its pool's alignment (32 in RAM, 128 on a GPU)."""
    out: dict[str, int] = {}
    for target, each in sizes(adapter).items():
        pool = place[target]
        out[pool] = out.get(pool, 0) + sum(padded(n, 32 if pool == "ram" else 128) for n in each)
    return out


def test_an_adapter_on_the_cpu_adds_its_padded_tensors_to_ram_and_nothing_else(model, everywhere):
    info, adapter = read_info(model), read_info(everywhere)
    bare = estimate(info, ModelSpec("m", model))
    spec = ModelSpec("m", model, loras=(AdapterSpec("e", everywhere),))
    est = estimate(info, spec, adapters=[adapter])
    want = expected(everywhere, {"token_embd.weight": "ram", "blk.0.attn_q.weight": "ram", "output.weight": "ram"})
    unpadded = sum(n for each in sizes(everywhere).values() for n in each)
    assert want["ram"] > unpadded  # the padding is there to count
    assert bare.lora == 0 and est.lora == want["ram"]
    assert est.devices == {"ram": bare.devices["ram"] + want["ram"]}
    assert est.total == bare.total + want["ram"]
    assert (est.weights, est.kv, est.compute) == (bare.weights, bare.kv, bare.compute)
    assert est.describe()["lora"] == want["ram"] and est.describe()["total"] == est.total


@pytest.mark.parametrize(("layers", "pools", "place"), [
    (-1, ["cuda0", "cuda0"], {"token_embd.weight": "ram", "blk.0.attn_q.weight": "cuda0", "output.weight": "cuda0"}),
    (1, ["ram", "cuda0"], {"token_embd.weight": "ram", "blk.0.attn_q.weight": "ram", "output.weight": "cuda0"}),
    (0, ["ram", "ram"], {"token_embd.weight": "ram", "blk.0.attn_q.weight": "ram", "output.weight": "ram"}),
])
def test_on_a_gpu_each_tensor_is_where_the_tensor_it_adapts_lies(model, everywhere, layers, pools, place):
    """``n_gpu_layers``: -1 puts layer 0 and the output layer on the GPU, 1 the output layer
    alone, 0 nothing; the token embeddings stay in RAM whatever it says."""
    info, adapter = read_info(model), read_info(everywhere)
    spec = ModelSpec("m", model, n_gpu_layers=layers)
    bare, est = estimate(info, spec, [GPU]), estimate(info, spec, [GPU], adapters=[adapter])
    want = expected(everywhere, place)
    assert lora_bytes(adapter, pools) == want
    assert est.lora == sum(want.values())
    assert {p: est.devices[p] - bare.devices.get(p, 0) for p in est.devices} == {p: want.get(p, 0) for p in est.devices}


def test_the_alignments_are_ggmls():
    assert LORA_ALIGNMENT == {"ram": 32} and GPU_ALIGNMENT == 128  # TENSOR_ALIGNMENT; CUDA's buffer type's


def test_every_adapter_a_load_opens_counts(tmp_path, model, everywhere):
    info = read_info(model)
    second = read_info(tm.lora_adapter(model, tmp_path / "ends.gguf"))
    one = estimate(info, ModelSpec("m", model), adapters=[read_info(everywhere)])
    two = estimate(info, ModelSpec("m", model), adapters=[read_info(everywhere), second])
    assert two.lora == one.lora + sum(padded(n, 32) for _, _, n in second.tensors)
    assert two.total - one.total == two.lora - one.lora


def test_the_catalog_hands_the_estimate_every_adapter_a_load_opens(tmp_path, model, everywhere):
    ends = tm.lora_adapter(model, tmp_path / "ends.gguf")
    spec = ModelSpec("m", model, lora=((ends, 1.0),),
                     loras=(AdapterSpec("e", everywhere), AdapterSpec("gone", tmp_path / "gone.gguf")))
    assert [a.path for a in ModelCatalog.adapters(spec)] == [ends, everywhere]  # an unreadable one is its load's to say
    assert ModelCatalog.adapters(ModelSpec("m", model)) == []


def test_allocated_counts_llama_cpps_lora_buffers_by_device():
    buffers = {"model": {"cpu": 1000, "cuda0": 5000}, "kv": {"cuda0": 200}, "lora": {"cpu": 64, "cuda0": 256}}
    got = allocated(buffers)
    assert got["lora"] == 320 and got["total"] == 1000 + 5000 + 200 + 320
    assert got["devices"] == {"ram": 1064, "cuda0": 5456}


@pytest.mark.parametrize("rank", [32, 128])
async def test_the_estimate_with_adapters_is_within_5_percent_of_llama_cpps_allocation(tmp_path, rank):
    """A real-vocabulary model with one adapter applied to every request (``lora``) and two named
    ones (``loras``), of ranks that make their buffers a few MiB: what llama.cpp reports it allocated for them (its "LoRA buffer size" lines)
    against the estimate's ``lora``, and the whole against the whole."""
    from helpers import tiny_random_model

    from gateway.backends.local import start_local
    from gateway.models.config import ServerConfig

    base = tiny_random_model("qwen2", seed=7)
    made = [tm.random_lora(base, tmp_path / f"a{i}.gguf", seed=i, rank=rank) for i in range(3)]
    spec = ModelSpec("m", base, lora=((made[0], 1.0),),
                     loras=(AdapterSpec("b", made[1]), AdapterSpec("c", made[2], scale=0.5)))
    backend = await start_local(spec, ServerConfig(kv_cache_max_bytes=0), on_exit=lambda b, e: None,
                                on_busy=lambda: None, on_progress=lambda f: None)
    try:
        got = allocated(backend.info["buffers"])
    finally:
        await backend.stop()
    est = estimate(read_info(base), spec, adapters=ModelCatalog.adapters(spec)).describe()
    assert got is not None and got["lora"] > 0, got
    rounding = 3 * 0.005 * 2**20  # llama.cpp prints each adapter's buffer in MiB with two decimals
    assert abs(est["lora"] - got["lora"]) <= max(0.05 * got["lora"], rounding), (est, got)
    assert abs(est["total"] - got["total"]) <= max(0.05 * got["total"], 8 * 2**20), (est, got)
