"""Captured requests (``server/captures``, ``api/captures``): what a client sent and what it
received, kept byte for byte within the bounds, its secrets out, listed, opened and replayed,
against the real app on scripted llama.cpp models."""

from __future__ import annotations

import asyncio
import gzip
import json

import aiohttp
import pytest
from realmodel import CACHE

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.server import redaction

KEY = "sk-capture-test-key-0123456789"


S = tm.Special
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("capmodels")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two make four.", "It is 4.")
    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", CACHE / "templates").read_text()
    tm.write_scripted_model(d / "caller.gguf", [S("<tool_call>"), "\n", '{"name":', ' "get_weather",', ' "arguments":',
                                                ' {"city":', ' "Paris"}}', "\n", S("</tool_call>")],
                            chat_template=qwen)
    return d


def make(write_config, models, capture: str = "true", keys: bool = False, extra: str = ""):
    keys_line = f"  api_keys:\n    ops: {{key: {KEY}, role: admin}}\n    alice: {{key: user-key-1234, role: user}}\n" \
        if keys else ""
    return create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\n  capture: {capture}\n{keys_line}{extra}"
        f"models:\n  chat: {models}/plain.gguf\n  thinker: {models}/thinker.gguf\n  caller: {models}/caller.gguf\n")))


async def stream_bytes(resp) -> bytes:
    out = b""
    async for chunk in resp.content.iter_any():
        out += chunk
    return out


async def test_a_streamed_answer_is_kept_byte_for_byte_with_its_times(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models))
    body = {"model": "thinker", "stream": True, "messages": [{"role": "user", "content": "2+2?"}]}
    r = await client.post("/v1/chat/completions", json=body)
    received = await stream_bytes(r)
    listing = await (await client.get("/captures")).json()
    assert listing["enabled"] and len(listing["data"]) == 1
    row = listing["data"][0]
    assert row["model"] == "thinker" and row["status"] == 200 and row["stream"] and row["route"] == "/v1/chat/completions"
    assert row["completion_tokens"] > 0 and row["time_to_first_token_s"] is not None
    detail = await (await client.get(f"/captures/{row['id']}")).json()
    assert "".join(e["data"] for e in detail["response"]["events"]).encode() == received
    times = [e["t"] for e in detail["response"]["events"]]
    assert times == sorted(times) and times[0] > 0
    assert detail["request"]["body"] == body
    assert detail["answer"]["thinking"].strip() == "Two and two make four."
    assert detail["answer"]["content"].strip() == "It is 4."
    assert "curl" in detail and "-N" in detail["curl"]


async def test_a_whole_answer_and_the_key_are_kept_without_the_key(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models, keys=True))
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "chat", "messages": [{"role": "user", "content": f"my key is {KEY}"}]}
    r = await client.post("/v1/chat/completions", json=body, headers=headers)
    received = await r.read()
    assert r.status == 200
    row = (await (await client.get("/captures", headers=headers)).json())["data"][0]
    assert row["key"] == "ops"
    detail = await (await client.get(f"/captures/{row['id']}", headers=headers)).json()
    assert detail["response"]["body_text"].encode() == received
    everything = json.dumps(detail)
    assert KEY not in everything and detail["request"]["headers"]["Authorization"] == redaction.REDACTED
    assert detail["request"]["body"]["messages"][0]["content"] == f"my key is {redaction.REDACTED}"
    # a user key may not read them
    r = await client.get("/captures", headers={"Authorization": "Bearer user-key-1234"})
    assert r.status == 403


