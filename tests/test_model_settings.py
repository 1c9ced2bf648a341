"""The model settings llama-server users bring (models.yaml), checked with the YAML path in
each error and passed to llama.cpp; pinning; the thread default."""

import asyncio
import textwrap

import pytest

from gateway.app import create_app
from gateway.backends.local import start_local
from gateway.models import testmodels as tm
from gateway.models.config import ConfigError, ServerConfig, load_config
from gateway.protocol.topology import physical_cores

HI = [{"role": "user", "content": "hi"}]


def config(write_config, model_dir, entry: str, server: str = ""):
    return load_config(write_config(f"server:\n  discover_default_stores: false\n{server}models:\n"
                                    f"  m:\n    path: {model_dir}/plain.gguf\n" + textwrap.indent(entry, "    ")))


@pytest.mark.parametrize(("entry", "where", "says"), [
    ("cache_type_k: q3_k\n", "models.m.cache_type_k", "must be one of f32, f16, bf16, q8_0"),
    ("cache_type_v: q8_0\nflash_attn: false\n", "models.m.cache_type_v", "needs flash attention"),
    ("n_batch: 256\nn_ubatch: 512\n", "models.m.n_ubatch", "at most n_batch (256)"),
    ("n_ubatch: 0\n", "models.m.n_ubatch", "positive integer"),
    ("n_threads_batch: -2\n", "models.m.n_threads_batch", "positive integer"),
    ("split_mode: diagonal\n", "models.m.split_mode", "none, layer, row"),
    ("tensor_split: [0, 0]\n", "models.m.tensor_split", "not all 0"),
    ("tensor_split: 3\n", "models.m.tensor_split", "list of each GPU's share"),
    ("main_gpu: -1\n", "models.m.main_gpu", "GPU index"),
    ("rope_freq_base: 0\n", "models.m.rope_freq_base", "number > 0"),
    ("rope_freq_scale: fast\n", "models.m.rope_freq_scale", "number > 0"),
    ("use_mlock: maybe\n", "models.m.use_mlock", ""),
    ("kv_unified: 1\n", "models.m.kv_unified", ""),
    ("lora: [{scale: 0.5}]\n", "models.m.lora[0].path", "is required"),
    ("lora: [{path: a.gguf, scale: big}]\n", "models.m.lora[0].scale", "must be a number"),
    ("lora: [{path: a.gguf, rank: 8}]\n", "models.m.lora[0].rank", "unknown key"),
    ("pin: yes please\n", "models.m.pin", ""),
    ("devices: CUDA0\n", "models.m.devices", "none or a list of distinct device names"),
    ("devices: []\n", "models.m.devices", "none or a list"),
    ("devices: [CUDA0, cuda0]\n", "models.m.devices", "distinct"),
    ("devices: [CUDA0, none]\n", "models.m.devices", "none or a list"),
])
def test_each_setting_is_checked_with_its_place(write_config, model_dir, entry, where, says):
    with pytest.raises(ConfigError) as e:
        config(write_config, model_dir, entry)
    assert f"{where}: " in str(e.value) and says in str(e.value), str(e.value)


def test_devices_is_none_or_names(write_config, model_dir):
    assert config(write_config, model_dir, "devices: None\n").models[0].devices == ()
    assert config(write_config, model_dir, "devices: [CUDA1, Vulkan0]\n").models[0].devices == ("CUDA1", "Vulkan0")
    assert config(write_config, model_dir, "n_ctx: 512\n").models[0].devices is None  # every GPU


@pytest.mark.parametrize(("names", "says"), [(("CUDA7",), "llama.cpp has no device 'CUDA7' to offload to"),
                                             (("CPU",), "llama.cpp has no device 'CPU' to offload to")])
async def test_a_device_llama_cpp_does_not_have_fails_the_load_naming_what_it_has(write_config, model_dir, names,
                                                                                  says):
    from dataclasses import replace

    from gateway.backends.local import StartFailed

    spec = replace(config(write_config, model_dir, "n_ctx: 512\n").models[0], devices=names)
    with pytest.raises(StartFailed) as e:
        await start_local(spec, ServerConfig(kv_cache_max_bytes=0), on_exit=lambda b, e: None,
                          on_busy=lambda: None, on_progress=lambda f: None)
    assert says in str(e.value) and "(it has: " in str(e.value) and "gguf-gateway devices" in str(e.value)


