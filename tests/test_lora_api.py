"""LoRA adapters through the gateway's API, on a scripted model and an adapter that makes the end
of turn win every step (with it the answer is empty, without it "Hello, world!"): picked by the
model's name (``BASE:ADAPTER``) or llama-server's per-request ``lora``, listed and rescaled at
``/lora-adapters``, loaded and unloaded at run time (vLLM's routes), and never sharing a cache
across adapter sets."""

import pytest

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

HI = [{"role": "user", "content": "hi"}]
BASE = "Hello, world!"


@pytest.fixture
def files(tmp_path):
    model = tm.plain(tmp_path / "plain.gguf").path
    other = tm.plain(tmp_path / "other.gguf", ["x"] * 200).path  # a larger vocabulary: other shapes
    return {"model": model, "end": tm.lora_adapter(model, tmp_path / "end.gguf"),
            "late": tm.lora_adapter(model, tmp_path / "late.gguf"),
            "foreign": tm.lora_adapter(other, tmp_path / "foreign.gguf")}


@pytest.fixture
async def client(aiohttp_client, write_config, files):
    cfg = load_config(write_config(
        "server:\n  discover_default_stores: false\nmodels:\n"
        f"  m:\n    path: {files['model']}\n    parallel: 1\n"
        f"    loras:\n      end: {files['end']}\n      half: {{path: {files['end']}, scale: 0.0}}\n"))
    return await aiohttp_client(create_app(cfg))


async def _chat(client, model="m", status=200, **extra):
    r = await client.post("/v1/chat/completions", json={"model": model, "messages": HI, "max_tokens": 8,
                                                         "temperature": 0, **extra})
    body = await r.json()
    assert r.status == status, body
    return body


async def _answer(client, model="m", **extra) -> str:
    return (await _chat(client, model, **extra))["choices"][0]["message"]["content"]


async def test_a_model_name_picks_an_adapter_and_the_base_stays_itself(client):
    assert await _answer(client, "m") == BASE
    assert await _answer(client, "m:end") == ""
    assert await _answer(client, "end") == ""  # its own name: one model has it
    assert await _answer(client, "m:half") == BASE  # named at scale 0: the base exactly
    assert await _answer(client, "m") == BASE  # and the base again after it
    missing = await _chat(client, "m:nope", status=404)
    assert missing["error"]["code"] == "model_not_found"


async def test_ollama_picks_an_adapter_by_the_model_name_only(client):
    r = await client.post("/api/chat", json={"model": "m:end", "messages": HI, "stream": False,
                                             "options": {"temperature": 0, "num_predict": 8}})
    body = await r.json()
    assert r.status == 200, body
    assert body["message"]["content"] == ""


async def test_the_per_request_lora_field_is_llama_servers(client):
    assert await _answer(client, lora=[{"id": 0, "scale": 1.0}]) == ""
    assert await _answer(client, lora=[{"id": 0, "scale": 0.0}]) == BASE
    assert await _answer(client, lora=[{"id": 0}]) == BASE  # a scale left out is 0, as llama-server reads it
    assert await _answer(client, "m:end", lora=[{"id": 1, "scale": 1.0}]) == ""  # the field wins over the name
    assert await _answer(client, "m:end", lora=[{"id": 0, "scale": 0}]) == BASE
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 8, "temperature": 0,
                                                   "lora": [{"id": 0, "scale": 1}]})
    assert r.status == 200 and (await r.json())["choices"][0]["text"] == ""


@pytest.mark.parametrize(("lora", "param"), [
    ({"id": 0}, "lora"), ([{"id": 9, "scale": 1}], "lora[0].id"), ([{"id": -1, "scale": 1}], "lora[0].id"),
    ([{"id": "0", "scale": 1}], "lora[0].id"), ([{"id": 0, "scale": "big"}], "lora[0].scale"),
    ([{"id": 0, "scale": 1e308}], "lora[0].scale"), ([7], "lora[0]"), ([{"id": 0, "scale": True}], "lora[0].scale"),
    ([{"id": 0, "scale": 1}] * 65, "lora"),
])
async def test_a_bad_lora_field_is_a_400_naming_it(client, lora, param):
    body = await _chat(client, status=400, lora=lora)
    assert body["error"]["param"] == param, body