async def test_redact_content_keeps_the_shape_and_not_the_text(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models, capture="{redact_content: true}"))
    for stream in (False, True):
        r = await client.post("/v1/chat/completions", json={
            "model": "thinker", "stream": stream, "messages": [{"role": "user", "content": "secret question"}]})
        await r.read()
    rows = (await (await client.get("/captures")).json())["data"]
    assert len(rows) == 2 and all(r["redacted"] for r in rows)
    for row in rows:
        detail = await (await client.get(f"/captures/{row['id']}")).json()
        text = json.dumps(detail)
        for secret in ("secret question", "Two and two", "It is 4"):
            assert secret not in text
        assert detail["request"]["body"]["messages"][0] == {"role": "user", "content": "[15 chars]"}
        assert row["completion_tokens"] > 0
    r = await client.post(f"/captures/{rows[0]['id']}/replay", json={"model": "chat"})
    assert r.status == 409 and (await r.json())["error"]["code"] == "capture_redacted"


async def test_a_large_body_is_cut_and_said_so(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models, capture="{max_body_bytes: 64KiB}"))
    big = "x" * (32 * 2**20 - 1000)
    raw = json.dumps({"model": "chat", "max_tokens": 1, "messages": [{"role": "user", "content": big}]}).encode()
    r = await client.post("/v1/chat/completions", data=gzip.compress(raw),
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    await r.read()
    row = (await (await client.get("/captures")).json())["data"][0]
    assert row["truncated"] and row["request_bytes"] == len(raw)
    detail = await (await client.get(f"/captures/{row['id']}")).json()
    assert detail["request"]["truncated"] and detail["request"]["body"] is None
    assert len(detail["request"]["body_text"].encode()) == 64 * 1024
    assert detail["request"]["body_text"].startswith('{"model": "chat"')
    listing = await (await client.get("/captures")).json()
    assert listing["bytes"] < 200 * 1024
    r = await client.post(f"/captures/{row['id']}/replay", json={"model": "chat"})
    assert r.status == 409 and (await r.json())["error"]["code"] == "capture_cut"


async def test_the_store_keeps_within_its_bound_dropping_the_oldest(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models, capture="{max_bytes: 8KiB}"))
    for i in range(12):
        r = await client.post("/v1/chat/completions", json={
            "model": "chat", "messages": [{"role": "user", "content": f"question {i} " + "y" * 500}]})
        await r.read()
    listing = await (await client.get("/captures")).json()
    assert listing["bytes"] <= 8 * 1024 and 1 <= listing["count"] < 12
    newest = await (await client.get(f"/captures/{listing['data'][0]['id']}")).json()
    assert "question 11" in newest["request"]["body"]["messages"][0]["content"]


async def test_replay_on_another_model_is_captured_and_linked(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models))
    r = await client.post("/v1/messages", json={"model": "chat", "max_tokens": 32, "stream": True,
                                                 "messages": [{"role": "user", "content": "hi"}]},
                          headers={"anthropic-version": "2023-06-01"})
    await r.read()
    original = (await (await client.get("/captures")).json())["data"][0]
    r = await client.post(f"/captures/{original['id']}/replay", json={"model": "thinker"})
    assert r.status == 200, await r.text()
    again = await r.json()
    assert again["replay_of"] == original["id"] and again["model"] == "thinker" and again["stream"]
    assert again["request"]["body"]["model"] == "thinker"
    assert again["request"]["headers"]["anthropic-version"] == "2023-06-01"
    assert again["answer"]["content"].strip() == "It is 4."
    listing = await (await client.get("/captures", params={"model": "thinker"})).json()
    assert [row["id"] for row in listing["data"]] == [again["id"]]
    r = await client.post("/captures/nope/replay", json={"model": "chat"})
    assert r.status == 404


async def test_filters(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models))
    await (await client.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "a"}]})).read()
    await (await client.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "a"}]})).read()
    await (await client.post("/api/chat", json={"model": "chat", "stream": False, "messages": [{"role": "user", "content": "a"}]})).read()
    async def ids(**params):
        return [row["route"] + ":" + str(row["status"]) for row in (await (await client.get("/captures", params=params)).json())["data"]]
    assert await ids(status="4xx") == ["/v1/chat/completions:404"]
    assert await ids(route="/api/chat") == ["/api/chat:200"]
    assert len(await ids(model="chat")) == 2
    r = await client.get("/captures", params={"limit": "0"})
    assert r.status == 400 and (await r.json())["error"]["param"] == "limit"


