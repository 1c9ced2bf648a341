"""Access, exposure, limits, overload and faults, each driving a real server with real workers."""

import asyncio
import json
import re

import pytest
from helpers import ServerProcess, free_port, run_cli
from openapi import validate
from workerevents import under_way, until

from gateway.app import REGISTRY, create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hardening")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    return d


def app_for(write_config, files, server: str = "", models: str = "", loop: str = ""):
    body = "server:\n" + (server or "  discover_default_stores: false\n")
    body += f"models:\n  plain: {files}/plain.gguf\n  loop:\n    path: {files}/loop.gguf\n    n_ctx: 16384\n{loop}" + models
    return create_app(load_config(write_config(body)))


# --- exposure --------------------------------------------------------------------------------

def test_a_public_address_without_keys_refuses_to_start(files, write_config):
    cfg = write_config(f"models:\n  plain: {files}/plain.gguf\n")
    r = run_cli("serve", "--config", str(cfg), "--host", "0.0.0.0", "--port", str(free_port()), timeout=30)
    assert r.returncode == 2
    assert "refusing to serve on 0.0.0.0 with no API keys" in r.stderr and "--allow-unauthenticated" in r.stderr


@pytest.mark.slow
def test_a_public_address_starts_with_keys_or_the_explicit_flag(files, write_config):
    open_cfg = write_config(f"models:\n  plain: {files}/plain.gguf\n")
    with ServerProcess("--config", str(open_cfg), "--host", "0.0.0.0", "--allow-unauthenticated") as s:
        assert s.get("/v1/models")[0] == 200
    keyed = write_config(f"server:\n  api_keys: [k]\nmodels:\n  plain: {files}/plain.gguf\n", name="keyed.yaml")
    with ServerProcess("--config", str(keyed), "--host", "0.0.0.0") as s:
        assert s.get("/v1/models")[0] == 401
        assert s.get("/v1/models", {"Authorization": "Bearer k"})[0] == 200


@pytest.mark.parametrize("host, status", [
    ("evil.example", 403), ("evil.example:8080", 403), ("192.168.1.10:8080", 403), ("localhost", 200),
    ("localhost:8080", 200), ("127.0.0.1:8080", 200), ("127.0.0.2", 200), ("[::1]:8080", 200),
    ("app.localhost:3000", 200),
])
async def test_dns_rebinding_is_refused_while_on_loopback(aiohttp_client, files, write_config, host, status):
    client = await aiohttp_client(app_for(write_config, files))
    r = await client.get("/v1/models", headers={"Host": host})
    assert r.status == status
    if status == 403:
        body = await r.json()
        validate(body, "ErrorResponse")
        assert body["error"]["code"] == "forbidden_host"
        r = await client.post("/v1/messages", json={}, headers={"Host": host})
        assert (await r.json())["error"]["type"] == "permission_error"


async def test_no_host_check_when_bound_to_all_interfaces(aiohttp_client, files, write_config):
    client = await aiohttp_client(app_for(write_config, files, "  host: 0.0.0.0\n  api_keys: [k]\n"))
    r = await client.get("/v1/models", headers={"Host": "gpu-box.lan:8080", "Authorization": "Bearer k"})
    assert r.status == 200


async def test_cors_is_off_unless_origins_are_listed(aiohttp_client, files, write_config):
    closed = await aiohttp_client(app_for(write_config, files))
    r = await closed.get("/v1/models", headers={"Origin": "http://localhost:3000"})
    assert "Access-Control-Allow-Origin" not in r.headers
    app = app_for(write_config, files, "  cors_origins: [http://localhost:3000]\n  api_keys: [k]\n")
    client = await aiohttp_client(app)
    pre = await client.options("/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status == 204 and pre.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert "authorization" in pre.headers["Access-Control-Allow-Headers"]
    r = await client.get("/v1/models", headers={"Origin": "http://localhost:3000", "Authorization": "Bearer k"})
    assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    bad = await client.options("/v1/models", headers={"Origin": "http://evil.example",
                                                      "Access-Control-Request-Method": "GET"})
    assert bad.status == 403 and "Access-Control-Allow-Origin" not in bad.headers


async def test_a_hostile_chat_template_fails_that_model_only(aiohttp_client, files, write_config):
    tmpl = json.dumps("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    client = await aiohttp_client(app_for(write_config, files, models=f"  evil:\n    path: {files}/plain.gguf\n"
                                                                      f"    chat_template: {tmpl}\n"))
    r = await client.post("/v1/chat/completions", json={"model": "evil", "messages": HI})
    body = await r.json()
    assert r.status == 500 and body["error"]["code"] == "chat_template_error"
    assert "'evil'" in body["error"]["message"] and "sandbox" in body["error"]["message"]
    r = await client.post("/v1/chat/completions", json={"model": "plain", "messages": HI})
    assert r.status == 200


# --- limits and overload -----------------------------------------------------------------------

async def test_a_body_over_the_limit_is_413_in_both_shapes(aiohttp_client, files, write_config):
    client = await aiohttp_client(app_for(write_config, files, "  max_body_bytes: 2048\n"))
    big = {"model": "plain", "messages": [{"role": "user", "content": "x" * 5000}]}
    r = await client.post("/v1/chat/completions", json=big)
    body = await r.json()
    assert r.status == 413 and body["error"]["code"] == "request_too_large" and "2048" in body["error"]["message"]
    r = await client.post("/v1/messages", json={**big, "max_tokens": 5})
    assert r.status == 413 and (await r.json())["error"]["type"] == "request_too_large"


