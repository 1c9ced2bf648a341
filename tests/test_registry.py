"""Resolution, discovery across the stores people have, and the model lifecycle."""

import asyncio
import hashlib
import json
import os
import shutil
import time

import pytest
from openapi import validate
from workerevents import BOUND, under_way, until

from gateway.app import REGISTRY, create_app
from gateway.backends.local import start_local
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.serving.registry import Registry

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """Model files to copy into stores: each answers with its own name."""
    d = tmp_path_factory.mktemp("scripted")
    for name in ("alpha", "beta", "gamma"):
        tm.plain(d / f"{name}.gguf", [name.capitalize(), " here"])
    tm.endless(d / "loop.gguf")
    return d


def ollama_store(root, blobs: dict[str, str], projectors: dict | None = None):
    """Ollama's layout: manifests/REGISTRY/NAMESPACE/MODEL/TAG -> blobs/sha256-HEX. ``blobs``: 'ns/model:tag' -> file;
    ``projectors``: 'ns/model:tag' -> its projector file (a layer of its own)."""
    def blob(src) -> str:
        data = src.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "blobs" / f"sha256-{digest}").write_bytes(data)
        return digest

    for ref, src in blobs.items():
        digest = blob(src)
        name, tag = ref.split(":")
        ns, model = name.split("/") if "/" in name else ("library", name)
        manifest = root / "manifests" / "registry.ollama.ai" / ns / model / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        layers = [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256-0"},
                  {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}",
                   "size": src.stat().st_size}]
        if projectors and ref in projectors:
            layers.append({"mediaType": "application/vnd.ollama.image.projector",
                           "digest": f"sha256:{blob(projectors[ref])}"})
        manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))


def hf_cache(hub, repo: str, src, filename: str):
    """The Hugging Face hub cache: models--ORG--REPO/snapshots/REV/FILE -> ../../blobs/HASH."""
    base = hub / ("models--" + repo.replace("/", "--"))
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    blob = base / "blobs" / hashlib.sha256(src.read_bytes()).hexdigest()
    shutil.copy(src, blob)
    snap = base / "snapshots" / "0123abc"
    snap.mkdir(parents=True, exist_ok=True)
    (snap / filename).symlink_to(os.path.relpath(blob, snap))


def config_for(write_config, body: str = "", **server):
    lines = ["server:", "  discover_default_stores: true"] + [f"  {k}: {json.dumps(v)}" for k, v in server.items()]
    return load_config(write_config("\n".join(lines) + "\n" + body))


async def chat(client, model, **extra):
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": HI, **extra})
    return r.status, await r.json(), r.headers


# --- discovery and names ------------------------------------------------------------------

def test_default_stores_and_their_names(_isolated_home, scripted, write_config):
    home = _isolated_home
    (home / "models").mkdir()
    shutil.copy(scripted / "alpha.gguf", home / "models" / "Alpha-7B-Q4_K_M.gguf")
    ollama_store(home / ".ollama" / "models", {"llama3.2:3b": scripted / "beta.gguf",
                                                 "llama3.2:latest": scripted / "beta.gguf",
                                                 "someone/tiny:q8": scripted / "gamma.gguf"})
    hf_cache(home / ".cache" / "huggingface" / "hub", "Org/Loop-GGUF", scripted / "loop.gguf", "loop-f16.gguf")
    (home / ".lmstudio" / "models" / "pub" / "repo").mkdir(parents=True)
    shutil.copy(scripted / "gamma.gguf", home / ".lmstudio" / "models" / "pub" / "repo" / "g-Q8_0.gguf")

    reg = Registry(config_for(write_config))
    def file_of(name):
        spec = reg.resolve(name)
        return spec and os.path.realpath(spec.path)
    assert reg.resolve("alpha-7b-q4_k_m").source == "discovered"
    assert file_of("LLAMA3.2:3b") == file_of("llama3.2") == file_of("llama3.2:latest")
    assert reg.resolve("llama3.2:3b").source == "ollama"
    assert reg.resolve("someone/tiny:q8").source == "ollama"
    assert reg.resolve("org/loop-gguf").source == "huggingface"
    assert reg.resolve("org/loop-gguf:f16") == reg.resolve("loop-f16")
    assert reg.resolve("pub/repo").source == "lmstudio"
    assert reg.resolve("llama:anything") is not None  # the architecture, then name:tag -> name
    assert reg.resolve("llama3.2:70b") == reg.resolve("llama3.2")  # an unknown tag falls back to the name

    off = Registry(config_for(write_config, discover_default_stores=False))
    assert off.specs() == []