async def test_off_by_default_and_nothing_kept(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models, capture="false"))
    await (await client.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "a"}]})).read()
    listing = await (await client.get("/captures")).json()
    assert listing == {**listing, "enabled": False, "data": [], "count": 0}


TOOL_REQUESTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}),
    ("/v1/messages", {"max_tokens": 64, "messages": [{"role": "user", "content": "Weather?"}],
                      "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]}),
    ("/v1/responses", {"input": "Weather?", "tools": [{"type": "function", "name": "get_weather",
                                                      "parameters": WEATHER["function"]["parameters"]}]}),
    ("/api/chat", {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER]}),
]


@pytest.mark.parametrize("route,body", TOOL_REQUESTS, ids=[r for r, _ in TOOL_REQUESTS])
async def test_a_tool_calling_stream_is_kept_as_the_client_received_it(aiohttp_client, write_config, models, route, body):
    client = await aiohttp_client(make(write_config, models))
    r = await client.post(route, json={"model": "caller", "stream": True, **body})
    assert r.status == 200
    received = await stream_bytes(r)
    row = (await (await client.get("/captures")).json())["data"][0]
    detail = await (await client.get(f"/captures/{row['id']}")).json()
    kept = "".join(e["data"] for e in detail["response"]["events"]).encode()
    assert kept == received and not detail["response"]["truncated"]
    assert detail["response"]["bytes"] == len(received)
    calls = detail["answer"]["calls"]
    assert [c["name"] for c in calls] == ["get_weather"] and json.loads(calls[0]["arguments"]) == {"city": "Paris"}


async def test_kept_captures_outlive_a_restart(aiohttp_client, write_config, models, tmp_path):
    extra = f"  state_dir: {tmp_path / 'state'}\n"
    client = await aiohttp_client(make(write_config, models, capture="{keep: true}", extra=extra))
    r = await client.post("/v1/chat/completions", json={"model": "chat", "stream": True,
                                                        "messages": [{"role": "user", "content": "kept?"}]})
    received = await stream_bytes(r)
    first = (await (await client.get("/captures")).json())["data"][0]
    await client.close()  # the app's cleanup writes what is pending
    kept = list((tmp_path / "state" / "captures").glob("*.json"))
    assert kept and all(f.stat().st_mode & 0o777 == 0o600 for f in kept)
    assert (tmp_path / "state" / "captures").stat().st_mode & 0o777 == 0o700
    client = await aiohttp_client(make(write_config, models, capture="{keep: true}", extra=extra))
    for _ in range(50):  # read back off the event loop, just after the start
        listing = await (await client.get("/captures")).json()
        if listing["data"]:
            break
        await asyncio.sleep(0.05)
    assert [row["id"] for row in listing["data"]] == [first["id"]]
    detail = await (await client.get(f"/captures/{first['id']}")).json()
    assert "".join(e["data"] for e in detail["response"]["events"]).encode() == received
    assert detail["request"]["body"]["messages"][0]["content"] == "kept?"


# --- the pure parts ----------------------------------------------------------------------------------

