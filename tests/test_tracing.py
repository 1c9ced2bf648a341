"""OpenTelemetry traces (``gateway/server/tracing.py``): when they are on, what the extra's
absence does, the span tree and its attributes for each wire against a real app exporting to
a loopback OTLP receiver, a caller's ``traceparent`` honoured, one trace through a gateway
behind a gateway, and nothing of ``opentelemetry`` loaded when tracing is off."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from otlp_receiver import OtlpReceiver

from gateway.api.appkeys import LIVE
from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.models.config.specs import OtelConfig
from gateway.server import tracing
from gateway.server.events import Observation
from gateway.serving.supervisor import Loaded

SERVER, INTERNAL = 2, 1  # OTLP's SpanKind
UNSET, ERROR = 0, 2  # OTLP's StatusCode
MSG = [{"role": "user", "content": "hi"}]
CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


# --- when traces are on --------------------------------------------------------------------------

@pytest.mark.parametrize("enabled, environ, on", [
    (None, {}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "false"}, True),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    (None, {"OTEL_SERVICE_NAME": "x"}, False),
    (True, {}, True),
    (True, {"OTEL_SDK_DISABLED": "true"}, True),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
])
def test_wanted(enabled, environ, on):
    assert tracing.wanted(OtelConfig(enabled=enabled), environ) is on


def test_make_without_the_extra(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    monkeypatch.setattr(tracing, "_warned", False)
    assert tracing.make(OtelConfig(), {}) is None
    assert tracing.make(OtelConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is None
    with pytest.raises(tracing.TracingUnavailable, match=r"pip install 'gguf-gateway\[otel\]'"):
        tracing.make(OtelConfig(enabled=True), {})
    caplog.clear()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert tracing.make(OtelConfig(), env) is None
    assert tracing.make(OtelConfig(), env) is None
    warned = [r for r in caplog.records if "gguf-gateway[otel]" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING"


def test_the_service_name_sampler_and_endpoint(monkeypatch):
    made = tracing.make(OtelConfig(enabled=True, endpoint="http://127.0.0.1:9/"), {})
    assert isinstance(made, tracing.Tracing)
    assert made.provider.resource.attributes["service.name"] == "gguf-gateway"
    assert tracing._endpoint(OtelConfig(endpoint="http://c:4318/")) == "http://c:4318/v1/traces"
    assert tracing._endpoint(OtelConfig(endpoint="http://c:4318/v1/traces")) == "http://c:4318/v1/traces"
    assert tracing._endpoint(OtelConfig()) is None  # the SDK's own, from the environment
    made.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    for config, name in ((OtelConfig(enabled=True), "from-env"), (OtelConfig(service_name="mine"), "mine")):
        t = tracing.Tracing(config)
        assert t.provider.resource.attributes["service.name"] == name
        t.shutdown()
    t = tracing.Tracing(OtelConfig(sampler="traceidratio", sampler_arg=0.25))
    assert "0.25" in t.provider.sampler.get_description()
    t.shutdown()


# --- the span tree, from an observation made by hand ----------------------------------------------

def full_observation(now: float) -> Observation:
    from gateway.protocol import GenerationRequest

    obs = Observation("rid-1", "/v1/chat/completions", started=now)
    obs.asked_model, obs.model, obs.principal = "Chat:Latest", "chat", "alice"
    obs.request = GenerationRequest(messages=MSG, max_tokens=64, temperature=0.2, top_k=5, seed=3,
                                    stop=["END"], given=["temperature", "top_k"])
    obs.queued, obs.leased, obs.admitted = now + 0.001, now + 0.5, now + 0.502
    obs.load = Loaded(began=now - 0.2, ended=now + 0.49, bytes=12345, source="models.yaml")
    obs.first_token, obs.last_token = now + 0.6, now + 0.9
    obs.prompt_tokens, obs.cached_tokens, obs.cache_source = 40, 30, "ram"
    obs.completion_tokens, obs.reasoning_tokens, obs.drafted_tokens, obs.accepted_tokens = 20, 8, 10, 6
    obs.finish_reason = "stop"
    return obs


def by_name(spans):
    return {s["name"]: s for s in spans}


def test_the_span_tree_of_a_whole_observation():
    with OtlpReceiver() as rx:
        t = tracing.Tracing(OtelConfig(enabled=True, endpoint=rx.url, service_name="unit", headers={"x-key": "k"}))
        obs = full_observation(time.monotonic() - 1)  # a request that came a second ago, now ending
        handle = t.begin({}, obs, "POST", "/v1/chat/completions")
        assert obs.trace_id is not None and len(obs.trace_id) == 32
        (name, parent), = t.forward(handle)
        # sampled (and, W3C's level 2, a random trace id: 03)
        assert name == "traceparent" and parent.startswith(f"00-{obs.trace_id}-") and int(parent[-2:], 16) & 1
        t.end(handle, obs, 200, None)
        t.shutdown()
        spans = rx.wait_for(lambda s: len(s) == 5)
        assert rx.requests[0]["x-key"] == "k"
    s = by_name(spans)
    assert set(s) == {"chat chat", "queue", "load", "prompt", "generation"}
    root = s["chat chat"]
    assert root["kind"] == SERVER and root["parent_span_id"] is None and root["status"] == UNSET
    assert root["trace_id"] == obs.trace_id and root["service"] == "unit"
    assert parent[:-3] == f"00-{obs.trace_id}-{root['span_id']}"
    a = root["attributes"]
    assert a == {
        "http.request.method": "POST", "http.route": "/v1/chat/completions", "http.response.status_code": 200,
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "Chat:Latest", "gen_ai.response.model": "chat",
        "gen_ai.request.temperature": 0.2, "gen_ai.request.top_k": 5.0, "gen_ai.request.max_tokens": 64,
        "gen_ai.request.seed": 3, "gen_ai.request.stop_sequences": ["END"],
        "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 30, "gen_ai.usage.reasoning.output_tokens": 8,
        "gen_ai.response.finish_reasons": ["stop"], "gen_ai.response.time_to_first_chunk": pytest.approx(0.6),
        "gguf_gateway.request_id": "rid-1", "gguf_gateway.principal": "alice",
    }
    for child in ("queue", "prompt", "generation"):
        assert s[child]["parent_span_id"] == root["span_id"] and s[child]["kind"] == INTERNAL
    assert s["load"]["parent_span_id"] == s["queue"]["span_id"]

    def ms(span, edge):  # a span's edge in ms after the root's start
        return (span[edge] - root["start"]) / 1e6

    assert ms(s["queue"], "start") == pytest.approx(1, abs=0.01) and ms(s["queue"], "end") == pytest.approx(502, abs=0.01)
    # the load began before this request asked: its span starts when the request's wait did
    assert ms(s["load"], "start") == pytest.approx(1, abs=0.01) and ms(s["load"], "end") == pytest.approx(490, abs=0.01)
    assert s["load"]["attributes"] == {"gguf_gateway.load.bytes": 12345, "gguf_gateway.load.source": "models.yaml",
                                       "gguf_gateway.load.duration_s": pytest.approx(0.69)}
    assert ms(s["prompt"], "start") == pytest.approx(502, abs=0.01) and ms(s["prompt"], "end") == pytest.approx(600, abs=0.01)
    assert s["prompt"]["attributes"] == {"gguf_gateway.prompt.tokens_read": 10, "gguf_gateway.prompt.tokens_reused": 30,
                                         "gguf_gateway.prompt.cache_source": "ram"}
    assert ms(s["generation"], "start") == pytest.approx(600, abs=0.01)
    assert ms(s["generation"], "end") == pytest.approx(900, abs=0.01)
    assert s["generation"]["attributes"] == {
        "gen_ai.usage.output_tokens": 20, "gen_ai.usage.reasoning.output_tokens": 8,
        "gguf_gateway.speculation.drafted": 10, "gguf_gateway.speculation.accepted": 6}
    assert root["end"] >= s["generation"]["end"]


def test_only_the_spans_whose_marks_exist_and_the_error_statuses():
    with OtlpReceiver() as rx:
        t = tracing.Tracing(OtelConfig(enabled=True, endpoint=rx.url))
        refused = Observation("r-404", "/v1/chat/completions")  # an unknown model: nothing but its wait
        refused.asked_model, refused.queued = "nope", time.monotonic()
        t.end(t.begin({}, refused, "POST", "/v1/chat/completions"), refused, 404, "model_not_found")
        broken = Observation("r-500", "/v1/embeddings")  # the worker failed mid-way
        broken.asked_model, broken.model, broken.queued, broken.leased = "emb", "emb", time.monotonic(), time.monotonic()
        t.end(t.begin({}, broken, "POST", "/v1/embeddings"), broken, 500, "internal_error")
        gone = Observation("r-499", "/v1/models")  # an operator's route: HTTP's names
        gone.disconnected = True
        t.end(t.begin({}, gone, "GET", "/v1/models"), gone, 499, None)
        nowhere = Observation("r-no-route", "other")
        t.end(t.begin({}, nowhere, "GET", "other"), nowhere, 404, "not_found")
        t.shutdown()
        spans = rx.wait_for(lambda s: len(s) == 6)
    roots = {s["attributes"]["gguf_gateway.request_id"]: s for s in spans if s["parent_span_id"] is None}
    r = roots["r-404"]
    assert r["name"] == "chat nope" and r["status"] == UNSET  # 4xx: the caller's doing, not the server's
    assert r["attributes"]["error.type"] == "model_not_found" and "gen_ai.response.model" not in r["attributes"]
    assert [s["name"] for s in spans if s["parent_span_id"] == r["span_id"]] == ["queue"]
    r = roots["r-500"]
    assert r["name"] == "embeddings emb" and r["status"] == ERROR and r["status_message"] == "internal_error"
    assert r["attributes"]["error.type"] == "internal_error" and "gen_ai.usage.output_tokens" not in r["attributes"]
    r = roots["r-499"]
    assert r["name"] == "GET /v1/models" and r["status"] == UNSET and "gen_ai.operation.name" not in r["attributes"]
    assert r["attributes"]["error.type"] == "499" and r["attributes"]["gguf_gateway.client_disconnected"] is True
    r = roots["r-no-route"]
    assert r["name"] == "GET" and "http.route" not in r["attributes"]


def test_a_callers_traceparent_and_tracestate_are_honoured():
    with OtlpReceiver() as rx:
        t = tracing.Tracing(OtelConfig(enabled=True, endpoint=rx.url))
        obs = Observation("r", "/v1/completions")
        handle = t.begin({"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "vendor=x"}, obs,
                         "POST", "/v1/completions")
        forward = dict(t.forward(handle))
        t.end(handle, obs, 200, None)
        t.shutdown()
        root, = rx.wait_for(lambda s: len(s) == 1)
    assert obs.trace_id == root["trace_id"] == CALLER_TRACE and root["parent_span_id"] == CALLER_SPAN
    assert forward == {"traceparent": f"00-{CALLER_TRACE}-{root['span_id']}-01", "tracestate": "vendor=x"}


def test_an_unsampled_request_names_no_trace_and_passes_the_decision_on():
    t = tracing.Tracing(OtelConfig(enabled=True, endpoint="http://127.0.0.1:9", sampler="always_off"))
    obs = Observation("r", "/v1/completions")
    handle = t.begin({}, obs, "POST", "/v1/completions")
    assert obs.trace_id is None and not int(dict(t.forward(handle))["traceparent"][-2:], 16) & 1
    t.end(handle, obs, 200, None)
    t.shutdown()


# --- a real app ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tracing")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf")
    tm.plain(d / "emb.gguf", ["x"])
    return d


@pytest.fixture
def receiver(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    with OtlpReceiver() as rx:
        yield rx


def traced_config(write_config, files: Path, rx: OtlpReceiver, service: str = "gateway-under-test",
                  models: str | None = None, name: str = "models.yaml"):
    models = models or (f"  plain: {files}/plain.gguf\n  loop: {files}/loop.gguf\n"
                        f"  emb:\n    path: {files}/emb.gguf\n    embeddings: true\n")
    return load_config(write_config(
        f"server:\n  discover_default_stores: false\n  otel:\n    endpoint: {rx.url}\n    service_name: {service}\n"
        f"models:\n{models}", name))


def tree_of(spans, rid: str):
    """The root span of request ``rid`` and its children by name (the load under its queue)."""
    root = next(s for s in spans if s["attributes"].get("gguf_gateway.request_id") == rid)
    kids = {s["name"]: s for s in spans if s["parent_span_id"] == root["span_id"]}
    if "queue" in kids:
        kids.update({s["name"]: s for s in spans if s["parent_span_id"] == kids["queue"]["span_id"]})
    return root, kids


def has_request(rid: str):
    return lambda spans: any(s["attributes"].get("gguf_gateway.request_id") == rid for s in spans)


GENERATING = [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 20, "temperature": 0.5, "seed": 7, "stop": ["zzz"]},
     "chat"),
    ("/v1/completions", {"prompt": "Say it\n", "max_tokens": 20}, "text_completion"),
    ("/v1/messages", {"messages": MSG, "max_tokens": 20, "stop_sequences": ["zzz"]}, "chat"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 20}, "chat"),
    ("/api/chat", {"messages": MSG, "options": {"num_predict": 20}}, "chat"),
    ("/api/generate", {"prompt": "hi", "options": {"num_predict": 20}}, "text_completion"),
]


@pytest.mark.parametrize("route, body, op", GENERATING, ids=[r for r, _, _ in GENERATING])
async def test_each_wire_whole_and_streamed(aiohttp_client, write_config, files, receiver, route, body, op):
    app = create_app(traced_config(write_config, files, receiver))
    client = await aiohttp_client(app)
    for stream in (False, True):
        rid = f"{op}-{'stream' if stream else 'whole'}-{uuid.uuid4().hex[:8]}"
        r = await client.post(route, json={**body, "model": "plain", "stream": stream}, headers={"X-Request-Id": rid})
        assert r.status == 200, await r.text()
        await r.read()
        spans = await receiver.until(has_request(rid))
        root, kids = tree_of(spans, rid)
        assert root["name"] == f"{op} plain" and root["kind"] == SERVER and root["status"] == UNSET
        assert root["service"] == "gateway-under-test" and root["parent_span_id"] is None
        a = root["attributes"]
        assert a["gen_ai.operation.name"] == op and a["gen_ai.provider.name"] == "llama.cpp"
        assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "plain"
        assert a["http.request.method"] == "POST" and a["http.route"] == route and a["http.response.status_code"] == 200
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"] and a["gen_ai.request.max_tokens"] == 20
        assert "error.type" not in a and a["gguf_gateway.principal"] == "anonymous"
        if route == "/v1/chat/completions":
            assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.seed"] == 7
            assert a["gen_ai.request.stop_sequences"] == ["zzz"] and "gen_ai.request.top_k" not in a
        if route == "/v1/messages":
            assert a["gen_ai.request.stop_sequences"] == ["zzz"]
        # the first request waited for the model's load; the second found it loaded
        assert set(kids) == ({"queue", "load", "prompt", "generation"} if not stream else {"queue", "prompt", "generation"})
        order = [kids["queue"]["start"], kids["queue"]["end"], kids["prompt"]["start"], kids["prompt"]["end"],
                 kids["generation"]["start"], kids["generation"]["end"]]
        assert root["start"] <= order[0] and order == sorted(order) and order[-1] <= root["end"]
        assert kids["prompt"]["end"] == kids["generation"]["start"]  # the first token ends the prompt's read
        assert kids["generation"]["attributes"]["gen_ai.usage.output_tokens"] == a["gen_ai.usage.output_tokens"]
        prompt = kids["prompt"]["attributes"]
        assert prompt["gguf_gateway.prompt.tokens_read"] + prompt["gguf_gateway.prompt.tokens_reused"] == \
            a["gen_ai.usage.input_tokens"]
        if "load" in kids:
            load = kids["load"]
            assert load["attributes"]["gguf_gateway.load.bytes"] == (files / "plain.gguf").stat().st_size
            assert load["attributes"]["gguf_gateway.load.source"] == "models.yaml"
            assert kids["queue"]["start"] <= load["start"] <= load["end"] <= kids["queue"]["end"]
        event = next(e for e in app[LIVE].recent(everyone=True) if e["request_id"] == rid)
        assert event["trace_id"] == root["trace_id"]


@pytest.mark.parametrize("route, body", [("/v1/embeddings", {"input": "hello"}), ("/api/embed", {"input": ["a", "b"]}),
                                         ("/api/embeddings", {"prompt": "hello"})])
async def test_embeddings(aiohttp_client, write_config, files, receiver, route, body):
    client = await aiohttp_client(create_app(traced_config(write_config, files, receiver)))
    rid = uuid.uuid4().hex
    r = await client.post(route, json={**body, "model": "emb"}, headers={"X-Request-Id": rid})
    assert r.status == 200, await r.text()
    root, kids = tree_of(await receiver.until(has_request(rid)), rid)
    a = root["attributes"]
    assert root["name"] == "embeddings emb" and a["gen_ai.operation.name"] == "embeddings"
    assert a["gen_ai.response.model"] == "emb" and a["http.route"] == route
    assert "gen_ai.usage.output_tokens" not in a and "gen_ai.response.finish_reasons" not in a
    assert set(kids) == {"queue", "load"}  # no tokens generated: no prompt or generation span
    if route != "/api/embeddings":  # Ollama's legacy route answers no count
        assert a["gen_ai.usage.input_tokens"] > 0


async def test_a_callers_trace_and_a_refusal_and_a_client_that_left(aiohttp_client, write_config, files, receiver):
    client = await aiohttp_client(create_app(traced_config(write_config, files, receiver)))
    r = await client.post("/v1/chat/completions", json={"model": "plain", "messages": MSG},
                          headers={"X-Request-Id": "joined", "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
    assert r.status == 200
    root, _ = tree_of(await receiver.until(has_request("joined")), "joined")
    assert root["trace_id"] == CALLER_TRACE and root["parent_span_id"] == CALLER_SPAN

    r = await client.post("/v1/chat/completions", json={"model": "nope", "messages": MSG},
                          headers={"X-Request-Id": "refused"})
    assert r.status == 404
    root, _ = tree_of(await receiver.until(has_request("refused")), "refused")
    assert root["name"] == "chat nope" and root["status"] == UNSET
    assert root["attributes"]["error.type"] == "model_not_found"
    assert root["attributes"]["http.response.status_code"] == 404

    async with client.post("/v1/chat/completions", json={"model": "loop", "messages": MSG, "stream": True},
                           headers={"X-Request-Id": "gone"}) as r:
        await r.content.readline()  # the answer began; the caller leaves
    root, kids = tree_of(await receiver.until(has_request("gone")), "gone")
    assert root["attributes"]["gguf_gateway.client_disconnected"] is True
    assert root["attributes"]["http.response.status_code"] == 499 and root["status"] == UNSET
    assert {"queue", "prompt", "generation"} <= set(kids)


async def test_one_trace_through_a_gateway_behind_a_gateway(aiohttp_client, aiohttp_server, write_config, files,
                                                             receiver):
    inner = await aiohttp_server(create_app(traced_config(write_config, files, receiver, "inner",
                                                          f"  plain: {files}/plain.gguf\n", "inner.yaml")))
    outer_models = f"  far: {{upstream: '{inner.make_url('/v1')}', model: plain}}\n"
    client = await aiohttp_client(create_app(traced_config(write_config, files, receiver, "outer", outer_models,
                                                           "outer.yaml")))
    for stream in (False, True):
        rid = f"outer-{stream}"
        r = await client.post("/v1/chat/completions", json={"model": "far", "messages": MSG, "stream": stream},
                              headers={"X-Request-Id": rid})
        assert r.status == 200, await r.text()
        await r.read()
        spans = await receiver.until(has_request(rid))
        outer, _ = tree_of(spans, rid)
        assert outer["service"] == "outer" and outer["name"] == "chat far"

        def inner_root(spans, trace=outer["trace_id"]):
            return [s for s in spans if s["service"] == "inner" and s["trace_id"] == trace
                    and s["kind"] == SERVER]

        inner_span, = inner_root(await receiver.until(inner_root))
        assert inner_span["parent_span_id"] == outer["span_id"] and inner_span["name"] == "chat plain"
        assert outer["start"] <= inner_span["start"] and inner_span["end"] <= outer["end"]
        assert {s["service"] for s in receiver.trace(outer["trace_id"])} == {"outer", "inner"}


def test_tracing_off_loads_nothing_of_opentelemetry(write_config, files):
    path = write_config(f"""
        server:
          discover_default_stores: false
        models:
          plain: {files}/plain.gguf
    """)
    script = textwrap.dedent(f"""
        import asyncio, sys
        from aiohttp.test_utils import TestClient, TestServer
        from gateway.app import create_app
        from gateway.models.config import load_config

        async def main():
            async with TestClient(TestServer(create_app(load_config({str(path)!r})))) as client:
                r = await client.post("/v1/chat/completions", json={{"model": "plain", "messages": {MSG!r}}},
                                      headers={{"traceparent": "00-{CALLER_TRACE}-{CALLER_SPAN}-01"}})
                assert r.status == 200, await r.text()

        asyncio.run(main())
        loaded = [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]
        print("LOADED", loaded)
        sys.exit(1 if loaded else 0)
    """)
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LOADED []" in done.stdout


# --- bounds: what a caller sent is quoted cut, and a collector that is down holds no exit ---------

def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_a_long_model_name_and_long_attributes_are_cut_in_every_span():
    from gateway.base.errors import MAX_MODEL_NAME
    from gateway.protocol import GenerationRequest

    with OtlpReceiver() as rx:
        t = tracing.Tracing(OtelConfig(enabled=True, endpoint=rx.url))
        obs = full_observation(time.monotonic() - 1)
        obs.model, obs.asked_model = "-", "x" * (2 * 2**20)
        obs.request = GenerationRequest(messages=MSG, stop=["s" * 4000, "t"])
        t.end(t.begin({}, obs, "POST", "/v1/chat/completions"), obs, 404, "model_not_found")
        t.shutdown()
        spans = rx.wait_for(lambda s: any(x["kind"] == SERVER for x in s))
    root = next(s for s in spans if s["kind"] == SERVER)
    assert root["name"] == "chat " + "x" * MAX_MODEL_NAME
    assert root["attributes"]["gen_ai.request.model"] == "x" * MAX_MODEL_NAME
    assert root["attributes"]["gen_ai.request.stop_sequences"] == ["s" * tracing.MAX_ATTRIBUTE_LENGTH, "t"]
    for span in spans:
        assert len(span["attributes"]) <= tracing.MAX_ATTRIBUTES
        for v in span["attributes"].values():
            assert all(len(s) <= tracing.MAX_ATTRIBUTE_LENGTH for s in _strings(v))


async def test_a_model_name_of_megabytes_leaves_a_bounded_span_and_404(aiohttp_client, write_config, files,
                                                                       receiver):
    from gateway.base.errors import MAX_MODEL_NAME

    client = await aiohttp_client(create_app(traced_config(write_config, files, receiver)))
    body = json.dumps({"model": "n" * (4 * 2**20), "messages": MSG}).encode()
    r = await client.post("/v1/chat/completions", data=io.BytesIO(body),
                          headers={"X-Request-Id": "long-name", "Content-Type": "application/json"})
    text = await r.text()
    assert r.status == 404 and len(text) < 2 * MAX_MODEL_NAME + 400, text[:200]
    r = await client.post("/v1/chat/completions", json={"model": "plain", "messages": MSG, "max_tokens": 4,
                                                        "stop": ["z" * 4000]}, headers={"X-Request-Id": "long-stop"})
    assert r.status == 200, await r.text()
    spans = await receiver.until(lambda s: has_request("long-name")(s) and has_request("long-stop")(s))
    for rid in ("long-name", "long-stop"):
        root, kids = tree_of(spans, rid)
        assert len(root["name"]) <= MAX_MODEL_NAME + 32
        for span in (root, *kids.values()):
            for v in span["attributes"].values():
                assert all(len(s) <= tracing.MAX_ATTRIBUTE_LENGTH for s in _strings(v))
    root, _ = tree_of(spans, "long-stop")
    assert root["attributes"]["gen_ai.request.stop_sequences"] == ["z" * tracing.MAX_ATTRIBUTE_LENGTH]


def test_sigterm_with_the_collector_down_ends_within_the_bound(write_config, files):
    """A collector that takes connections and never answers: the spans still queued at SIGTERM
    are given the drain time at most (``SHUTDOWN_SECONDS`` within it), then dropped."""
    import signal
    import socket
    import urllib.error
    import urllib.request

    from helpers import ServerProcess

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)  # connections complete in the backlog; nothing is ever read or answered
    drain = 2
    cfg = write_config(f"server:\n  drain_seconds: {drain}\n  otel:\n    endpoint: http://127.0.0.1:{hole.getsockname()[1]}\n"
                       f"models:\n  plain: {files}/plain.gguf\n")
    # many small batches: each export waits out the exporter's timeout
    env = {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    try:
        with ServerProcess("--config", str(cfg), env=env) as server:
            for i in range(120):
                req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(
                    {"model": f"nope-{i}", "messages": MSG}).encode(), headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(req, timeout=30).close()
                except urllib.error.HTTPError as e:
                    assert e.code == 404
            began = time.monotonic()
            code, log = server.stop(signal.SIGTERM, timeout=60)
            took = time.monotonic() - began
    finally:
        hole.close()
    assert code == 0, log[-2000:]
    bound = min(tracing.SHUTDOWN_SECONDS, drain) + tracing.SHUTDOWN_GRACE
    assert took < bound + 5, f"SIGTERM took {took:.1f} s with the collector down (bound {bound} s)\n{log[-2000:]}"
    assert "spans still queued are dropped" in log


async def test_a_method_no_convention_knows_is_told_as_other(aiohttp_client, write_config, files, receiver):
    client = await aiohttp_client(create_app(traced_config(write_config, files, receiver)))
    r = await client.request("PROPFIND", "/v1/chat/completions", headers={"X-Request-Id": "odd-method"})
    assert r.status == 405
    root, _ = tree_of(await receiver.until(has_request("odd-method")), "odd-method")
    assert root["name"] in ("HTTP /v1/chat/completions", "HTTP")  # a method is any token: not quoted
    assert root["attributes"]["http.request.method"] == "_OTHER"
