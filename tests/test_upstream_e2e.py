"""A gateway in front of another gateway: two real `gguf-gateway serve` processes on loopback,
the outer one serving the inner one's models as `upstream:` entries, driven by the official
openai and anthropic SDKs. Also: an upstream that is not there, one that never answers, one
that sends a broken stream, a client that leaves mid-answer, replicas that fail over, and an
upstream killed mid-answer."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading
import time
import urllib.request

import anthropic
import openai
import pytest
from helpers import WEATHER, ServerProcess, agent_model, free_port

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "2+2?"}]


class _Broken(http.server.BaseHTTPRequestHandler):
    """An "OpenAI server" whose streams break: a good chunk, then one that is not JSON."""

    def do_GET(self):  # noqa: N802
        self._send(200, "application/json", b'{"object": "list", "data": [{"id": "m"}]}')

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
        self._send(200, "text/event-stream", f"data: {json.dumps(chunk)}\n\ndata: {{not json\n\n".encode())

    def _send(self, status, kind, body):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Flaky(_Broken):
    """Lists its models, and drops every request's connection before answering: its health
    probe passes, each request fails before the first byte."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class _Whole(_Broken):
    """A server that answers whole even when asked to stream."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": "Hi there"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        self._send(200, "application/json", json.dumps(body).encode())


class _Stalling(_Broken):
    """Sends one chunk, then nothing (for longer than the entry's idle timeout)."""

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.flush()
        time.sleep(4)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("upstream")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    tm.plain(d / "emb.gguf", ["x", "y"])
    agent_model(d / "agent.gguf")
    inner_cfg = d / "inner.yaml"
    inner_cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys: [inner-key]\nmodels:\n"
                         f"  plain: {d}/plain.gguf\n  thinker: {d}/thinker.gguf\n  loop: {d}/loop.gguf\n"
                         f"  agent: {d}/agent.gguf\n"
                         f"  raw-thinker:\n    path: {d}/thinker.gguf\n    reasoning: none\n"
                         f"  emb:\n    path: {d}/emb.gguf\n    embeddings: true\n")
    (d / "key").write_text("inner-key\n")
    # a listener that accepts connections and never answers
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    broken = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    flaky = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    stalling = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stalling)
    whole = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Whole)
    for srv in (broken, flaky, stalling, whole):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    closed = free_port()
    with ServerProcess("--config", str(inner_cfg)) as inner, ServerProcess("--config", str(inner_cfg)) as spare:
        up = f"{inner.url}/v1"
        outer_cfg = d / "outer.yaml"
        outer_cfg.write_text(f"""
server:
  discover_default_stores: false
  api_keys: [outer-key]
  upstream_check_seconds: 1
models:
  far-plain: {{upstream: {up}, model: plain, api_key_file: {d}/key}}
  far-thinker: {{upstream: {up}, model: thinker, api_key: inner-key}}
  far-raw: {{upstream: {up}, model: raw-thinker, api_key: inner-key}}
  far-loop: {{upstream: {up}, model: loop, api_key: inner-key}}
  far-agent: {{upstream: {up}, model: agent, api_key: inner-key}}
  far-emb: {{upstream: {up}, model: emb, api_key: inner-key}}
  far-missing: {{upstream: {up}, model: nope, api_key: inner-key}}
  far-nokey: {{upstream: {up}, model: plain}}
  inner: {{upstream: {inner.url}, api_key: inner-key, upstream_discover: true, prefix: "inner/"}}
  dead: {{upstream: "http://127.0.0.1:{closed}/v1"}}
  hole: {{upstream: "http://127.0.0.1:{hole.getsockname()[1]}/v1", timeouts: {{first_byte: 1}}}}
  broken: {{upstream: "http://127.0.0.1:{broken.server_address[1]}/v1", model: m}}
  whole: {{upstream: "http://127.0.0.1:{whole.server_address[1]}/v1", model: m}}
  stalling: {{upstream: "http://127.0.0.1:{stalling.server_address[1]}/v1", model: m, timeouts: {{idle: 1}}}}
  pair:
    replicas:
      - {{upstream: "http://127.0.0.1:{flaky.server_address[1]}/v1", model: plain}}
      - {{upstream: {up}, model: plain, api_key: inner-key}}
  mixed:
    replicas:
      - {d}/plain.gguf
      - {{upstream: {up}, model: plain, api_key: inner-key}}
  spared:
    replicas:
      - {{upstream: {spare.url}/v1, model: loop, api_key: inner-key}}
      - {{upstream: {up}, model: loop, api_key: inner-key}}
""")
        with ServerProcess("--config", str(outer_cfg)) as outer:
            yield {"inner": inner, "outer": outer, "spare": spare}
    for srv in (broken, flaky, stalling, whole):
        srv.shutdown()
        srv.server_close()
    hole.close()