def test_credential_headers_are_redacted_and_their_values_found():
    given = {"Authorization": "Bearer sk-abcdef", "X-Api-Key": "k-12345", "X-Session-Token": "t", "Cookie": "a=b",
             "Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    kept = redaction.headers(given, 64, 1024)
    assert kept == {**given, "Authorization": "[redacted]", "X-Api-Key": "[redacted]", "X-Session-Token": "[redacted]",
                    "Cookie": "[redacted]"}
    assert set(redaction.presented({k.lower(): v for k, v in given.items()})) == {b"sk-abcdef", b"k-12345"}
    assert redaction.presented({"authorization": "Bearer ab"}) == ()  # too short to look for in a body
    assert redaction.cut_secrets(b'{"a": "sk-abcdef sk-abcdef"}', (b"sk-abcdef",)) == b'{"a": "[redacted] [redacted]"}'
    assert len(redaction.headers({f"h{i}": "v" * 5000 for i in range(100)}, 64, 1024)) == 64


def test_content_redaction_keeps_shapes_in_every_framing():
    whole = json.dumps({"model": "m", "messages": [{"role": "user", "content": "secret"}],
                        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "hush"}}]})
    out = json.loads(redaction.content(whole.encode(), sse=False))
    assert out == {"model": "m", "messages": [{"role": "user", "content": "[6 chars]"}],
                   "tools": [{"type": "function", "function": {"name": "get_weather", "description": "[4 chars]"}}]}
    sse = b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"secret"}}\n\n' \
          b": loading 43%\n\ndata: [DONE]\n\n"
    red = redaction.content(sse, sse=True)
    assert b"secret" not in red and b'"text":"[6 chars]"' in red and b"data: [DONE]" in red and b": loading 43%" in red
    ndjson = b'{"message":{"role":"assistant","content":"secret"},"done":false}\n{"cut": "sec'
    red = redaction.content(ndjson, sse=False)
    assert b"secret" not in red and b"sec" not in red.split(b"\n")[1] and red.split(b"\n")[1] == b"[12 bytes]"
    deep = b"[" * 100000 + b"]" * 100000  # deeper than Python parses: kept as its length alone
    assert redaction.content(deep, sse=False) == b"[200000 bytes]"


async def test_with_tracing_off_a_requests_traceparent_goes_on_to_its_upstream_as_it_came(
        aiohttp_client, aiohttp_server, write_config, models):
    """The inner gateway's capture shows the headers the outer one sent it."""
    inner = await aiohttp_server(make(write_config, models))
    up = str(inner.make_url("/v1"))
    outer = await aiohttp_client(create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\nmodels:\n  far: {{upstream: '{up}', model: chat}}\n",
        "outer.yaml"))))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for stream in (False, True):
        r = await outer.post("/v1/chat/completions", json={
            "model": "far", "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
            headers={"traceparent": parent, "tracestate": "congo=t61rcWkgMzE"})
        assert r.status == 200
        await r.read()
    r = await outer.post("/v1/chat/completions", json={"model": "far", "messages": [{"role": "user", "content": "hi"}]},
                         headers={"traceparent": "00-zz-not-a-trace-01"})
    await r.read()
    async with _session() as s:
        listing = await (await s.get(str(inner.make_url("/captures")))).json()
    heads = [{k.lower(): v for k, v in (await _detail(inner, row["id"]))["request"]["headers"].items()}
             for row in listing["data"]]
    assert "traceparent" not in heads[0]  # a malformed one is not passed on
    for h in heads[1:]:
        assert h["traceparent"] == parent and h["tracestate"] == "congo=t61rcWkgMzE"


def _session():
    return aiohttp.ClientSession()


async def _detail(server, capture_id):
    async with _session() as s:
        return await (await s.get(str(server.make_url(f"/captures/{capture_id}")))).json()


def test_capture_and_otel_settings_are_checked(write_config):
    from gateway.models.config import ConfigError
    from gateway.models.config.specs import CaptureConfig, OtelConfig

    cfg = load_config(write_config("server:\n  capture: {max_bytes: 1MiB, keep: true}\n  otel: {endpoint: 'http://c:4318'}\n"))
    assert cfg.server.capture == CaptureConfig(enabled=True, max_bytes=2**20, keep=True)
    assert cfg.server.otel == OtelConfig(enabled=True, endpoint="http://c:4318")
    assert load_config(write_config("server:\n  capture: false\n  otel: false\n")).server.otel.enabled is False
    with pytest.raises(ConfigError) as e:
        load_config(write_config("server:\n  capture: {max_bytes: lots, redact: true}\n  otel: {sampler: sometimes}\n"))
    text = str(e.value)
    assert "server.capture.max_bytes" in text and "server.capture.redact" in text and "server.otel.sampler" in text


async def test_replay_on_a_model_another_machine_serves(aiohttp_client, aiohttp_server, write_config, models):
    """The replay names a model this gateway reaches through ``upstream:``: the other machine
    answers, and the replay is captured here like any other request."""
    inner = await aiohttp_server(make(write_config, models, capture="false"))
    up = str(inner.make_url("/v1"))
    client = await aiohttp_client(create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\n  capture: true\n"
        f"models:\n  chat: {models}/plain.gguf\n  far: {{upstream: '{up}', model: thinker}}\n", "outer.yaml"))))
    r = await client.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "2+2?"}]})
    assert r.status == 200
    original = (await (await client.get("/captures")).json())["data"][0]
    r = await client.post(f"/captures/{original['id']}/replay", json={"model": "far"})
    assert r.status == 200, await r.text()
    again = await r.json()
    assert again["model"] == "far" and again["replay_of"] == original["id"] and again["status"] == 200
    assert again["answer"]["content"].strip() == "It is 4." and again["answer"]["thinking"].strip() == "Two and two make four."


