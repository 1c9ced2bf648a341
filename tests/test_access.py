"""Keys that scope and count, in process against real scripted models: a key's models (a model
outside them is the same 404 as one nothing has, and missing from every listing), roles (what
only an admin may do), limits (429 with Retry-After in each wire's shape, naming the limit;
concurrent requests of one key never pass them), usage recorded per key, model and wire in
every wire that spends tokens, kept across a restart, and a damaged usage database that leaves
the gateway serving and enforcing its limits from memory."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from gateway.access import usage as usage_store
from gateway.api.admin import reload_configuration
from gateway.api.appkeys import GATE
from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

ROOT, ALICE, BOB = "root-key", "alice-key", "bob-key"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("access")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Hmm.", "It is 4.")
    tm.endless(d / "loop.gguf")
    tm.plain(d / "emb.gguf", ["x"])
    tm.reranker(d / "rr.gguf", {".": 0.7})
    tm.write_scripted_model(d / "coder.gguf", tm.Script([" ok"], trigger="<|fim_middle|>"),
                            extra_special=("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    return d


def config(write_config, files, keys: str, extra: str = "", name: str = "models.yaml"):
    return load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n{keys}{extra}"
        f"models:\n  plain:\n    path: {files}/plain.gguf\n    aliases: [greeter]\n  thinker: {files}/thinker.gguf\n"
        f"  loop:\n    path: {files}/loop.gguf\n    parallel: 4\n"
        f"  emb:\n    path: {files}/emb.gguf\n    embeddings: true\n  rr: {files}/rr.gguf\n  coder: {files}/coder.gguf\n",
        name))


KEYS = (f"    root: {ROOT}\n"
        f"    alice: {{key: {ALICE}, models: ['plain*', emb, rr]}}\n"
        f"    bob: {{key: {BOB}, role: user}}\n")


async def test_a_model_outside_the_keys_list_is_an_unknown_name_and_is_listed_nowhere(aiohttp_client, write_config,
                                                                                    files):
    client = await aiohttp_client(create_app(config(write_config, files, KEYS)))
    ids = [m["id"] for m in (await (await client.get("/v1/models", headers=auth(ALICE))).json())["data"]]
    assert ids == ["plain", "emb", "rr"]
    assert [m["name"] for m in (await (await client.get("/api/tags", headers=auth(ALICE))).json())["models"]] \
        == ["plain:latest", "emb:latest", "rr:latest"]
    assert [m["id"] for m in (await (await client.get("/models", headers=auth(ALICE))).json())["data"]] \
        == ["plain", "emb", "rr"]
    root_ids = [m["id"] for m in (await (await client.get("/v1/models", headers=auth(ROOT))).json())["data"]]
    assert {"thinker", "loop"} <= set(root_ids)
    # the same answer as for a name nothing has, byte for byte but the name
    for path, body in (("/v1/chat/completions", CHAT), ("/api/chat", {**CHAT, "stream": False}),
                       ("/v1/messages", {**CHAT, "max_tokens": 3}), ("/v1/responses", {"input": "hi"}),
                       ("/api/show", {}), ("/v1/completions", {"prompt": "x"})):
        outside = await client.post(path, headers=auth(ALICE), json={**body, "model": "thinker"})
        unknown = await client.post(path, headers=auth(ALICE), json={**body, "model": "nothing-has-this"})
        assert outside.status == unknown.status == 404, path
        told = (await outside.text()).replace("thinker", "NAME")
        assert told == (await unknown.text()).replace("nothing-has-this", "NAME"), path
    assert (await client.get("/props?model=thinker", headers=auth(ALICE))).status == 404
    # an alias of a model in the list is that model
    r = await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "greeter"})
    assert r.status == 200, await r.text()
    r = await client.post("/v1/chat/completions", headers=auth(ROOT), json={**CHAT, "model": "thinker"})
    assert r.status == 200


async def test_only_an_admin_loads_unloads_pulls_deletes_reloads_and_scrapes(aiohttp_client, write_config, files):
    client = await aiohttp_client(create_app(config(write_config, files, KEYS)))
    for method, path, body in (("POST", "/models/load", {"model": "plain"}), ("POST", "/models/unload", {"model": "plain"}),
                               ("POST", "/models/pull", {"model": "hf.co/a/b"}), ("POST", "/api/pull", {"model": "x"}),
                               ("DELETE", "/api/delete", {"model": "plain"}), ("POST", "/models/delete", {"model": "x"}),
                               ("POST", "/models/pull/cancel", {"model": "x"}), ("POST", "/config/reload", {}),
                               ("GET", "/metrics", None)):
        r = await client.request(method, path, headers=auth(BOB), json=body)
        assert r.status == 403, (path, await r.text())
        told = await r.json()
        assert "bob" in (told["error"] if path.startswith("/api/") else told["error"]["message"])
    r = await client.post("/api/generate", headers=auth(BOB), json={"model": "plain", "keep_alive": 0})
    assert r.status == 403 and "unloading" in (await r.json())["error"]
    assert (await client.post("/models/load", headers=auth(ROOT), json={"model": "plain"})).status == 200
    assert (await client.post("/config/reload", headers=auth(ROOT), json={})).status == 200
    assert (await client.get("/metrics", headers=auth(ROOT))).status == 200
    # a user key's /health is the open one; an admin's has the details
    assert "workers" not in await (await client.get("/health", headers=auth(BOB))).json()
    assert "workers" in await (await client.get("/health", headers=auth(ROOT))).json()


LIMITED = (f"    root: {ROOT}\n"
           f"    rpm2: {{key: rpm-key, rpm: 2}}\n"
           f"    par2: {{key: par-key, max_parallel: 2}}\n"
           f"    budget: {{key: budget-key, budget: 40, budget_period: day}}\n"
           f"    tpm: {{key: tpm-key, tpm: 5}}\n"
           f"    old: {{key: old-key, expires: 2001-01-01}}\n")


@pytest.mark.parametrize("path, body, shape", [
    ("/v1/chat/completions", CHAT, "openai"),
    ("/v1/messages", CHAT, "anthropic"),
    ("/api/chat", {**CHAT, "stream": False}, "ollama"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 3}, "openai"),
])
async def test_each_limit_is_a_429_in_the_wires_shape_naming_it(aiohttp_client, write_config, files, path, body, shape):
    client = await aiohttp_client(create_app(config(write_config, files, LIMITED)))
    body = {**body, "model": "plain"}

    async def refused(key: str, limit: str) -> None:
        r = await client.post(path, headers=auth(key), json=body)
        assert r.status == 429, await r.text()
        assert int(r.headers["Retry-After"]) >= 1 and r.headers["X-Gateway-Limit"] == limit
        told = await r.json()
        if shape == "openai":
            message = told["error"]["message"]
            assert told["error"]["code"] == ("budget_exceeded" if limit == "budget" else "rate_limit_exceeded")
        elif shape == "anthropic":
            assert told["error"]["type"] == "rate_limit_error"
            message = told["error"]["message"]
        else:
            message = told["error"]
        assert limit in message

    for _ in range(2):
        assert (await client.post(path, headers=auth("rpm-key"), json=body)).status == 200
    await refused("rpm-key", "rpm")
    assert (await client.post(path, headers=auth("tpm-key"), json=body)).status == 200  # more than 5 tokens
    await refused("tpm-key", "tpm")
    while (r := await client.post(path, headers=auth("budget-key"), json=body)).status == 200:
        pass
    assert r.status == 429
    await refused("budget-key", "budget")
    r = await client.post(path, headers=auth("old-key"), json=body)
    assert r.status == 401 and "expired" in await r.text()


async def test_concurrent_requests_of_one_key_never_pass_its_limits(aiohttp_client, write_config, files):
    client = await aiohttp_client(create_app(config(write_config, files, LIMITED)))
    long = {"model": "loop", "messages": [{"role": "user", "content": "go"}], "max_tokens": 40}

    async def one(key: str) -> int:
        r = await client.post("/v1/chat/completions", headers=auth(key), json=long)
        await r.read()
        return r.status

    statuses = await asyncio.gather(*(one("par-key") for _ in range(8)))
    assert sorted(statuses) == [200] * 2 + [429] * 6
    statuses = await asyncio.gather(*(one("rpm-key") for _ in range(8)))
    assert sorted(statuses) == [200] * 2 + [429] * 6
    gate = client.app[GATE]
    assert gate.state("par2")["in_flight"] == 0  # every ticket handed back
    while await one("budget-key") == 200:  # a budget once spent: a race of requests is all refused
        pass
    assert set(await asyncio.gather(*(one("budget-key") for _ in range(8)))) == {429}


async def test_one_budget_spent_across_every_wire_counts_each_request_once(aiohttp_client, write_config, files):
    keys = f"    root: {ROOT}\n    alice: {{key: {ALICE}, budget: 100000, budget_period: week}}\n"
    client = await aiohttp_client(create_app(config(write_config, files, keys)))
    spent = 0
    chat = await (await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "plain"})).json()
    spent += chat["usage"]["total_tokens"]
    resp = await (await client.post("/v1/responses", headers=auth(ALICE),
                                    json={"model": "plain", "input": "hi", "max_output_tokens": 3})).json()
    spent += resp["usage"]["total_tokens"]
    msg = await (await client.post("/v1/messages", headers=auth(ALICE), json={**CHAT, "model": "plain"})).json()
    # Anthropic's input_tokens leaves out what the cache read
    spent += msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] + msg["usage"]["output_tokens"]
    oll = await (await client.post("/api/chat", headers=auth(ALICE), json={**CHAT, "model": "plain",
                                                                           "stream": False})).json()
    spent += oll["prompt_eval_count"] + oll["eval_count"]
    comp = await (await client.post("/v1/completions", headers=auth(ALICE),
                                    json={"model": "plain", "prompt": "x", "max_tokens": 2})).json()
    spent += comp["usage"]["total_tokens"]
    emb = await (await client.post("/v1/embeddings", headers=auth(ALICE), json={"model": "emb", "input": "abc"})).json()
    spent += emb["usage"]["total_tokens"]
    rr = await client.post("/v1/rerank", headers=auth(ALICE), json={"model": "rr", "query": "q", "documents": ["a."]})
    rr_json = await rr.json()
    spent += rr_json["usage"]["total_tokens"]
    fim = await client.post("/v1/fim/completions", headers=auth(ALICE),
                            json={"model": "coder", "prompt": "a", "suffix": "b", "max_tokens": 2})
    spent += (await fim.json())["usage"]["total_tokens"]
    streamed = await client.post("/v1/chat/completions", headers=auth(ALICE),
                                 json={**CHAT, "model": "plain", "stream": True, "stream_options": {"include_usage": True}})
    text = await streamed.text()
    last = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")][-1]
    spent += last["usage"]["total_tokens"]
    usage = await (await client.get("/usage?group=hour", headers=auth(ALICE))).json()
    rows = usage["data"]
    assert {r["key"] for r in rows} == {"alice"}
    assert sum(r["total_tokens"] for r in rows) == spent
    assert {r["wire"] for r in rows} == {"chat", "responses", "messages", "ollama", "completions", "embeddings",
                                         "rerank", "fim"}
    assert sum(r["requests"] for r in rows) == 9
    assert usage["limits"]["alice"]["spent"] == spent and usage["recording"] is True
    # a user sees its own only; an admin sees all, and may filter
    assert (await client.get("/usage?key=root", headers=auth(ALICE))).status == 403
    everyone = await (await client.get("/usage", headers=auth(ROOT))).json()
    assert {r["key"] for r in everyone["data"]} == {"alice"}


async def test_usage_and_a_spent_budget_survive_a_restart(aiohttp_client, write_config, files, tmp_path):
    keys = f"    root: {ROOT}\n    alice: {{key: {ALICE}, budget: 20, budget_period: month}}\n"
    extra = f"  usage_db: {tmp_path}/usage.db\n"
    first = await aiohttp_client(create_app(config(write_config, files, keys, extra)))
    while (r := await first.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "plain"})).status \
            == 200:
        pass
    assert r.status == 429
    before = (await (await first.get("/usage", headers=auth(ROOT))).json())["data"]
    await first.close()
    second = await aiohttp_client(create_app(config(write_config, files, keys, extra, "again.yaml")))
    assert (await (await second.get("/usage", headers=auth(ROOT))).json())["data"] == before
    r = await second.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "plain"})
    assert r.status == 429 and r.headers["X-Gateway-Limit"] == "budget"


@pytest.mark.parametrize("damage", ["garbage", "folder", "read-only"])
async def test_a_damaged_usage_database_still_serves_and_enforces_limits(aiohttp_client, write_config, files,
                                                                         tmp_path, caplog, monkeypatch, damage):
    db = tmp_path / "usage.db"
    if damage == "garbage":
        db.write_bytes(b"this is not a database " * 100)
    elif damage == "folder":
        (tmp_path / "file").write_text("x")
        db = tmp_path / "file" / "usage.db"  # a folder that cannot be made
    else:  # sqlite opens it read-only (a chmod would not stop root, who may run this)
        sqlite3.connect(db).close()
        monkeypatch.setattr(usage_store, "_connect", lambda p: sqlite3.connect(
            p.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None))
    keys = f"    root: {ROOT}\n    rpm2: {{key: rpm-key, rpm: 2}}\n"
    client = await aiohttp_client(create_app(config(write_config, files, keys, f"  usage_db: {db}\n")))
    assert "usage" not in await (await client.get("/health")).json()  # nothing more without a key
    health = await (await client.get("/health", headers=auth("rpm-key"))).json()
    assert health["usage"]["recording"] is False and str(db) in health["usage"]["reason"]
    assert any(str(db) in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    for _ in range(2):
        assert (await client.post("/v1/chat/completions", headers=auth("rpm-key"),
                                  json={**CHAT, "model": "plain"})).status == 200
    assert (await client.post("/v1/chat/completions", headers=auth("rpm-key"),
                              json={**CHAT, "model": "plain"})).status == 429
    usage = await (await client.get("/usage", headers=auth(ROOT))).json()
    assert usage["recording"] is False and sum(r["requests"] for r in usage["data"]) == 2


async def test_a_reload_narrows_a_key_on_its_next_request_and_revokes_one(aiohttp_client, write_config, files):
    keys = f"    root: {ROOT}\n    alice: {{key: {ALICE}, models: [plain, thinker]}}\n    bob: {{key: {BOB}, role: user}}\n"
    app = create_app(config(write_config, files, keys))
    client = await aiohttp_client(app)
    assert (await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "thinker"})).status \
        == 200
    config(write_config, files, f"    root: {ROOT}\n    alice: {{key: {ALICE}, models: [plain]}}\n")  # same path
    assert await reload_configuration(app)
    assert (await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "thinker"})).status \
        == 404
    assert (await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "plain"})).status \
        == 200
    assert (await client.get("/v1/models", headers=auth(BOB))).status == 401


async def test_requests_and_tokens_per_named_key_in_prometheus(aiohttp_client, write_config, files):
    keys = f"    root: {ROOT}\n    alice: {{key: {ALICE}, rpm: 1}}\n"
    client = await aiohttp_client(create_app(config(write_config, files, keys)))
    for _ in range(2):
        await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "plain"})
    text = await (await client.get("/metrics", headers=auth(ROOT))).text()
    assert 'gguf_gateway_key_requests_total{key="alice",wire="chat"} 1.0' in text
    assert 'gguf_gateway_key_tokens_total{key="alice",kind="completion"}' in text
    assert 'gguf_gateway_key_limited_total{key="alice",limit="rpm"} 1.0' in text
    assert ALICE not in text



async def test_upstream_and_replica_answers_are_limited_and_counted_as_local_ones(aiohttp_client, aiohttp_server,
                                                                                  write_config, files):
    inner = await aiohttp_server(create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\nmodels:\n  plain: {files}/plain.gguf\n", "inner.yaml"))))
    up = str(inner.make_url("/v1"))
    outer = load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n"
        f"    alice: {{key: {ALICE}, rpm: 2}}\n"
        f"models:\n  far: {{upstream: '{up}', model: plain}}\n  pair:\n    replicas:\n"
        f"      - {{upstream: '{up}', model: plain}}\n", "outer.yaml"))
    client = await aiohttp_client(create_app(outer))
    told = {}
    for model in ("far", "pair"):
        r = await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": model})
        assert r.status == 200, await r.text()
        told[model] = (await r.json())["usage"]["total_tokens"]
    assert all(told.values())
    r = await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "far"})
    assert r.status == 429 and r.headers["X-Gateway-Limit"] == "rpm"
    rows = (await (await client.get("/usage", headers=auth(ROOT))).json())["data"]
    assert {r["model"]: r["total_tokens"] for r in rows if r["key"] == "alice"} == told


async def test_a_reload_never_drops_every_key_of_a_gateway_beyond_loopback(aiohttp_client, write_config, files, caplog):
    keys = f"    root: {ROOT}\n"
    app = create_app(config(write_config, files, keys, "  host: 0.0.0.0\n"))
    client = await aiohttp_client(app)
    config(write_config, files, "", "  host: 0.0.0.0\n")  # the same file, its keys gone
    assert await reload_configuration(app)
    assert (await client.get("/v1/models")).status == 401
    assert (await client.get("/v1/models", headers=auth(ROOT))).status == 200
    assert any("keys not reloaded" in r.getMessage() for r in caplog.records)


async def test_the_pages_live_stream_shows_a_scoped_key_its_own_models_only(aiohttp_client, write_config, files):
    from test_dashboard import read_snapshot

    client = await aiohttp_client(create_app(config(write_config, files, KEYS)))
    for model in ("plain", "thinker"):
        await client.post("/v1/chat/completions", headers=auth(ROOT), json={**CHAT, "model": model})
    await client.post("/v1/chat/completions", headers=auth(ALICE), json={**CHAT, "model": "plain"})
    async with client.get("/dashboard/live", headers=auth(ALICE)) as live:
        snap = await read_snapshot(live)
    assert [m["id"] for m in snap["models"]] == ["plain", "emb", "rr"]
    assert {m for p in snap["series"]["points"] for m in p["models"]} == {"plain"}
    assert [e["principal"] for e in snap["recent"]] == ["alice"] and snap["pulls"] == []
    async with client.get("/dashboard/live?all=1", headers=auth(ALICE)) as live:  # not an admin: its own still
        assert [e["principal"] for e in (await read_snapshot(live))["recent"]] == ["alice"]
    async with client.get("/dashboard/live?all=1", headers=auth(ROOT)) as live:
        assert sorted(e["principal"] for e in (await read_snapshot(live))["recent"]) == ["alice", "root", "root"]


def test_per_key_series_are_bounded_and_bare_keys_are_other():
    from gateway.server.metrics import MAX_KEYS, Metrics

    m = Metrics()
    labels = [m.key_label(f"k{i}", True) for i in range(MAX_KEYS + 5)]
    assert labels[:MAX_KEYS] == [f"k{i}" for i in range(MAX_KEYS)] and set(labels[MAX_KEYS:]) == {"other"}
    assert m.key_label("k0", True) == "k0" and m.key_label("key3", False) == "other"


@pytest.mark.parametrize("query", [
    "since=nan", "until=-inf", "since=1e400", "since=0001-01-01", "until=9999-12-31T23:59:59-14:00",
    "since=%ED%A0%80", "since=%F0%9F%99%82", "group=week", "group=%00", "key=" + "k" * 5000,
    "&".join(["model=m"] * 65), "since=2026-13-01", "since=" + "9" * 5000, "wire=%FF%FE",
])
async def test_hostile_usage_queries_are_refused_or_answered_never_a_500(aiohttp_client, write_config, files, query):
    client = await aiohttp_client(create_app(config(write_config, files, f"    root: {ROOT}\n")))
    r = await client.get(f"/usage?{query}", headers=auth(ROOT))
    assert r.status in (200, 400), (query, r.status, await r.text())
    if r.status == 400:
        assert (await r.json())["error"]["param"] in ("since", "until", "group", "model")


async def test_a_reload_of_a_broken_configuration_is_a_409_and_changes_nothing(aiohttp_client, write_config, files):
    client = await aiohttp_client(create_app(config(write_config, files, KEYS)))
    write_config("server:\n  api_keys: {root: [not, a, key]}\n")  # the same file, broken
    r = await client.post("/config/reload", headers=auth(ROOT))
    assert r.status == 409 and (await r.json())["error"]["code"] == "config_invalid"
    assert (await client.get("/v1/models", headers=auth(ALICE))).status == 200  # the keys in force stay