async def test_devices_none_keeps_the_model_off_every_gpu(write_config, model_dir):
    spec = config(write_config, model_dir, "n_ctx: 512\ndevices: none\n").models[0]
    backend = await start_local(spec, ServerConfig(kv_cache_max_bytes=0), on_exit=lambda b, e: None,
                                on_busy=lambda: None, on_progress=lambda f: None)
    try:
        assert backend.info["gpu_offload"] is False and backend.info["device"] == "cpu"
        assert set(backend.info["buffers"]["model"]) == {"cpu"}
        assert [d["kind"] for d in backend.info["devices"]] == ["cpu"]  # no GPU asked
    finally:
        await backend.stop()


def test_the_settings_are_read(write_config, model_dir, tmp_path):
    spec = config(write_config, model_dir, "cache_type_k: q8_0\ncache_type_v: q4_0\nn_ubatch: 128\n"
                  "n_threads_batch: 3\nmain_gpu: 1\nsplit_mode: row\ntensor_split: [3, 1]\nuse_mlock: true\n"
                  "rope_freq_base: 20000\nrope_freq_scale: 0.5\nkv_unified: true\npin: true\n"
                  "lora: [a.gguf, {path: /x/b.gguf, scale: 0.25}]\n").models[0]
    assert (spec.cache_type_k, spec.cache_type_v, spec.n_ubatch, spec.n_threads_batch) == ("q8_0", "q4_0", 128, 3)
    assert (spec.main_gpu, spec.split_mode, spec.tensor_split, spec.use_mlock) == (1, "row", (3.0, 1.0), True)
    assert (spec.rope_freq_base, spec.rope_freq_scale, spec.kv_unified, spec.pin) == (20000.0, 0.5, True, True)
    assert [(p.name, s) for p, s in spec.lora] == [("a.gguf", 1.0), ("b.gguf", 0.25)]


async def test_the_settings_reach_llama_cpp(write_config, model_dir):
    spec = config(write_config, model_dir, "n_ctx: 512\nparallel: 2\ncache_type_k: q8_0\ncache_type_v: q8_0\n"
                  "n_batch: 256\nn_ubatch: 64\nn_threads: 2\nn_threads_batch: 1\nrope_freq_base: 20000\n"
                  "kv_unified: true\n").models[0]
    backend = await start_local(spec, ServerConfig(kv_cache_max_bytes=0), on_exit=lambda b, e: None,
                                on_busy=lambda: None, on_progress=lambda f: None)
    try:
        info = backend.info
        assert (info["cache_type_k"], info["cache_type_v"], info["n_ubatch"], info["n_batch"]) == \
            ("q8_0", "q8_0", 64, 256)
        assert info["n_threads"] == 2 and info["n_threads_batch"] == 1 and info["rope_freq_base"] == 20000.0
        assert info["kv_unified"] is True and info["n_ctx_total"] == 512  # one pool, not 2 x 512
        assert info["parallel"] == 2
    finally:
        await backend.stop()


async def test_a_full_shared_pool_gives_back_idle_slots_caches(aiohttp_client, write_config, model_dir):
    """kv_unified, as llama-server's default: two conversations that do not fit together in the
    pool both answer, the second taking the cells the first's idle cache held."""
    app = create_app(config(write_config, model_dir, "n_ctx: 400\nparallel: 2\nkv_unified: true\n",
                            server="  kv_cache_max_bytes: 0\n"))
    client = await aiohttp_client(app)
    for word in ("apple", "river"):
        r = await client.post("/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": f"{word} " * 35}], "max_tokens": 4})  # ~300 tokens of 512
        body = await r.json()
        assert r.status == 200, body
        assert body["choices"][0]["message"]["content"] == "Hello, world!"