async def test_a_failing_capture_or_trace_is_logged_and_the_answer_goes_out(aiohttp_client, write_config, models,
                                                                            monkeypatch, caplog):
    from gateway.server import tracing
    from gateway.server.captures import CaptureStore

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the observing")

    monkeypatch.setattr(CaptureStore, "finish", broken)
    monkeypatch.setattr(tracing.Tracing, "end", broken)
    client = await aiohttp_client(make(write_config, models, extra="  otel: {endpoint: 'http://127.0.0.1:9'}\n"))
    for stream in (False, True):
        r = await client.post("/v1/chat/completions", json={"model": "chat", "stream": stream,
                                                            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status == 200 and b"Hello" in await r.read()
    assert "this request could not be captured" in caplog.text and "could not end this request's trace" in caplog.text
    monkeypatch.setattr(tracing.Tracing, "begin", broken)
    r = await client.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 200 and "could not begin" in caplog.text


async def test_hostile_input_to_the_capture_routes_is_a_4xx_in_openais_shape(aiohttp_client, write_config, models):
    client = await aiohttp_client(make(write_config, models))
    r = await client.post("/v1/chat/completions", json={"model": "chat", "messages": [{"role": "user", "content": "a"}]})
    await r.read()
    cid = (await (await client.get("/captures")).json())["data"][0]["id"]
    bodies = [b'{"model": "\\ud800"}', b"[" * 5000 + b"]" * 5000, b'{"model": 1e999999}', b'{"model": 7}',
              b'{"model": ["chat"]}', b'{"model": ""}', b'{"model": null}', b"not json", b'"a string"']
    for body in bodies:
        r = await client.post(f"/captures/{cid}/replay", data=body, headers={"Content-Type": "application/json"})
        payload = await r.json()
        assert 400 <= r.status < 500 and set(payload) == {"error"} and payload["error"]["message"], (body[:40], r.status)
    # a name no model has: the replay runs, and its capture holds the gateway's own 4xx to it
    r = await client.post(f"/captures/{cid}/replay", json={"model": "x" * 100_000})
    again = await r.json()
    assert r.status == 200 and 400 <= again["status"] < 500 and again["replay_of"] == cid
    for query in ({"limit": "1e999"}, {"limit": "99999999999999999999"}, {"limit": "-1"}, {"since": "\udcff"},
                  {"until": "9" * 400}, {"status": "x" * 2000}, {"model": ["a"] * 100}):
        r = await client.get("/captures", params=query)
        assert r.status < 500, (query, r.status)
        if r.status >= 400:
            assert set(await r.json()) == {"error"}
    for cid in ("x" * 2000, "%00", "../../etc/passwd", "\u202e"):
        r = await client.get(f"/captures/{cid}")
        # "../.." is resolved by the client to another path, no route's: a 404 all the same
        assert r.status == 404 and (await r.json())["error"]["code"] in ("capture_not_found", "not_found")
