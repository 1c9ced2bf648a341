"""The pull routes in process: a caller's mistakes in its own wire's shape, the keys, and a pull
watched from `/models`, the page's snapshot and two callers at once, from a loopback hub."""

from __future__ import annotations

import asyncio
import json

import pytest
from hubserver import Hub

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config


@pytest.fixture
def hub(tmp_path, monkeypatch):
    tm.plain(tmp_path / "tiny.gguf", ["Hi"])
    with Hub() as h:
        h.add_hf_repo("acme/Tiny-GGUF", {"tiny-Q4_K_M.gguf": tmp_path / "tiny.gguf"})
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        yield h


@pytest.fixture
def app(write_config):
    return create_app(load_config(write_config("server:\n  pull_keep_free_bytes: 0\n")))


@pytest.mark.parametrize(("body", "param"), [
    ({}, "model"), ({"model": 7}, "model"), ({"model": "../../etc/passwd"}, "model"),
    ({"model": "https://hf.co/a/b"}, "model"), ({"model": "a/b", "stream": "yes"}, "stream"),
    ({"model": "a/b", "insecure": 1}, "insecure"),
])
async def test_a_bad_request_is_a_400_naming_its_field(aiohttp_client, app, body, param):
    client = await aiohttp_client(app)
    r = await client.post("/models/pull", json=body)
    assert r.status == 400 and (await r.json())["error"]["param"] == param
    r = await client.post("/api/pull", json=body)
    assert r.status == 400 and isinstance((await r.json())["error"], str)  # Ollama's shape


async def test_cancelling_or_deleting_what_is_not_there_is_a_404(aiohttp_client, app):
    client = await aiohttp_client(app)
    r = await client.post("/models/pull/cancel", json={"model": "acme/Tiny-GGUF"})
    assert r.status == 404 and (await r.json())["error"]["code"] == "pull_not_found"
    r = await client.post("/models/delete", json={"model": "nothing-here"})
    assert r.status == 404
    r = await client.delete("/api/delete", json={"model": "nothing-here"})
    assert r.status == 404 and isinstance((await r.json())["error"], str)


async def test_with_keys_a_pull_needs_one(aiohttp_client, write_config):
    app = create_app(load_config(write_config("server:\n  api_keys: [sekrit]\n")))
    client = await aiohttp_client(app)
    for method, path in (("POST", "/models/pull"), ("POST", "/api/pull"), ("POST", "/models/delete"),
                         ("POST", "/models/pull/cancel"), ("DELETE", "/api/delete")):
        r = await client.request(method, path, json={"model": "acme/Tiny-GGUF"})
        assert r.status == 401, path
    r = await client.post("/models/pull", json={"model": "../x"}, headers={"Authorization": "Bearer sekrit"})
    assert r.status == 400


async def test_a_pull_shows_in_models_and_the_snapshot_and_two_callers_share_it(aiohttp_client, app, hub):
    hub.faults.rate = 20_000  # the file is 150 kB: several seconds
    client = await aiohttp_client(app)

    async def pull() -> list[dict]:
        r = await client.post("/models/pull", json={"model": "acme/Tiny-GGUF"})
        assert r.status == 200 and r.headers["Content-Type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in (await r.text()).splitlines()]

    first = asyncio.create_task(pull())
    for _ in range(100):
        body = await (await client.get("/models")).json()
        rows = [m for m in body["data"] if m["state"] == "downloading"]
        if rows and rows[0]["download"]["completed"]:
            break
        await asyncio.sleep(0.05)
    [row] = rows
    assert row["id"] == "hf.co/acme/Tiny-GGUF" and 0 < row["download"]["completed"] < row["download"]["total"]
    assert 0 < row["progress"] < 1 and row["download"]["files"][0]["name"].endswith("tiny-Q4_K_M.gguf")
    second = asyncio.create_task(pull())
    hub.faults.rate = None
    a, b = await first, await second
    assert a[-1] == b[-1] == {"status": "success", "model": "hf.co/acme/Tiny-GGUF"}
    assert len([r for r in hub.log if r.server == "cdn" and r.method == "GET"]) == 1
    body = await (await client.get("/models")).json()
    assert not [m for m in body["data"] if m["state"] == "downloading"]
    assert "hf.co/acme/tiny-gguf" in [a for m in body["data"] for a in m["aliases"]]
    assert [p["state"] for p in body["pulls"]] == ["done"]


async def test_a_whole_request_waits_for_an_on_demand_pull_no_longer_than_its_bound(aiohttp_client, write_config, hub):
    hub.faults.rate = 30_000  # the file is 150 kB: five seconds, longer than the two waits
    app = create_app(load_config(write_config(
        "server:\n  pull_keep_free_bytes: 0\n  pull_on_demand: [hf.co/]\n  pull_wait_seconds: 1\n")))
    client = await aiohttp_client(app)
    ask = {"model": "hf.co/acme/Tiny-GGUF", "messages": [{"role": "user", "content": "?"}]}
    r = await client.post("/v1/chat/completions", json=ask)
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "model_downloading" and r.headers["Retry-After"] == "30"
    assert "still downloading" in body["error"]["message"]
    r = await client.post("/v1/messages", json={**ask, "max_tokens": 8})  # the same pull, Anthropic's shape
    assert r.status == 503 and (await r.json())["type"] == "error"
    assert len([p for p in (await (await client.get("/models")).json())["pulls"]]) == 1
    hub.faults.rate = None
    for _ in range(300):  # the pull goes on without the callers who left: once done, the name answers
        if [p["state"] for p in (await (await client.get("/models")).json())["pulls"]] == ["done"]:
            break
        await asyncio.sleep(0.1)
    r = await client.post("/v1/chat/completions", json={**ask, "max_tokens": 4})
    assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == "Hi"


@pytest.mark.parametrize("raw", [
    b'{"model": "\\ud800"}',  # a lone surrogate
    b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b"}",  # nested far past the parser's bound
    b'{"model": 1' + b"0" * 5000 + b"}",  # a huge number
    b'{"model": 1e999}',
    b"[]", b"not json",
])
async def test_hostile_bodies_are_a_400_on_every_pull_route(aiohttp_client, app, raw):
    client = await aiohttp_client(app)
    for method, path in (("POST", "/models/pull"), ("POST", "/api/pull"), ("POST", "/models/pull/cancel"),
                         ("POST", "/models/delete"), ("DELETE", "/api/delete")):
        r = await client.request(method, path, data=raw, headers={"Content-Type": "application/json"})
        assert r.status == 400, (path, raw[:40], r.status, await r.text())