def header_projector(path, audio: bool = False):
    """A projector's header (libmtmd's keys) over one tensor: what discovery reads of it."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.type", "mmproj")
    w.add_bool("clip.has_vision_encoder", not audio)
    w.add_bool("clip.has_audio_encoder", audio)
    w.add_tensor("mm.0.weight", np.zeros((4, 4), dtype=np.float32))
    tm.finish(w)
    return path


def test_projectors_go_with_the_models_beside_them(_isolated_home, scripted, write_config, tmp_path):
    home = _isolated_home
    folder = home / "models" / "vl"
    folder.mkdir(parents=True)
    for name in ("Vision-Q4_K_M", "Vision-Q8_0"):
        shutil.copy(scripted / "alpha.gguf", folder / f"{name}.gguf")
    header_projector(folder / "mmproj-Vision-Q8_0.gguf")
    header_projector(folder / "mmproj-Vision-F16.gguf")
    shutil.copy(scripted / "beta.gguf", home / "models" / "text-only.gguf")
    hf_cache(home / ".cache" / "huggingface" / "hub", "Org/Ear-GGUF", scripted / "loop.gguf", "ear-q4.gguf")
    snapshot = next((home / ".cache" / "huggingface" / "hub" / "models--Org--Ear-GGUF" / "snapshots").iterdir())
    header_projector(snapshot / "mmproj-ear.gguf", audio=True)
    (home / ".lmstudio" / "models" / "pub" / "repo").mkdir(parents=True)
    shutil.copy(scripted / "gamma.gguf", home / ".lmstudio" / "models" / "pub" / "repo" / "g-Q8_0.gguf")
    header_projector(home / ".lmstudio" / "models" / "pub" / "repo" / "mmproj-model-f16.gguf")
    ollama_store(home / ".ollama" / "models", {"gemma3:4b": scripted / "gamma.gguf", "plain:1b": scripted / "beta.gguf"},
                 projectors={"gemma3:4b": header_projector(tmp_path / "proj.gguf")})

    reg = Registry(config_for(write_config))
    for name in ("vision-q4_k_m", "vision-q8_0"):
        assert reg.resolve(name).mmproj.name == "mmproj-Vision-F16.gguf"  # the F16 of two quantizations
        assert reg.media(reg.resolve(name)) == ["image"]
    assert reg.resolve("mmproj-vision-f16") is None  # a projector is no model to serve
    assert reg.resolve("text-only").mmproj is None and reg.media(reg.resolve("text-only")) == []
    assert reg.resolve("org/ear-gguf").mmproj.name == "mmproj-ear.gguf"
    assert reg.media(reg.resolve("org/ear-gguf")) == ["audio"]
    assert reg.resolve("pub/repo").mmproj.name == "mmproj-model-f16.gguf"
    assert reg.media(reg.resolve("gemma3:4b")) == ["image"] and reg.resolve("gemma3:4b").mmproj.parent.name == "blobs"
    assert reg.resolve("plain:1b").mmproj is None
    with_projector, without = reg.estimate(reg.resolve("gemma3:4b")), reg.estimate(reg.resolve("pub/repo"))
    assert with_projector["projector"] > 0 and without["projector"] > 0
    assert reg.estimate(reg.resolve("plain:1b"))["projector"] == 0


def test_a_hostile_ollama_manifest_is_skipped_and_the_others_kept(_isolated_home, scripted, write_config):
    """A store's manifest is another program's text: one nested 100,000 deep, one of 2 MiB and
    one that is no object are each skipped (bounded, never a RecursionError), the rest listed."""
    store = _isolated_home / ".ollama" / "models"
    ollama_store(store, {"good:1b": scripted / "beta.gguf", "deep:1b": scripted / "beta.gguf",
                         "huge:1b": scripted / "beta.gguf", "list:1b": scripted / "beta.gguf"})
    manifests = store / "manifests" / "registry.ollama.ai" / "library"
    (manifests / "deep" / "1b").write_text("[" * 100_000 + "]" * 100_000)
    huge = json.loads((manifests / "huge" / "1b").read_text())
    (manifests / "huge" / "1b").write_text(json.dumps({**huge, "padding": "x" * (2 << 20)}))
    (manifests / "list" / "1b").write_text("[1, 2]")
    reg = Registry(config_for(write_config))
    assert reg.resolve("good:1b").source == "ollama"
    assert [reg.resolve(n) for n in ("deep:1b", "huge:1b", "list:1b")] == [None, None, None]


def test_configuration_beats_discovery_and_the_architecture_is_a_last_resort(scripted, tmp_path, write_config):
    store = tmp_path / "store"
    store.mkdir()
    for name in ("alpha", "beta"):
        shutil.copy(scripted / f"{name}.gguf", store / f"{name}.gguf")
    reg = Registry(config_for(write_config, f"models:\n  beta: {scripted}/gamma.gguf\n",
                              models_dirs=[str(store)], discover_default_stores=False))
    assert reg.resolve("beta").path == scripted / "gamma.gguf"
    assert reg.resolve("alpha").path == store / "alpha.gguf"
    # "llama" is claimed by both store files by architecture: the first by path wins, every time
    assert reg.resolve("llama").path == store / "alpha.gguf"
    assert {str(p) for p in reg.conflicts_won(reg.resolve("llama"))["llama"]} == {str(store / "beta.gguf")}


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "..%2F..%2Fetc%2Fpasswd", "alpha.gguf",
                                  "store/alpha", "", "   ", "%61lpha"])
def test_path_like_names_resolve_to_nothing(scripted, tmp_path, write_config, name):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(scripted / "alpha.gguf", store / "alpha.gguf")
    reg = Registry(config_for(write_config, models_dirs=[str(store)], discover_default_stores=False))
    assert reg.resolve(" ALPHA ").name == "alpha"
    assert reg.resolve(name) is None


async def test_path_like_names_are_404_over_http(aiohttp_client, scripted, write_config):
    client = await aiohttp_client(create_app(config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n")))
    for name in ("../../etc/passwd", str(scripted / "alpha.gguf"), "..%2f..%2fetc%2fpasswd"):
        status, body, _ = await chat(client, name)
        assert status == 404 and body["error"]["code"] == "model_not_found"


async def test_a_glob_alias_serves_the_names_a_client_asks_for(aiohttp_client, scripted, write_config):
    client = await aiohttp_client(create_app(config_for(write_config, (
        f"models:\n  a:\n    path: {scripted}/alpha.gguf\n    aliases: ['claude-*']\n"
        f"  b:\n    path: {scripted}/beta.gguf\n    aliases: ['claude-haiku']\n"))))
    status, body, _ = await chat(client, "claude-sonnet-4-5-20250929")
    assert status == 200 and body["model"] == "a"  # the model that answered, as for any alias
    assert body["choices"][0]["message"]["content"] == "Alpha here"
    status, body, _ = await chat(client, "claude-haiku")  # an exact alias before any pattern
    assert status == 200 and body["choices"][0]["message"]["content"] == "Beta here"
    status, body, _ = await chat(client, "gpt-5")
    assert status == 404 and body["error"]["code"] == "model_not_found"


def test_split_files_are_one_model(tmp_path, write_config):
    store = tmp_path / "store"
    tm.plain(store / "big.gguf" if store.mkdir() is None else None, split_max_tensors=4)
    assert len(list(store.iterdir())) == 3
    reg = Registry(config_for(write_config, models_dirs=[str(store)], discover_default_stores=False))
    assert [s.name for s in reg.specs()] == ["big"]
    assert reg.resolve("big").path.name == "big-00001-of-00003.gguf"


async def test_a_split_model_answers(aiohttp_client, tmp_path, write_config):
    tm.plain(tmp_path / "big.gguf", ["Split", " works"], split_max_tensors=4)
    client = await aiohttp_client(create_app(config_for(write_config, models_dirs=[str(tmp_path)],
                                                        discover_default_stores=False)))
    status, body, _ = await chat(client, "big")
    assert status == 200 and body["choices"][0]["message"]["content"] == "Split works"


async def test_a_broken_file_beside_good_ones(aiohttp_client, scripted, tmp_path, write_config):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(scripted / "alpha.gguf", store / "alpha.gguf")
    (store / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    data = (scripted / "beta.gguf").read_bytes()
    (store / "cut.gguf").write_bytes(data[: len(data) - 1000])  # truncated tensor data
    client = await aiohttp_client(create_app(config_for(write_config, models_dirs=[str(store)],
                                                        discover_default_stores=False)))
    for name, reason in (("broken", "absurd counts"), ("cut", "truncated tensor data")):
        status, body, headers = await chat(client, name)
        assert status == 503 and body["error"]["code"] == "model_load_failed", body
        assert name in body["error"]["message"] and reason in body["error"]["message"]
        assert int(headers["Retry-After"]) >= 1
    status, body, _ = await chat(client, "alpha")
    assert status == 200 and body["choices"][0]["message"]["content"] == "Alpha here"
    listing = await (await client.get("/models")).json()
    states = {m["id"]: m["state"] for m in listing["data"]}
    assert states == {"alpha": "ready", "broken": "failed", "cut": "failed"}


# --- lifecycle ------------------------------------------------------------------------------

def counting(spawned: list[str]):
    """The local backend factory, noting each model it starts."""
    async def backends(spec, server, **hooks):
        spawned.append(spec.name)
        return await start_local(spec, server, **hooks)
    return backends


async def test_concurrent_first_requests_start_one_load(aiohttp_client, scripted, write_config):
    config, spawned = config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n"), []
    client = await aiohttp_client(create_app(config, Registry(config, backends=counting(spawned))))
    results = await asyncio.gather(*(chat(client, "a") for _ in range(6)))
    assert [r[0] for r in results] == [200] * 6
    assert spawned == ["a"]


async def test_lru_eviction_never_takes_a_busy_model(aiohttp_client, scripted, write_config):
    cfg = config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n  b: {scripted}/beta.gguf\n"
                                   f"  c: {scripted}/gamma.gguf\n  loop: {scripted}/loop.gguf\n",
                     max_loaded_models=2, keep_alive=-1)
    client = await aiohttp_client(create_app(cfg))
    reg = client.app[REGISTRY]
    await chat(client, "a")
    await chat(client, "b")
    assert set(reg.loaded()) == {"a", "b"}
    await chat(client, "a")  # a is now the most recently used
    await chat(client, "c")
    assert set(reg.loaded()) == {"a", "c"}  # b was the least recently used
    # a long stream keeps "loop" busy: loading two more evicts the idle ones, never loop
    resp = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True})
    await under_way(resp)
    assert set(reg.loaded()) == {"loop", "c"} or set(reg.loaded()) == {"loop", "a"}
    status, body, _ = await chat(client, "b")
    assert status == 200 and set(reg.loaded()) == {"loop", "b"}
    resp.close()


async def test_two_loads_waiting_for_one_room_do_not_wait_for_each_other(aiohttp_client, scripted, write_config):
    # a is loaded; b and c are asked for at once with room for one: once a's swap goes, b and c
    # are both "loading" while they wait for room, and neither may count the other as holding it
    # (each waited for the other forever, the gateway's answer to three clients on three models)
    cfg = config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n  b: {scripted}/beta.gguf\n"
                                   f"  c: {scripted}/gamma.gguf\n", max_loaded_models=1, swap_hold_seconds=0)
    client = await aiohttp_client(create_app(cfg))
    reg = client.app[REGISTRY]
    assert (await chat(client, "a"))[0] == 200
    got = await asyncio.wait_for(asyncio.gather(chat(client, "b"), chat(client, "c")), BOUND)
    assert [g[0] for g in got] == [200, 200]
    assert len(reg.loaded()) == 1  # one after the other, never both


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_idle_models_unload_after_keep_alive(aiohttp_client, scripted, write_config):
    cfg = config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n"
                                   f"  b:\n    path: {scripted}/beta.gguf\n    keep_alive: -1\n",
                     keep_alive="200ms")
    client = await aiohttp_client(create_app(cfg))
    reg = client.app[REGISTRY]
    await chat(client, "b")
    await chat(client, "a")
    pid = reg.loaded()["a"].proc.pid
    await until(lambda: "a" not in reg.loaded(), "a unloaded after its keep_alive")
    assert set(reg.loaded()) == {"b"}
    await until(lambda: not alive(pid), "a's worker process gone")  # really gone
    status, _, _ = await chat(client, "a")  # and loads again on demand
    assert status == 200


async def test_load_timeout_zero_answers_503_at_once_then_serves(aiohttp_client, scripted, write_config):
    client = await aiohttp_client(create_app(config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n",
                                                        load_timeout=0)))
    status, body, headers = await chat(client, "a")
    assert status == 503 and body["error"]["code"] == "model_loading" and headers["Retry-After"] == "5"
    validate(body, "ErrorResponse")
    async def answered() -> dict | None:
        status, body, _ = await chat(client, "a")
        return body if status == 200 else None

    deadline = time.monotonic() + BOUND  # the load runs on while each request is answered 503 at once
    while (body := await answered()) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert body is not None and body["choices"][0]["message"]["content"] == "Alpha here"


async def test_a_failed_load_backs_off_before_the_next_attempt(aiohttp_client, tmp_path, write_config):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 100)
    config, spawned = config_for(write_config, f"models:\n  bad: {bad}\n"), []
    client = await aiohttp_client(create_app(config, Registry(config, backends=counting(spawned),
                                                              backoff=(1.0, 300.0))))
    first = await chat(client, "bad")
    second = await chat(client, "bad")
    assert first[0] == second[0] == 503 and first[1]["error"]["code"] == "model_load_failed"
    assert first[2]["Retry-After"] == second[2]["Retry-After"] == "1"
    assert spawned == ["bad"]  # the second request did not try again inside the back-off
    await asyncio.sleep(1.05)
    third = await chat(client, "bad")
    assert third[0] == 503 and spawned == ["bad", "bad"] and third[2]["Retry-After"] == "2"  # tried, waits twice as long
    listing = await (await client.get("/models")).json()
    assert listing["data"][0]["state"] == "failed" and "bad.gguf" in listing["data"][0]["error"]


async def test_admin_api(aiohttp_client, scripted, write_config):
    cfg = config_for(write_config, f"models:\n  a:\n    path: {scripted}/alpha.gguf\n    aliases: [first]\n"
                                   f"  loop: {scripted}/loop.gguf\n", api_keys=["k"])
    client = await aiohttp_client(create_app(cfg), server_kwargs={"handler_cancellation": True})
    auth = {"Authorization": "Bearer k"}
    assert (await client.get("/models")).status == 401
    listing = await (await client.get("/models", headers=auth)).json()
    a = next(m for m in listing["data"] if m["id"] == "a")
    assert a["state"] == "unloaded" and a["aliases"] == ["first"] and a["architecture"] == "llama"
    assert a["file_size"] > 0 and a["source"] == "models.yaml" and a["pid"] is None
    r = await client.post("/models/load", json={"model": "FIRST"}, headers=auth)
    body = await r.json()
    assert r.status == 200 and body["state"] == "ready" and body["pid"] > 0 and body["n_ctx"] > 0
    if body["memory_bytes"] is not None:
        assert body["memory_bytes"] > 1 << 20
    r = await client.post("/models/unload", json={"model": "a"}, headers=auth)
    assert (await r.json())["state"] == "unloaded"
    assert (await client.post("/models/load", json={"model": "nope"}, headers=auth)).status == 404
    r = await client.post("/models/load", json={}, headers=auth)
    assert r.status == 400 and (await r.json())["error"]["param"] == "model"
    resp = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True},
                             headers=auth)
    await under_way(resp)
    r = await client.post("/models/unload", json={"model": "loop"}, headers=auth)
    assert r.status == 409 and (await r.json())["error"]["code"] == "model_busy"
    resp.close()


async def test_preload_loads_at_start(aiohttp_client, scripted, write_config):
    cfg = config_for(write_config, f"models:\n  a:\n    path: {scripted}/alpha.gguf\n    preload: true\n"
                                   f"  b: {scripted}/beta.gguf\n")
    client = await aiohttp_client(create_app(cfg))
    assert set(client.app[REGISTRY].loaded()) == {"a"}


async def test_a_loaded_model_keeps_answering_after_its_file_vanishes(aiohttp_client, scripted, tmp_path,
                                                                      write_config):
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(scripted / "alpha.gguf", store / "alpha.gguf")
    client = await aiohttp_client(create_app(config_for(write_config, models_dirs=[str(store)],
                                                        discover_default_stores=False)))
    await chat(client, "alpha")
    (store / "alpha.gguf").unlink()
    await asyncio.to_thread(client.app[REGISTRY].refresh)
    status, body, _ = await chat(client, "alpha")  # 1. the cache of loaded models answers first
    assert status == 200 and body["choices"][0]["message"]["content"] == "Alpha here"


async def test_a_miss_rescans_the_stores(aiohttp_client, scripted, tmp_path, write_config):
    config = config_for(write_config, models_dirs=[str(tmp_path)], discover_default_stores=False)
    client = await aiohttp_client(create_app(config, Registry(config, rescan_seconds=0.0)))
    assert (await chat(client, "beta"))[0] == 404
    shutil.copy(scripted / "beta.gguf", tmp_path / "beta.gguf")
    status, body, _ = await chat(client, "beta")
    assert status == 200 and body["choices"][0]["message"]["content"] == "Beta here"


async def test_reload_keeps_in_flight_requests_and_refuses_a_broken_file(aiohttp_client, scripted, write_config):
    path = write_config(f"models:\n  a: {scripted}/alpha.gguf\n  loop: {scripted}/loop.gguf\n")
    client = await aiohttp_client(create_app(load_config(path)), server_kwargs={"handler_cancellation": True})
    reg = client.app[REGISTRY]
    resp = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True,
                                                           "max_tokens": 3000})
    await under_way(resp)
    path.write_text(f"models:\n  b: {scripted}/beta.gguf\n  loop:\n    path: {scripted}/loop.gguf\n    n_ctx: 512\n")
    assert await reg.reload(path)
    assert [s.name for s in reg.specs()] == ["b", "loop"]
    assert (await chat(client, "a"))[0] == 404
    assert (await chat(client, "b"))[0] == 200
    text = (await resp.read()).decode()  # the stream that began before the reload ends normally
    assert text.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in text
    path.write_text("models: [broken\n")
    assert not await reg.reload(path)
    assert (await chat(client, "b"))[0] == 200


async def test_a_worker_that_cannot_start_is_a_503_not_a_500(aiohttp_client, scripted, write_config, monkeypatch):
    import sys

    client = await aiohttp_client(create_app(config_for(write_config, f"models:\n  a: {scripted}/alpha.gguf\n")))
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    status, body, headers = await chat(client, "a")
    assert status == 503 and body["error"]["code"] == "model_load_failed"
    assert "cannot start a model worker" in body["error"]["message"] and int(headers["Retry-After"]) >= 1


async def test_busy_workers_share_the_cpus(aiohttp_client, scripted, write_config):
    from gateway.protocol.topology import default_threads

    client = await aiohttp_client(create_app(config_for(write_config, f"models:\n  loop: {scripted}/loop.gguf\n"
                                                                      f"  loop2: {scripted}/loop.gguf\n")),
                                  server_kwargs={"handler_cancellation": True})
    reg = client.app[REGISTRY]
    first = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True})
    await under_way(first)
    assert reg.loaded()["loop"].threads == default_threads()  # alone: every CPU
    second = await client.post("/v1/chat/completions", json={"model": "loop2", "messages": HI, "stream": True})
    await under_way(second)
    both = max(1, default_threads() // 2)
    assert reg.loaded()["loop"].threads == reg.loaded()["loop2"].threads == both
    first.close()
    await until(lambda: reg.loaded()["loop2"].threads == default_threads(), "loop2 alone again: every CPU")
    second.close()
