"""Conversations that survive an unload (``worker/savedslots.py``): real llama.cpp workers save
their slots' caches when the model is unloaded and restore them when it loads again.

The model here is a random-weight llama with a real tokenizer, so a greedy answer depends on
every cached value: a cache restored wrong would answer differently."""

import json
import os
import stat

import pytest
from helpers import tiny_random_model

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import ConfigError, load_config, parse_bytes
from gateway.worker.promptcache import evict
from gateway.worker.savedslots import Saved, model_dir


@pytest.mark.parametrize(("sizes_used", "limit", "removed"), [
    ([(10, 1.0), (10, 2.0), (10, 3.0)], 30, []),
    ([(10, 1.0), (10, 2.0), (10, 3.0)], 29, [0]),  # the least recently used first
    ([(10, 3.0), (10, 1.0), (10, 2.0)], 15, [1, 2]),
    ([(50, 5.0), (10, 1.0)], 40, [1, 0]),  # the oldest goes even where it alone would not be enough
    ([(10, 1.0)], 0, [0]),
    ([], 0, []),
])
def test_eviction_removes_the_least_recently_used_until_the_rest_fit(sizes_used, limit, removed):
    saved = [Saved(path=f"s{i}", size=size, used=used) for i, (size, used) in enumerate(sizes_used)]
    assert [s.path for s in evict(saved, limit)] == [f"s{i}" for i in removed]


@pytest.mark.parametrize(("value", "want"), [(1024, 1024), ("512MiB", 512 * 2**20), ("4 GiB", 4 * 2**30),
                                             ("1.5GB", 1_500_000_000), ("0", 0), ("-1", None), ("lots", None),
                                             (True, None), (-5, None), ("5 parsecs", None)])
def test_sizes(value, want):
    assert parse_bytes(value) == want


def test_a_bad_bound_names_its_place(write_config):
    with pytest.raises(ConfigError) as e:
        load_config(write_config("server:\n  kv_cache_max_bytes: lots\n"))
    assert "server.kv_cache_max_bytes: must be a size" in str(e.value)


@pytest.fixture(scope="module")
def random_model():
    return tiny_random_model("llama-spm", seed=3)


HISTORY = [{"role": "user", "content": "Tell me about the old lighthouse keeper and the storm. " * 12}]


async def turn(client, model, messages, max_tokens=12):
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": messages,
                                                          "max_tokens": max_tokens, "temperature": 0})
    body = await r.json()
    assert r.status == 200, body
    return body["choices"][0]["message"]["content"], body["usage"]


def gateway(write_config, tmp_path, models: str, server: str = ""):
    kv = tmp_path / "kv"
    cfg = write_config(f"server:\n  discover_default_stores: false\n  kv_cache_dir: {kv}\n{server}models:\n{models}")
    return create_app(load_config(cfg)), kv