@pytest.fixture
def oai(hosts):
    with openai.OpenAI(base_url=hosts["outer"].url + "/v1", api_key="outer-key", max_retries=0) as c:
        yield c


@pytest.fixture
def inner_oai(hosts):
    with openai.OpenAI(base_url=hosts["inner"].url + "/v1", api_key="inner-key", max_retries=0) as c:
        yield c


@pytest.fixture
def anth(hosts):
    with anthropic.Anthropic(base_url=hosts["outer"].url, api_key="outer-key", max_retries=0) as c:
        yield c


def _get(server, path):
    return server.get(path, headers={"Authorization": "Bearer outer-key"})


def test_whole_and_streamed_answers_match_the_inner_gateway(oai, inner_oai):
    near = inner_oai.chat.completions.create(model="plain", messages=ASK, temperature=0)
    far = oai.chat.completions.create(model="far-plain", messages=ASK, temperature=0)
    assert far.choices[0].message.content == near.choices[0].message.content == "Hello, world!"
    assert far.model == "far-plain" and far.choices[0].finish_reason == "stop"
    assert far.usage.prompt_tokens == near.usage.prompt_tokens and far.usage.completion_tokens == 4
    chunks = list(oai.chat.completions.create(model="far-plain", messages=ASK, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, world!"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 4  # passed on as it came
    assert chunks[-1].usage.completion_tokens == 4


def test_thinking_passes_through_and_raw_markers_are_split(oai):
    for model in ("far-thinker", "far-raw"):
        msg = oai.chat.completions.create(model=model, messages=ASK).choices[0].message
        assert msg.content == "It is 4.", model
        assert msg.model_extra["reasoning_content"] == "Two and two.", model
        chunks = list(oai.chat.completions.create(model=model, messages=ASK, stream=True))
        thinking = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
        assert thinking == "Two and two.", model


def test_anthropic_client_through_an_openai_upstream(anth):
    msg = anth.messages.create(model="far-thinker", max_tokens=64, messages=ASK)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Two and two." and msg.content[1].text == "It is 4."
    with anth.messages.stream(model="far-thinker", max_tokens=64, messages=ASK) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "It is 4."


def test_tool_calls_round_trip_in_both_shapes(oai, anth):
    first = oai.chat.completions.create(model="far-agent", messages=[{"role": "user", "content": "Weather?"}],
                                        tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    history = [{"role": "user", "content": "Weather?"}, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    second = oai.chat.completions.create(model="far-agent", messages=history, tools=[WEATHER])
    assert second.choices[0].message.content == "It is 18 C."
    with oai.chat.completions.stream(model="far-agent", messages=[{"role": "user", "content": "Weather?"}],
                                     tools=[WEATHER]) as stream:
        final = stream.get_final_completion()
    assert json.loads(final.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}
    tool = {"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER["function"]["parameters"]}
    msg = anth.messages.create(model="far-agent", max_tokens=64, tools=[tool],
                               messages=[{"role": "user", "content": "Weather?"}])
    use = next(b for b in msg.content if b.type == "tool_use")
    assert msg.stop_reason == "tool_use" and use.input == {"city": "Paris"}
    with anth.messages.stream(model="far-agent", max_tokens=64, tools=[tool],
                              messages=[{"role": "user", "content": "Weather?"}]) as stream:
        final = stream.get_final_message()
    assert next(b for b in final.content if b.type == "tool_use").input == {"city": "Paris"}


def test_completions_and_embeddings(oai, inner_oai):
    far = oai.completions.create(model="far-loop", prompt="Say\n", max_tokens=4)
    near = inner_oai.completions.create(model="loop", prompt="Say\n", max_tokens=4)
    assert far.choices[0].text == near.choices[0].text == " tick tock tick tock"
    assert far.choices[0].finish_reason == "length"
    far = oai.embeddings.create(model="far-emb", input=["one", "two"])
    near = inner_oai.embeddings.create(model="emb", input=["one", "two"])
    assert [d.embedding for d in far.data] == [d.embedding for d in near.data]


def test_an_upstream_refusal_reaches_the_client_in_its_shape(oai, anth):
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="far-missing", messages=ASK)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(anthropic.NotFoundError) as e2:
        anth.messages.create(model="far-missing", max_tokens=8, messages=ASK)
    assert e2.value.body["type"] == "error" and e2.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(openai.AuthenticationError):  # the entry without the inner key
        oai.chat.completions.create(model="far-nokey", messages=ASK)


def test_discovered_models_are_listed_under_the_prefix(oai):
    deadline = time.monotonic() + 10
    while "inner/plain" not in (ids := [m.id for m in oai.models.list()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {"inner/plain", "inner/thinker", "inner/emb"} <= set(ids)
    assert oai.chat.completions.create(model="inner/plain", messages=ASK).choices[0].message.content == "Hello, world!"


def test_a_client_that_leaves_closes_the_upstream_request(hosts, oai):
    stream = oai.chat.completions.create(model="far-loop", messages=ASK, stream=True, max_tokens=3000)
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while (busy := _inner_in_flight(hosts["inner"])) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert busy == 0


def _inner_in_flight(inner) -> int:
    return inner.get("/health", headers={"Authorization": "Bearer inner-key"})[1]["in_flight"]


def test_an_unreachable_upstream_is_a_503_with_retry_after_and_shows_down(hosts, oai, anth):
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="dead", messages=ASK)
    assert e.value.status_code == 503 and e.value.body["code"] == "upstream_unavailable"
    assert int(e.value.response.headers["Retry-After"]) >= 1
    with pytest.raises(anthropic.APIStatusError) as e2:
        anth.messages.create(model="dead", max_tokens=8, messages=ASK)
    assert e2.value.status_code == 503 and e2.value.body["error"]["type"] == "overloaded_error"
    status, body = _get(hosts["outer"], "/models")
    dead = next(m for m in body["data"] if m["id"] == "dead")
    assert dead["upstream"]["state"] == "down" and dead["upstream"]["error"]
    assert "inner-key" not in json.dumps(body)  # no upstream's key is ever shown
    assert _get(hosts["outer"], "/health")[1]["upstreams"]["dead"] == "down"
    metrics = urllib.request.urlopen(urllib.request.Request(
        hosts["outer"].url + "/metrics", headers={"Authorization": "Bearer outer-key"})).read().decode()
    assert 'gguf_gateway_upstream_up{upstream="dead"} 0.0' in metrics
    assert 'gguf_gateway_upstream_up{upstream="far-plain"} 1.0' in metrics
    assert "inner-key" not in metrics


def test_a_black_hole_upstream_times_out(oai):
    began = time.monotonic()
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="hole", messages=ASK)
    assert e.value.status_code == 503 and e.value.body["code"] == "upstream_unavailable"
    assert time.monotonic() - began < 10


def test_a_malformed_upstream_stream_ends_with_an_error_event(hosts):
    req = urllib.request.Request(hosts["outer"].url + "/v1/chat/completions", method="POST", headers={
        "Authorization": "Bearer outer-key", "Content-Type": "application/json"},
        data=json.dumps({"model": "broken", "messages": ASK, "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read().decode()
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert events[1]["choices"][0]["delta"]["content"] == "Hi"
    assert events[-1]["error"]["code"] == "upstream_malformed"
    assert body.rstrip().endswith("data: [DONE]")
    with pytest.raises(urllib.error.HTTPError) as e:  # whole: the error alone
        urllib.request.urlopen(urllib.request.Request(
            hosts["outer"].url + "/v1/chat/completions", method="POST",
            headers={"Authorization": "Bearer outer-key", "Content-Type": "application/json"},
            data=json.dumps({"model": "broken", "messages": ASK}).encode()), timeout=10)
    assert e.value.code == 502 and json.loads(e.value.read())["error"]["code"] == "upstream_malformed"


def test_an_upstream_that_does_not_stream_is_read_whole(oai):
    r = oai.chat.completions.create(model="whole", messages=ASK)
    assert r.choices[0].message.content == "Hi there" and r.usage.completion_tokens == 2
    chunks = list(oai.chat.completions.create(model="whole", messages=ASK, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there"


def test_an_upstream_that_goes_silent_mid_answer_ends_it_after_the_idle_timeout(oai):
    # ended by the gateway's idle timeout (its message), not by the upstream's close 4 s on
    stream = oai.chat.completions.create(model="stalling", messages=ASK, stream=True)
    texts = []
    with pytest.raises(openai.APIError, match="sent nothing of its answer for 1 s"):
        for c in stream:
            texts.append(c.choices[0].delta.content if c.choices else None)
    assert "Hi" in texts


def test_replicas_fail_over_and_count_per_replica(hosts, oai):
    for _ in range(3):
        assert oai.chat.completions.create(model="pair", messages=ASK).choices[0].message.content == "Hello, world!"
    assert oai.chat.completions.create(model="mixed", messages=ASK).choices[0].message.content == "Hello, world!"
    metrics = urllib.request.urlopen(urllib.request.Request(
        hosts["outer"].url + "/metrics", headers={"Authorization": "Bearer outer-key"})).read().decode()
    failovers = re.search(r'gguf_gateway_replica_failovers_total\{model="pair",replica="pair#1"\} (\d+)', metrics)
    assert failovers and int(failovers[1]) >= 1  # pair#1 took requests and dropped them before answering
    assert 'gguf_gateway_replica_requests_total{model="pair",replica="pair#2"} 3.0' in metrics
    assert 'gguf_gateway_replica_failovers_total{model="pair",replica="pair#2"} 0.0' in metrics
    assert 'gguf_gateway_replica_up{model="mixed",replica="mixed#1"} 1.0' in metrics
    _, body = _get(hosts["outer"], "/models")
    pair = next(m for m in body["data"] if m["id"] == "pair")
    assert [r["kind"] for r in pair["replicas"]] == ["upstream", "upstream"] and pair["replicas"][1]["up"]
    assert pair["replicas"][1]["requests"] == 3


def test_an_upstream_killed_mid_answer(hosts, oai):
    stream = oai.chat.completions.create(model="spared", messages=ASK, stream=True, max_tokens=3000)
    first = [next(iter(stream)) for _ in range(3)]
    assert first
    hosts["spare"].stop(signal_kill())
    with pytest.raises(openai.APIError):  # the answer that had begun ends with an error, not a hang
        for _ in stream:
            pass
    # the next requests go to the replica that lives
    again = oai.chat.completions.create(model="spared", messages=ASK, max_tokens=4)
    assert again.choices[0].message.content == " tick tock tick tock"


def signal_kill():
    import signal
    return signal.SIGKILL