async def test_lora_adapters_lists_and_sets_the_default_scales(client, files):
    r = await client.get("/lora-adapters?model=m")  # not loaded: from its entry, without loading it
    table = await r.json()
    assert r.status == 200, table
    assert [(a["id"], a["name"], a["scale"], a["named_scale"], a["model"]) for a in table] == [
        (0, "end", 0.0, 1.0, "m:end"), (1, "half", 0.0, 0.0, "m:half")]
    assert table[0]["path"] == str(files["end"])
    assert (await (await client.get("/models")).json())["data"][0]["state"] == "unloaded"
    r = await client.post("/lora-adapters?model=m", json=[{"id": 0, "scale": 1.0}])
    assert r.status == 200 and (await r.json()) == {"success": True}
    assert await _answer(client, "m") == ""  # every request now gets it
    r = await client.post("/lora-adapters", json=[])  # one model loaded: no ?model needed
    assert r.status == 200
    assert await _answer(client, "m") == BASE
    assert [a["scale"] for a in await (await client.get("/lora-adapters?model=m")).json()] == [0.0, 0.0]
    r = await client.post("/lora-adapters?model=m", json=[{"id": 5, "scale": 1.0}])
    assert r.status == 400 and (await r.json())["error"]["param"] == "[0].id"
    r = await client.post("/lora-adapters?model=m", json={"id": 0})
    assert r.status == 400


async def test_an_adapter_loads_and_unloads_at_run_time_and_a_foreign_one_is_refused(client, files):
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "m:late", "lora_path": str(files["late"])})
    assert r.status == 200, await r.text()
    assert await _answer(client, "m:late") == ""
    ids = [m["id"] for m in (await (await client.get("/v1/models")).json())["data"]]
    assert ids == ["m", "m:end", "m:half", "m:late"]
    again = await client.post("/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(files["late"])})
    assert again.status == 400 and (await again.json())["error"]["code"] == "adapter_exists"
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "m:foreign", "lora_path": str(files["foreign"])})
    body = await r.json()
    assert r.status == 400 and body["error"]["param"] == "lora_path", body
    assert "incorrect shape" in body["error"]["message"]  # llama.cpp's reason
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "m:late"})
    assert r.status == 200, await r.text()
    assert (await _chat(client, "m:late", status=404))["error"]["code"] == "model_not_found"
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "m:end"})  # models.yaml's stays
    assert r.status == 400 and "models.yaml" in (await r.json())["error"]["message"]
    assert await _answer(client, "m:end") == ""


async def test_an_adapter_loaded_at_run_time_outlives_the_models_unload(client, files):
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(files["late"]),
                                                         "base_model_name": "m"})
    assert r.status == 200, await r.text()
    r = await client.post("/lora-adapters?model=m", json=[{"id": 2, "scale": 1.0}])  # the run-time one, by default
    assert r.status == 200
    assert (await client.post("/models/unload", json={"model": "m"})).status == 200
    assert await _answer(client, "m") == ""  # loaded again with it, at the default set
    assert await _answer(client, "m:late") == ""
    assert await _answer(client, "m", lora=[{"id": 0, "scale": 0}]) == BASE


@pytest.mark.parametrize("body", [{}, {"lora_name": "m:x"}, {"lora_name": "m:a b", "lora_path": "/x"},
                                  {"lora_name": "m:x", "lora_path": "/no/such.gguf"},
                                  {"lora_name": "nobase:x", "lora_path": "/x"},
                                  {"lora_name": "m:x", "lora_path": "/x", "scale": "1"}])
async def test_a_bad_load_is_a_4xx_naming_the_field(client, body):
    r = await client.post("/v1/load_lora_adapter", json=body)
    assert 400 <= r.status < 500, await r.text()
    assert (await r.json())["error"]["param"] in ("lora_name", "lora_path", "scale", "model")


async def test_a_cache_made_under_one_adapter_set_is_not_reused_under_another(client):
    long = [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))}]

    async def cached(model):
        body = await _chat(client, model, messages=long)
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached("m:end") == 0
    assert await cached("m:end") > 0  # the same set: its own cache
    assert await cached("m") == 0  # the base: not the adapter's cache (one slot: that cache is kept in RAM)
    assert await cached("m:half") > 0  # at scale 0 it is the base: the base's cache
    assert await cached("m:end") > 0  # back under the adapter: its state from the prompt cache


def _alora(model, path, invocation: list[int]):
    """``tm.lora_adapter``'s adapter as an activated LoRA: applied from ``invocation`` on."""
    import gguf

    made = tm.lora_adapter(model, path)
    reader = gguf.GGUFReader(str(made))
    w = gguf.GGUFWriter(str(path) + ".alora", "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 1.0)
    w.add_key_value("adapter.alora.invocation_tokens", invocation, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data.reshape([int(d) for d in reversed(t.shape)]))
    tm.finish(w)
    return path.with_name(path.name + ".alora")


async def test_an_activated_lora_applies_from_its_invocation_on(client, files, tmp_path):
    r = await client.post("/tokenize", json={"model": "m", "content": "world", "add_special": False})
    invocation = (await r.json())["tokens"]
    adapter = _alora(files["model"], tmp_path / "alora.gguf", invocation)
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "m:act", "lora_path": str(adapter)})
    assert r.status == 200, await r.text()
    table = await (await client.get("/lora-adapters?model=m")).json()
    assert table[-1]["alora_invocation_tokens"] == invocation

    async def complete(text):
        return await _answer(client, "m:act", messages=[{"role": "user", "content": text}])

    assert await complete("hello there") == BASE  # not invoked: the base
    assert await complete("hello world, and more") == ""  # invoked: the adapter from there on
    assert await complete("hello there") == BASE
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hello world", "max_tokens": 8,
                                                   "lora": [{"id": 0, "scale": 1}, {"id": 2, "scale": 1}]})
    assert r.status == 200  # one aLoRA beside a plain adapter: the plain one applies throughout


