"""A key's scope holds for the model a name resolves to, not the name asked, over every route that
takes a model name and every way a name resolves (exact, a tag fallback, an alias, a glob alias,
an adapter's name, an upstream, replicas, an upstream's listed models), and a user key's Ollama
``keep_alive`` never unloads a model sooner than the configuration says.

The scope test runs the same requests, with the same keys, against two gateways: one that holds
models outside the key's globs and one that does not have them at all. Every answer must be the
same, a 404's whole body byte for byte: a model outside the scope is not there for the key, so
it can neither be used nor told apart from a name nothing has, nor take a name from a model
inside the scope (a tag fallback, a glob alias, an adapter's name that would reach it)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import pytest

from gateway.api.appkeys import REGISTRY
from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

ROOT, CODER, BOSS = "root-key", "coder-key", "boss-key"  # admin; user scoped to *-coder; admin scoped so
HI = [{"role": "user", "content": "hi"}]
KEEP = 3600  # server.keep_alive of these tests, seconds

KEYS = (f"  api_keys:\n    root: {ROOT}\n"
        f"    coder: {{key: {CODER}, models: ['*-coder']}}\n"
        f"    boss: {{key: {BOSS}, role: admin, models: ['*-coder']}}\n")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("scope")
    mine = tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"]).path
    secret = tm.plain(d / "secret.gguf", ["Top", " secret", "."]).path
    tm.plain(d / "emb.gguf", ["x"])
    tm.reranker(d / "rr.gguf", {".": 0.7})
    return {"dir": d, "mine": mine, "secret": secret, "mine_lora": tm.lora_adapter(mine, d / "mine-zzz.gguf"),
            "secret_lora": tm.lora_adapter(secret, d / "secret-zzz.gguf")}


def _in_scope(files) -> str:
    """The models a ``*-coder`` key may use: the same in both gateways. ``my-coder`` has a glob
    alias and an adapter whose names a model outside the scope has too."""
    d = files["dir"]
    return (f"  my-coder:\n    path: {files['mine']}\n    aliases: [helper-coder, 'gpt-4*']\n"
            f"    loras: {{zzz: {files['mine_lora']}}}\n"
            f"  emb-coder: {{path: {d}/emb.gguf, embeddings: true}}\n"
            f"  rr-coder: {d}/rr.gguf\n")


def _outside(files, up: str) -> str:
    """Models outside the scope, each reached another way; listed first, so that where a name
    could mean one of them or a model in the scope, they would win unless passed over."""
    return (f"  secret:\n    path: {files['secret']}\n    aliases: [sly, 'gpt-*', 'my-coder:secret']\n"
            f"    loras: {{zzz: {files['secret_lora']}}}\n"
            f"  far-secret: {{upstream: '{up}', model: plain}}\n"
            f"  pair-secret:\n    replicas:\n      - {{upstream: '{up}', model: plain}}\n"
            f"  hidden: {{upstream: '{up}', upstream_discover: true, prefix: 'hidden/'}}\n")


def _config(write_config, text: str, name: str):
    return load_config(write_config(f"server:\n  discover_default_stores: false\n  keep_alive: {KEEP}\n{KEYS}"
                                    f"models:\n{text}", name))


async def _worlds(aiohttp_client, aiohttp_server, write_config, files):
    inner = await aiohttp_server(create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\nmodels:\n  plain: {files['mine']}\n", "inner.yaml"))))
    up = str(inner.make_url("/v1"))
    holding = await aiohttp_client(create_app(_config(write_config, _outside(files, up) + _in_scope(files),
                                                      "holding.yaml")))
    bare = await aiohttp_client(create_app(_config(write_config, _in_scope(files), "bare.yaml")))
    # the upstream's listed models, once the gateway's probe read them (an admin sees them); the
    # deadline only bounds a failure
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = await (await holding.get("/v1/models", headers=auth(ROOT))).json()
        if "hidden/plain" in [m["id"] for m in listed["data"]]:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the upstream's models were never listed")
    return holding, bare


# every way a name reaches a model outside the scope: the bare gateway has none of them
OUTSIDE = ["secret", "SECRET", "secret:x-coder", "secret:latest", "sly", "sly:x-coder", "gpt-x-coder",
           "secret:zzz", "secret:nope-coder", "far-secret:x-coder", "pair-secret:x-coder", "hidden/plain",
           "hidden/plain:x-coder"]
# names a model outside the scope would take from one inside it: the bare gateway answers them
SHADOWED = ["my-coder:secret", "gpt-4o", "zzz"]

# (key, method, path, query, body): every route that takes a model name; {} the name's place
ROUTES = [
    (CODER, "POST", "/v1/chat/completions", None, {"messages": HI, "max_tokens": 3}),
    (CODER, "POST", "/v1/completions", None, {"prompt": "hi", "max_tokens": 3}),
    (CODER, "POST", "/v1/embeddings", None, {"input": "hi"}),
    (CODER, "POST", "/v1/responses", None, {"input": "hi", "max_output_tokens": 3}),
    (CODER, "POST", "/v1/messages", None, {"messages": HI, "max_tokens": 3}),
    (CODER, "POST", "/v1/messages/count_tokens", None, {"messages": HI}),
    (CODER, "POST", "/api/chat", None, {"messages": HI, "stream": False, "options": {"num_predict": 3}}),
    (CODER, "POST", "/api/generate", None, {"prompt": "hi", "stream": False, "options": {"num_predict": 3}}),
    (CODER, "POST", "/api/generate", None, {}),  # an empty prompt: load only
    (CODER, "POST", "/api/show", None, {}),
    (CODER, "POST", "/api/embed", None, {"input": "hi"}),
    (CODER, "POST", "/api/embeddings", None, {"prompt": "hi"}),
    (CODER, "GET", "/props", "model", None),
    (CODER, "POST", "/tokenize", None, {"content": "hi"}),
    (CODER, "POST", "/detokenize", None, {"tokens": [1]}),
    (CODER, "POST", "/apply-template", None, {"messages": HI}),
    (CODER, "POST", "/rerank", None, {"query": "q", "documents": ["a"]}),
    (CODER, "POST", "/infill", None, {"input_prefix": "a", "input_suffix": "b", "n_predict": 2}),
    (CODER, "POST", "/v1/fim/completions", None, {"prompt": "a", "suffix": "b", "max_tokens": 2}),
    (BOSS, "GET", "/lora-adapters", "model", None),
    (BOSS, "POST", "/lora-adapters", "model", []),
    (BOSS, "POST", "/v1/load_lora_adapter", None, {"lora_name": "{}:extra"}),
    (BOSS, "POST", "/v1/unload_lora_adapter", None, {"lora_name": "{}:zzz"}),
    (BOSS, "POST", "/models/delete", None, {}),
    (BOSS, "POST", "/models/load", None, {}),
    (BOSS, "POST", "/models/unload", None, {}),
]


async def _ask(client, route, name: str, files) -> tuple[int, bytes]:
    key, method, path, query, body = route
    if isinstance(body, dict):
        if "lora_name" in body:
            body = {"lora_name": body["lora_name"].format(name), "lora_path": str(files["mine_lora"])}
        else:
            body = {**body, "model": name}
    r = await client.request(method, path, headers=auth(key), params={query: name} if query else None,
                             json=body)
    return r.status, await r.read()


async def test_a_name_outside_the_scope_answers_as_a_name_nothing_has_on_every_route(
        aiohttp_client, aiohttp_server, write_config, files):
    holding, bare = await _worlds(aiohttp_client, aiohttp_server, write_config, files)
    differ = []  # every (name, route) whose answers differ, told together
    for name in OUTSIDE + SHADOWED:
        for route in ROUTES:
            held, nothing = await _ask(holding, route, name, files), await _ask(bare, route, name, files)
            if name in OUTSIDE:
                assert nothing[0] in (400, 404, 409), (name, route, nothing)  # the bare gateway has no such model
            # an answer's ids and times differ; a refusal's every byte is the same
            if held[0] != nothing[0] or (held[0] != 200 and held[1] != nothing[1]):
                differ.append((name, route[1], route[2], held, nothing))
    assert not differ, "\n".join(map(repr, differ))
    # a glob alias and an adapter's name reach the model in the scope, as on the bare gateway
    # (``my-coder:secret`` is a mistyped adapter of ``my-coder`` there, the same 404 on both)
    for name, text in (("gpt-4o", "Hello, world!"), ("zzz", "")):
        r = await holding.post("/v1/chat/completions", headers=auth(CODER),
                               json={"model": name, "messages": HI, "max_tokens": 8, "temperature": 0})
        assert r.status == 200, (name, await r.text())
        assert (await r.json())["choices"][0]["message"]["content"] == text, name
    # nothing outside the scope was ever loaded for the key
    assert set(holding.app[REGISTRY].loaded()) <= {"my-coder", "emb-coder", "rr-coder"}


async def test_a_name_in_the_scope_reaches_its_model_every_way(aiohttp_client, aiohttp_server, write_config, files):
    holding, _ = await _worlds(aiohttp_client, aiohttp_server, write_config, files)
    for name, text in (("my-coder", "Hello, world!"), ("helper-coder", "Hello, world!"),
                       ("MY-CODER:latest", "Hello, world!"), ("gpt-4-coder", "Hello, world!"),
                       ("my-coder:zzz", "")):  # the adapter makes the end of turn win at once
        r = await holding.post("/v1/chat/completions", headers=auth(CODER),
                               json={"model": name, "messages": HI, "max_tokens": 8, "temperature": 0})
        assert r.status == 200, (name, await r.text())
        assert (await r.json())["choices"][0]["message"]["content"] == text, name
    r = await holding.post("/v1/embeddings", headers=auth(CODER), json={"model": "emb-coder", "input": "hi"})
    assert r.status == 200, await r.text()
    # a base in the scope may name its own adapters in a 404
    r = await holding.post("/v1/chat/completions", headers=auth(CODER),
                           json={"model": "my-coder:nope", "messages": HI, "max_tokens": 3})
    assert r.status == 404 and "zzz" in (await r.json())["error"]["message"]
    listed = [m["id"] for m in (await (await holding.get("/v1/models", headers=auth(CODER))).json())["data"]]
    assert listed == ["my-coder", "my-coder:zzz", "emb-coder", "rr-coder"]  # an adapter listed as a model
    # an admin without a scope reaches every model by the same names
    for name, text in (("secret:latest", "Top secret."), ("sly", "Top secret."), ("gpt-x-coder", "Top secret."),
                       ("secret:zzz", ""), ("far-secret:x-coder", "Hello, world!"),
                       ("pair-secret:x-coder", "Hello, world!"), ("hidden/plain:x-coder", "Hello, world!")):
        r = await holding.post("/v1/chat/completions", headers=auth(ROOT),
                               json={"model": name, "messages": HI, "max_tokens": 8, "temperature": 0})
        assert r.status == 200, (name, await r.text())
        assert (await r.json())["choices"][0]["message"]["content"] == text, name


# --- keep_alive ----------------------------------------------------------------------------------

KEEP_KEYS = f"  api_keys:\n    root: {ROOT}\n    user: {{key: {CODER}, role: user}}\n"


@pytest.fixture
async def keeper(aiohttp_client, write_config, files):
    d = files["dir"]
    cfg = load_config(write_config(
        f"server:\n  discover_default_stores: false\n  keep_alive: {KEEP}\n{KEEP_KEYS}"
        f"models:\n  plain: {files['mine']}\n  emb: {{path: {d}/emb.gguf, embeddings: true}}\n"))
    return await aiohttp_client(create_app(cfg))


async def _left(client, model: str) -> float | None:
    """Seconds /api/ps says ``model`` stays loaded for; None where it is not loaded."""
    for entry in (await (await client.get("/api/ps", headers=auth(ROOT))).json())["models"]:
        if entry["name"] == f"{model}:latest":
            until = datetime.fromisoformat(entry["expires_at"].replace("Z", "+00:00"))
            return (until - datetime.now(timezone.utc)).total_seconds()
    return None


async def _gone(client, model: str) -> bool:
    """Whether ``model`` is unloaded, waiting for it (the unload follows the answer; the deadline
    only bounds a failure)."""
    deadline = time.monotonic() + 60
    while model in client.app[REGISTRY].loaded():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


CHAT = {"model": "plain", "messages": HI, "stream": False, "options": {"num_predict": 3}}


@pytest.mark.parametrize("path, body", [
    ("/api/chat", {**CHAT, "keep_alive": 0}),
    ("/api/chat", {**CHAT, "keep_alive": "0s"}),
    ("/api/generate", {"model": "plain", "prompt": "", "keep_alive": 0.001}),
    ("/api/generate", {"model": "plain", "prompt": "hi", "stream": False, "keep_alive": 0}),
    ("/api/embed", {"model": "emb", "input": "hi", "keep_alive": 0}),
])
async def test_a_user_keys_keep_alive_never_unloads_a_model_sooner_than_configured(keeper, path, body):
    model = body["model"]
    r = await keeper.post(path, headers=auth(CODER), json=body)
    assert r.status == 200, await r.text()
    # still loaded, for as long as the configuration says from its last use
    left = await _left(keeper, model)
    assert left is not None and left > KEEP - 60, left
    assert model in keeper.app[REGISTRY].loaded()
    # an admin's same request unloads it
    r = await keeper.post(path, headers=auth(ROOT), json=body)
    assert r.status == 200, await r.text()
    assert await _gone(keeper, model)


async def test_a_user_keys_longer_keep_alive_still_lengthens_the_stay(keeper):
    r = await keeper.post("/api/chat", headers=auth(CODER), json={**CHAT, "keep_alive": "10h"})
    assert r.status == 200, await r.text()
    left = await _left(keeper, "plain")
    assert left is not None and left > 10 * 3600 - 60, left
    r = await keeper.post("/api/generate", headers=auth(CODER), json={"model": "plain", "keep_alive": -1})
    assert r.status == 200, await r.text()
    left = await _left(keeper, "plain")
    assert left is not None and left > 365 * 86400, left
    # a user key's empty prompt with keep_alive 0 is still refused, the model still loaded
    r = await keeper.post("/api/generate", headers=auth(CODER), json={"model": "plain", "keep_alive": 0})
    assert r.status == 403
    assert "plain" in keeper.app[REGISTRY].loaded()