async def conversation(client, model, unload: bool):
    """Two turns, with an unload between them or not: (answer, usage) of the second."""
    first, usage = await turn(client, model, HISTORY)
    if unload:
        r = await client.post("/models/unload", json={"model": model})
        assert r.status == 200
    second = [*HISTORY, {"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
    return (*await turn(client, model, second), usage)


async def test_a_conversation_continued_after_an_unload_decodes_only_its_new_tokens(
        aiohttp_client, write_config, tmp_path, random_model):
    models = f"  kept:\n    path: {random_model}\n    parallel: 1\n"
    app, kv = gateway(write_config, tmp_path, models)
    client = await aiohttp_client(app)
    stayed, stayed_usage, first_usage = await conversation(client, "kept", unload=False)
    await client.post("/models/unload", json={"model": "kept"})
    for f in kv.glob("*/*"):
        f.unlink()  # a fresh start for the second conversation
    returned, returned_usage, _ = await conversation(client, "kept", unload=True)
    assert returned == stayed  # the same greedy answer as when the model stayed loaded
    assert returned_usage["prompt_tokens"] == stayed_usage["prompt_tokens"]
    cached = returned_usage["prompt_tokens_details"]["cached_tokens"]
    assert cached == stayed_usage["prompt_tokens_details"]["cached_tokens"]  # what a loaded model reuses
    assert cached >= first_usage["prompt_tokens"]  # the whole first turn came back from disk
    assert stat.S_IMODE(kv.stat().st_mode) == 0o700 and stat.S_IMODE(next(kv.iterdir()).stat().st_mode) == 0o700


async def test_without_a_saved_cache_the_next_turn_reads_everything(aiohttp_client, write_config, tmp_path,
                                                                   random_model):
    app, kv = gateway(write_config, tmp_path, f"  m:\n    path: {random_model}\n    parallel: 1\n",
                      server="  kv_cache_max_bytes: 0\n")
    client = await aiohttp_client(app)
    _, usage, _ = await conversation(client, "m", unload=True)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0 and not kv.exists()


def saved_slots(kv, path) -> list:
    return sorted(p.name for p in model_dir(kv, str(path)).glob("slot-*"))


async def unloaded_after_a_turn(client, model):
    await turn(client, model, HISTORY)
    assert (await client.post("/models/unload", json={"model": model})).status == 200


async def refused(client, kv, path):
    """The next load finds the saved slot wrong: removed at the load, and the turn reads its
    whole prompt; then the model is unloaded again (saving a good one)."""
    _, usage = await turn(client, path.stem, HISTORY)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert saved_slots(kv, path) == []
    assert (await client.post("/models/unload", json={"model": path.stem})).status == 200
    assert saved_slots(kv, path) == ["slot-0.json", "slot-0.state"]


async def test_a_saved_cache_that_does_not_belong_is_removed_never_loaded(aiohttp_client, write_config, tmp_path,
                                                                         random_model):
    other = tm.plain(tmp_path / "other.gguf").path
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(random_model.read_bytes())
    app, kv = gateway(write_config, tmp_path, f"  mine:\n    path: {mine}\n    parallel: 1\n"
                                              f"  other:\n    path: {other}\n    parallel: 1\n")
    client = await aiohttp_client(app)
    await unloaded_after_a_turn(client, "mine")
    await unloaded_after_a_turn(client, "other")
    assert saved_slots(kv, mine) == saved_slots(kv, other) == ["slot-0.json", "slot-0.state"]

    # another model's saved slot, copied in as this one's: its note names the other model
    here, there = model_dir(kv, str(mine)), model_dir(kv, str(other))
    for name in ("slot-0.json", "slot-0.state"):
        (here / name).write_bytes((there / name).read_bytes())
    await refused(client, kv, mine)

    # cut short
    state = here / "slot-0.state"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    await refused(client, kv, mine)

    # damaged in the middle, same size
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    await refused(client, kv, mine)

    # the model file changed at the same path (a new download): its old caches mean nothing
    os.utime(mine, ns=(mine.stat().st_atime_ns, mine.stat().st_mtime_ns + 10**9))
    await refused(client, kv, mine)

    # another llama.cpp or other context settings: the note's identity differs
    note = json.loads((here / "slot-0.json").read_text())
    note["identity"] = "0" * 64
    (here / "slot-0.json").write_text(json.dumps(note))
    await refused(client, kv, mine)
    assert (await client.get("/health")).status == 200


async def test_the_saved_caches_stay_under_their_bound(aiohttp_client, write_config, tmp_path, random_model):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(random_model.read_bytes())
    b.write_bytes(random_model.read_bytes())
    probe, kv = gateway(write_config, tmp_path, f"  a:\n    path: {a}\n    parallel: 1\n")
    client = await aiohttp_client(probe)
    await unloaded_after_a_turn(client, "a")
    one = sum(f.stat().st_size for f in model_dir(kv, str(a)).iterdir())
    await client.close()

    bound = int(one * 1.5)  # room for one model's saved slot, not two
    app, kv = gateway(write_config, tmp_path, f"  a:\n    path: {a}\n    parallel: 1\n"
                                              f"  b:\n    path: {b}\n    parallel: 1\n",
                      server=f"  kv_cache_max_bytes: {bound}\n")
    client = await aiohttp_client(app)
    await unloaded_after_a_turn(client, "a")
    await unloaded_after_a_turn(client, "b")
    assert saved_slots(kv, a) == [] and saved_slots(kv, b) == ["slot-0.json", "slot-0.state"]
    assert sum(f.stat().st_size for f in kv.rglob("*") if f.is_file()) <= bound
    _, usage = await turn(client, "b", [*HISTORY, {"role": "assistant", "content": "x"}])
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # the survivor still loads


async def test_saved_files_are_private_and_a_directory_of_another_user_is_not_used(
        aiohttp_client, write_config, tmp_path, random_model):
    models = f"  kept:\n    path: {random_model}\n    parallel: 1\n"
    app, kv = gateway(write_config, tmp_path, models)
    client = await aiohttp_client(app)
    kv.mkdir(mode=0o777)
    os.chmod(kv, 0o777)  # a folder others may write into: narrowed before anything is kept there
    await unloaded_after_a_turn(client, "kept")
    assert stat.S_IMODE(kv.stat().st_mode) == 0o700
    files = list(model_dir(kv, str(random_model)).iterdir())
    assert len(files) == 2 and {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}
    if os.getuid() != 0:
        return  # making a folder another user's needs root
    os.chown(model_dir(kv, str(random_model)), 65534, 65534)  # another user's: not read, not written
    _, usage = await turn(client, "kept", HISTORY)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert (await client.post("/models/unload", json={"model": "kept"})).status == 200
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)  # left as they were


async def test_an_isolated_cache_comes_back_for_its_own_key_only(aiohttp_client, write_config, tmp_path,
                                                                 random_model):
    models = f"  kept:\n    path: {random_model}\n    parallel: 1\n"
    app, _ = gateway(write_config, tmp_path, models,
                     server="  api_keys: {alice: a-key, bob: b-key}\n  isolate_cache_by_key: true\n")
    client = await aiohttp_client(app)

    async def cached(k: str) -> int:
        r = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {k}"}, json={
            "model": "kept", "messages": HISTORY, "max_tokens": 2, "temperature": 0})
        assert r.status == 200
        return (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]

    await cached("a-key")
    r = await client.post("/models/unload", headers={"Authorization": "Bearer a-key"}, json={"model": "kept"})
    assert r.status == 200
    assert await cached("b-key") == 0  # the saved slot came back as alice's
    # bob's prompt took the slot: hers was kept in memory (the prompt cache), for her only
    assert await cached("a-key") > 0
    r = await client.post("/models/unload", headers={"Authorization": "Bearer a-key"}, json={"model": "kept"})
    assert r.status == 200
    assert await cached("a-key") > 0  # restored, and hers