async def test_a_draft_model_drafts_without_adapters_and_the_answer_stays_the_adapters(aiohttp_client, write_config,
                                                                                       files):
    cfg = load_config(write_config(
        "server:\n  discover_default_stores: false\nmodels:\n"
        f"  m:\n    path: {files['model']}\n    draft: {files['model']}\n    loras:\n      end: {files['end']}\n"))
    client = await aiohttp_client(create_app(cfg))
    assert await _answer(client, "m") == BASE  # the draft's proposals kept
    assert await _answer(client, "m:end") == ""  # refused: the adapter's choice is the answer
    assert await _answer(client, "m") == BASE


async def test_a_saved_cache_comes_back_under_its_adapter_set_only(aiohttp_client, write_config, files, tmp_path):
    cfg = load_config(write_config(
        f"server:\n  discover_default_stores: false\n  kv_cache_dir: {tmp_path / 'kv'}\nmodels:\n"
        f"  m:\n    path: {files['model']}\n    parallel: 1\n    loras:\n      end: {files['end']}\n"))
    client = await aiohttp_client(create_app(cfg))
    long = [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))}]

    async def usage(model):
        return (await _chat(client, model, messages=long))["usage"]

    await usage("m:end")
    assert (await client.post("/models/unload", json={"model": "m"})).status == 200  # saved, with its set
    assert (await usage("m"))["prompt_tokens_details"]["cached_tokens"] == 0  # restored, but not the base's
    assert (await client.post("/models/unload", json={"model": "m"})).status == 200
    assert (await usage("m:end"))["prompt_tokens_details"]["cached_tokens"] > 0  # the adapter's, from disk


NESTED = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(("method", "path", "body"), [
    ("post", "/v1/load_lora_adapter", '{"lora_name": "m:\\ud800", "lora_path": "/x.gguf"}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": "m:a", "lora_path": "/x\\udc80.gguf"}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": "m:a", "lora_path": ' + NESTED + '}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": "m:a", "lora_path": "/x.gguf", "scale": 1e400}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": "m:a", "lora_path": "/x.gguf", "scale": ' + "9" * 5000 + '}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": 7, "lora_path": "/x.gguf"}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": "a", "lora_path": ["/x.gguf"], "base_model_name": "m"}'),
    ("post", "/v1/load_lora_adapter", '{"lora_name": "a", "lora_path": "/x.gguf", "base_model_name": {"m": 1}}'),
    ("post", "/v1/load_lora_adapter", '[1, 2]'),
    ("post", "/v1/unload_lora_adapter", '{"lora_name": null}'),
    ("post", "/v1/unload_lora_adapter", '{"lora_name": "m:' + "a" * 5000 + '"}'),
    ("post", "/lora-adapters?model=m", '[{"id": 1e400, "scale": 1}]'),
    ("post", "/lora-adapters?model=m", '[{"id": ' + "9" * 5000 + ', "scale": 1}]'),
    ("post", "/lora-adapters?model=m", '[{"id": 0, "scale": [1]}]'),
    ("post", "/lora-adapters?model=m", NESTED),
    ("post", "/lora-adapters?model=m", '"\\ud800"'),
    ("get", "/lora-adapters?model=%ED%A0%80", None),
    ("get", "/lora-adapters?model=nobody", None),
    ("post", "/v1/chat/completions", '{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                                     '"lora": [{"id": ' + "9" * 5000 + ', "scale": 1}]}'),
    ("post", "/v1/chat/completions", '{"model": "m:\\ud800", "messages": [{"role": "user", "content": "hi"}]}'),
])
async def test_hostile_input_to_the_adapter_routes_is_a_4xx_in_openais_shape(client, method, path, body):
    r = await getattr(client, method)(path, data=body, headers={"Content-Type": "application/json"})
    got = await r.json()
    assert 400 <= r.status < 500, (r.status, got)
    assert set(got["error"]) >= {"message", "type", "param", "code"}, got


@pytest.mark.parametrize("content", [b"", b"GGUF" + b"\xff" * 60, b"not a gguf at all" * 100])
async def test_a_damaged_adapter_file_is_refused_and_the_model_keeps_serving(client, tmp_path, content):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    r = await client.post("/v1/load_lora_adapter", json={"lora_name": "m:bad", "lora_path": str(bad)})
    body = await r.json()
    assert r.status == 400 and body["error"]["param"] == "lora_path", body
    assert await _answer(client, "m") == BASE
    assert (await _chat(client, "m:bad", status=404))["error"]["code"] == "model_not_found"