async def test_a_pinned_model_loads_at_start_and_stays(aiohttp_client, write_config, model_dir):
    cfg = load_config(write_config(f"""
        server:
          discover_default_stores: false
          keep_alive: 0
          max_loaded_models: 1
        models:
          kept:
            path: {model_dir}/plain.gguf
            pin: true
          other:
            path: {model_dir}/thinker.gguf
    """))
    client = await aiohttp_client(create_app(cfg))
    states = {m["id"]: m["state"] for m in (await (await client.get("/models")).json())["data"]}
    assert states["kept"] == "ready"  # loaded at start
    r = await client.post("/api/generate", json={"model": "kept", "prompt": "hi", "stream": False, "keep_alive": 0})
    assert r.status == 200
    await asyncio.sleep(0.3)  # keep_alive 0 (the server's and the request's): a pinned model stays
    r = await client.post("/v1/chat/completions", json={"model": "other", "messages": HI})
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "model_capacity" and "pinned" in body["error"]["message"]
    states = {m["id"]: m["state"] for m in (await (await client.get("/models")).json())["data"]}
    assert states == {"kept": "ready", "other": "unloaded"}


def test_threads_default_to_physical_cores(tmp_path):
    def cpu(n, package, core):
        d = tmp_path / f"cpu{n}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")

    for n, package, core in ((0, 0, 0), (1, 0, 1), (2, 0, 0), (3, 0, 1), (4, 1, 0), (5, 1, 0)):
        cpu(n, package, core)  # SMT: 0 and 2 share a core, 1 and 3, 4 and 5; two packages
    assert physical_cores({0, 1, 2, 3, 4, 5}, str(tmp_path)) == 3
    assert physical_cores({0, 2}, str(tmp_path)) == 1  # only one core's two threads are ours
    assert physical_cores({0, 7}, str(tmp_path)) == 2  # no topology for cpu7: count CPUs


@pytest.mark.parametrize(("scale", "answer"), [(1.0, ""), (0.0, "Hello, world!")])
async def test_a_lora_adapter_changes_the_answer_by_its_scale(aiohttp_client, write_config, tmp_path, scale, answer):
    model = tm.plain(tmp_path / "plain.gguf").path
    adapter = tm.lora_adapter(model, tmp_path / "end-at-once.gguf")  # makes the end of turn win every step
    cfg = load_config(write_config(f"server:\n  discover_default_stores: false\nmodels:\n  m:\n    path: {model}\n"
                                   f"    lora: [{{path: {adapter}, scale: {scale}}}]\n"))
    client = await aiohttp_client(create_app(cfg))
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": HI, "max_tokens": 8})
    body = await r.json()
    assert r.status == 200, body
    assert body["choices"][0]["message"]["content"] == answer


@pytest.mark.parametrize(("key", "what"), [("lora", "the LoRA adapter"), ("mmproj", "the projector file (mmproj)"),
                                           ("draft", "the draft model file")])
async def test_a_file_a_setting_names_that_is_not_there_fails_the_load_saying_so(aiohttp_client, write_config,
                                                                              tmp_path, key, what):
    model = tm.plain(tmp_path / "plain.gguf").path
    gone = tmp_path / "gone.gguf"
    cfg = load_config(write_config(f"server:\n  discover_default_stores: false\nmodels:\n  m:\n    path: {model}\n"
                                   f"    {key}: {f'[{gone}]' if key == 'lora' else gone}\n"))
    assert cfg.warnings  # check-config and the start say so too
    client = await aiohttp_client(create_app(cfg))
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": HI})
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "model_load_failed", body
    assert f"{what} {gone} does not exist" in body["error"]["message"], body


async def test_a_lora_for_another_model_fails_the_load_with_its_reason(aiohttp_client, write_config, tmp_path):
    model = tm.plain(tmp_path / "plain.gguf").path
    other = tm.plain(tmp_path / "other.gguf", ["x"] * 200).path  # a larger vocabulary: other shapes
    adapter = tm.lora_adapter(other, tmp_path / "other-lora.gguf")
    cfg = load_config(write_config(f"server:\n  discover_default_stores: false\nmodels:\n  m:\n    path: {model}\n"
                                   f"    lora: [{adapter}]\n  fine:\n    path: {other}\n"))
    client = await aiohttp_client(create_app(cfg))
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": HI})
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "model_load_failed", body
    assert "LoRA adapter" in body["error"]["message"], body
    assert (await client.post("/v1/chat/completions", json={"model": "fine", "messages": HI})).status == 200