async def test_too_many_messages_is_a_400_before_any_inference(aiohttp_client, files, write_config):
    client = await aiohttp_client(app_for(write_config, files, "  max_messages: 3\n"))
    r = await client.post("/v1/chat/completions", json={"model": "plain", "messages": HI * 4})
    body = await r.json()
    assert r.status == 400 and body["error"]["param"] == "messages" and "max_messages" in body["error"]["message"]
    assert client.app[REGISTRY].loaded() == {}  # refused before the model was even loaded
    r = await client.post("/v1/messages", json={"model": "plain", "max_tokens": 5, "messages": HI * 4})
    assert r.status == 400


async def test_a_full_queue_answers_429_with_retry_after(aiohttp_client, files, write_config):
    # two slots decoding, one request waiting (max_queue 1): the next one is refused
    client = await aiohttp_client(app_for(write_config, files, "  max_queue: 1\n", loop="    parallel: 2\n"),
                                  server_kwargs={"handler_cancellation": True})
    running = [await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True})
               for _ in range(2)]
    for r in running:
        await under_way(r)
    waiting = asyncio.create_task(client.post("/v1/chat/completions",
                                              json={"model": "loop", "messages": HI, "max_tokens": 2}))
    registry = client.app[REGISTRY]
    await until(lambda: registry.supervisor(registry.resolve("loop")).in_flight == 3, "the third request waiting")
    metrics = await (await client.get("/metrics")).text()
    assert re.search(r'gguf_gateway_requests_queued\{model="loop"\} 1\.0', metrics), metrics
    r = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI})
    body = await r.json()
    assert r.status == 429 and body["error"]["code"] == "queue_full" and r.headers["Retry-After"] == "2"
    validate(body, "ErrorResponse")
    r = await client.post("/v1/messages", json={"model": "loop", "max_tokens": 3, "messages": HI})
    assert r.status == 429 and (await r.json())["error"]["type"] == "rate_limit_error"
    assert (await client.post("/v1/chat/completions", json={"model": "plain", "messages": HI})).status == 200
    assert not waiting.done()
    running[0].close()  # one stream ends; the queued request takes its slot
    done = await waiting
    assert done.status == 200 and (await done.json())["choices"][0]["message"]["content"] == " tick tock"
    running[1].close()
    metrics = await (await client.get("/metrics")).text()
    assert re.search(r'gguf_gateway_rejected_requests_total\{reason="queue_full"\} 2\.0', metrics)


@pytest.mark.parametrize("stream", [False, True])
async def test_request_timeout_ends_a_runaway_generation_with_length(aiohttp_client, files, write_config, stream):
    client = await aiohttp_client(app_for(write_config, files, "  request_timeout: 0.3\n"))
    assert (await client.post("/models/load", json={"model": "loop"})).status == 200  # the clock is for decoding
    r = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": stream})
    assert r.status == 200
    if stream:
        text = await r.text()
        assert '"finish_reason":"length"' in text and text.rstrip().endswith("data: [DONE]")
    else:
        body = await r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert 0 < body["usage"]["completion_tokens"] < 16000  # stopped by the clock, not the context


# --- faults -----------------------------------------------------------------------------------

def broken_corpus(d, good):
    data = good.read_bytes()
    corpus = {
        "bad-magic": b"GGML" + data[4:],
        "truncated-header": data[:40],
        "truncated-tensors": data[: len(data) - 4096],
        "absurd-counts": data[:8] + (2**62).to_bytes(8, "little") + data[16:],
        "unknown-arch": data.replace(b"llama", b"zzzzz"),
        "empty": b"",
    }
    for name, blob in corpus.items():
        (d / f"{name}.gguf").write_bytes(blob)
    return corpus


async def test_broken_files_each_fail_alone_with_a_reason(aiohttp_client, files, tmp_path, write_config):
    corpus = broken_corpus(tmp_path, files / "plain.gguf")
    models = "".join(f"  {name}: {tmp_path}/{name}.gguf\n" for name in corpus)
    client = await aiohttp_client(app_for(write_config, files, models=models))
    reasons = {}
    for name in corpus:
        r = await client.post("/v1/chat/completions", json={"model": name, "messages": HI})
        body = await r.json()
        assert r.status == 503 and body["error"]["code"] == "model_load_failed", (name, body)
        assert int(r.headers["Retry-After"]) >= 1
        reasons[name] = body["error"]["message"]
        assert (await client.post("/v1/chat/completions", json={"model": "plain", "messages": HI})).status == 200
    assert "not a GGUF file" in reasons["bad-magic"] and "truncated GGUF header" in reasons["truncated-header"]
    assert "truncated tensor data" in reasons["truncated-tensors"] and "absurd counts" in reasons["absurd-counts"]
    assert "llama.cpp could not load" in reasons["unknown-arch"] or "exited during load" in reasons["unknown-arch"]


@pytest.mark.parametrize("method, origin, site, allowed, refused", [
    ("POST", None, None, (), False),  # a program, not a browser
    ("POST", "http://127.0.0.1:8080", "same-origin", (), False),  # the gateway's own page
    ("POST", "http://evil.example", "cross-site", (), True),
    ("DELETE", "http://127.0.0.1:3000", "same-site", (), True),  # another port is another origin
    ("POST", "null", None, (), True),  # a sandboxed frame, a file
    ("POST", "http://[bad", None, (), True),
    ("POST", None, "cross-site", (), True),
    ("POST", "http://localhost:3000", "same-site", ("http://localhost:3000",), False),
    ("POST", "http://anywhere.example", "cross-site", ("*",), False),
    ("GET", "http://evil.example", "cross-site", (), False),  # reading: the browser hides the answer
])
def test_cross_site_refuses_what_a_browser_sends_from_another_site(method, origin, site, allowed, refused):
    from gateway.app import cross_site

    assert (cross_site(method, origin, site, "127.0.0.1:8080", allowed) is not None) == refused
