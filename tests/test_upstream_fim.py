"""Fill-in-the-middle through an upstream: a FIM request for a models.yaml entry with
``upstream:`` goes to the upstream's llama-server-shaped /infill (input_prefix, input_suffix,
input_extra and the sampling fields), its answer (whole or streamed) read back as backend
events; an upstream without /infill (404/405) gets /v1/completions with ``prompt`` and
``suffix``, and what that shape cannot carry is a 501 naming it, never dropped. The wire
pieces unit by unit, then against a real `gguf-gateway serve` as the upstream."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request

import pytest
from helpers import ServerProcess, request

from gateway.backends import upstream_wire as wire
from gateway.base.errors import ApiError
from gateway.models import testmodels as tm
from gateway.protocol import Done, GenerationRequest, Text
from gateway.wire import fim

FIM_SPECIAL = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
MIDDLE = [" return", " a", " +", " b"]
PREFIX, SUFFIX = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"


def fim_request(**kw) -> GenerationRequest:
    return GenerationRequest(prompt=PREFIX, suffix=SUFFIX, **kw)


# --- the wire, unit by unit ----------------------------------------------------------------------

@pytest.mark.parametrize("base, url", [
    ("http://box:8080/v1", "http://box:8080/infill"), ("http://box:8080/v1/", "http://box:8080/infill"),
    ("http://box/llm/v1", "http://box/llm/infill"), ("http://box:8080", "http://box:8080/infill"),
])
def test_infill_is_at_the_servers_root(base, url):
    assert wire.infill_url(base) == url


def test_the_infill_body_carries_everything_a_fim_request_holds():
    req = fim_request(infill_extra=[{"filename": "util.py", "text": "x = 1\n"}], infill_prompt="    ", max_tokens=16,
                      temperature=0.2, top_k=5, stop=["\n\n"], given=["temperature", "top_k"], ignore_eos=True)
    body = wire.infill_body(req, "far-coder")
    assert body == {"model": "far-coder", "stream": True, "input_prefix": PREFIX, "input_suffix": SUFFIX,
                    "input_extra": [{"filename": "util.py", "text": "x = 1\n"}], "prompt": "    ", "n_predict": 16,
                    "temperature": 0.2, "top_k": 5, "stop": ["\n\n"], "ignore_eos": True}
    assert "top_p" not in body  # a field nobody set is the upstream's to choose


def test_the_completions_fallback_keeps_the_suffix_and_refuses_what_it_cannot_carry():
    path, body = wire.request_body(fim_request(max_tokens=8), "m")
    assert path == "/completions" and body["prompt"] == PREFIX and body["suffix"] == SUFFIX
    for req, param in ((fim_request(infill_extra=[{"filename": "a", "text": "b"}]), "input_extra"),
                       (fim_request(infill_prompt="  "), "prompt")):
        with pytest.raises(ApiError) as e:
            wire.request_body(req, "m")
        assert e.value.status == 501 and e.value.param == param
    assert "suffix" not in wire.request_body(GenerationRequest(prompt="a"), "m")[1]


def test_the_infill_reader_turns_llama_servers_stream_into_events():
    r = wire.InfillReader(7)
    events = []
    for piece in MIDDLE:
        events += r.feed(json.dumps({"content": piece, "stop": False, "tokens_predicted": 1}))
    events += r.feed(json.dumps({"content": "", "stop": True, "stop_type": "word", "stopping_word": "\n\n",
                                 "tokens_predicted": 4, "tokens_evaluated": 21, "timings": {"cache_n": 5}}))
    assert [e.text for e in events if isinstance(e, Text)] == MIDDLE
    done = events[-1]
    assert isinstance(done, Done) and (done.finish_reason, done.stop) == ("stop", "\n\n")
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (21, 4, 5)
    assert r.done and r.feed(json.dumps({"content": "late"})) == []
    limit = wire.InfillReader(1).whole(json.dumps({"content": "ab", "stop": True, "stop_type": "limit"}).encode())
    assert [type(e) for e in limit] == [Text, Done] and limit[-1].finish_reason == "length"


def test_the_infill_reader_bounds_and_refuses_what_is_not_its_shape():
    r = wire.InfillReader(1, wire.Bounds(chunks=2))
    events = [e for _ in range(3) for e in r.feed('{"content": "x"}')]
    assert isinstance(events[-1], Done) and events[-1].finish_reason == "length" and r.truncated
    for bad in ("[1]", '{"content": 5}', "{nope"):
        with pytest.raises(wire.MalformedStream):
            wire.InfillReader(1).feed(bad)
    with pytest.raises(ApiError) as e:
        wire.InfillReader(1).feed('{"error": {"message": "slot gone"}}')
    assert e.value.status == 502 and "slot gone" in e.value.message


def test_an_upstream_that_is_not_sent_fim_requests_refuses_them_in_words():
    with pytest.raises(ApiError) as e:
        fim.require_fim({"upstream": True}, "far", "suffix")
    assert e.value.status == 501 and e.value.param == "suffix" and "upstream" in e.value.message
    fim.require_fim({"upstream": True, "fim": wire.FIM_FORWARDED}, "far", "suffix")  # forwarded: the upstream decides


# --- against a real gateway as the upstream ------------------------------------------------------

class _NoInfill(http.server.BaseHTTPRequestHandler):
    """An OpenAI server without /infill (as vLLM or Ollama): /v1/completions answers with the
    suffix it was given, so the test sees it arrived."""

    seen: list[dict] = []

    def do_GET(self):  # noqa: N802
        self._send(200, b'{"object": "list", "data": [{"id": "m"}]}')

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.path != "/v1/completions":
            return self._send(404, b'{"error": {"message": "not found", "type": "not_found_error"}}')
        self.seen.append(body)
        chunk = {"choices": [{"index": 0, "text": f"[{body.get('suffix')!r}]", "finish_reason": "stop"}]}
        self._send(200, f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")

    def _send(self, status, body, kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def inner(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim-upstream")
    tm.write_scripted_model(d / "coder.gguf", tm.Script(MIDDLE, trigger="<|fim_middle|>"), extra_special=FIM_SPECIAL,
                            fim_ids=True)
    tm.plain(d / "plain.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  coder: {d}/coder.gguf\n"
                   f"  plain: {d}/plain.gguf\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv


def stream_events(url: str, body: dict, reader) -> list:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    decoder, events = wire.SSEDecoder(), []
    with urllib.request.urlopen(req, timeout=60) as r:
        if r.headers.get_content_type() == "application/json":
            return reader.whole(r.read())
        while chunk := r.read(7):  # cut anywhere, as a network does
            for data in decoder.feed(chunk):
                events += reader.feed(data)
        for data in decoder.close():
            events += reader.feed(data)
    return events


@pytest.mark.slow
def test_the_wire_speaks_a_real_gateways_infill_and_completions(inner):
    req = fim_request(max_tokens=16)
    for stream in (True, False):
        events = stream_events(wire.infill_url(inner.url + "/v1"), {**wire.infill_body(req, "coder"),
                                                                     "stream": stream}, wire.InfillReader(1))
        assert "".join(e.text for e in events if isinstance(e, Text)) == "".join(MIDDLE)
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "stop"
        assert done.prompt_tokens > 0 and done.completion_tokens == len(MIDDLE)
    path, body = wire.request_body(req, "coder")
    events = stream_events(inner.url + "/v1" + path, body, wire.ChunkReader(1, chat=False))
    assert "".join(e.text for e in events if isinstance(e, Text)) == "".join(MIDDLE)


@pytest.fixture(scope="module")
def outer(inner, tmp_path_factory):
    d = tmp_path_factory.mktemp("fim-outer")
    no_infill = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoInfill)
    threading.Thread(target=no_infill.serve_forever, daemon=True).start()
    cfg = d / "models.yaml"
    cfg.write_text(f"""server:
  discover_default_stores: false
models:
  far-coder: {{upstream: {inner.url}/v1, model: coder}}
  far-plain: {{upstream: {inner.url}/v1, model: plain}}
  vllm-like: {{upstream: "http://127.0.0.1:{no_infill.server_address[1]}/v1", model: m}}
""")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv
    no_infill.shutdown()
    no_infill.server_close()


def post(server, path, body):
    return request(server.url + path, body)[:2]


def sse_texts(server, path, body) -> list[dict]:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = r.read().decode().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


@pytest.mark.slow
def test_fim_through_an_upstream_gateway_on_every_route(outer):
    infill = {"model": "far-coder", "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 16,
              "input_extra": [{"filename": "util.py", "text": "x = 1\n"}]}
    status, body = post(outer, "/infill", infill)
    assert status == 200 and body["content"] == "".join(MIDDLE) and body["model"] == "far-coder", body
    assert body["tokens_evaluated"] > 0 and body["stop_type"] == "eos"
    streamed = sse_texts(outer, "/infill", {**infill, "stream": True})
    assert "".join(e["content"] for e in streamed) == "".join(MIDDLE) and streamed[-1]["stop"] is True
    status, body = post(outer, "/v1/fim/completions", {"model": "far-coder", "prompt": PREFIX, "suffix": SUFFIX})
    assert status == 200 and body["choices"][0]["message"]["content"] == "".join(MIDDLE), body
    status, body = post(outer, "/v1/completions", {"model": "far-coder", "prompt": PREFIX, "suffix": SUFFIX})
    assert status == 200 and body["choices"][0]["text"] == "".join(MIDDLE), body
    status, body = post(outer, "/api/generate", {"model": "far-coder", "prompt": PREFIX, "suffix": SUFFIX,
                                                 "stream": False})
    assert status == 200 and body["response"] == "".join(MIDDLE), body
    # the upstream's own refusal of a model without FIM tokens comes through, in the caller's shape
    status, body = post(outer, "/infill", {**infill, "model": "far-plain"})
    assert status == 400 and body["error"]["param"] == "input_suffix", body


@pytest.mark.slow
def test_an_upstream_without_infill_gets_the_suffix_on_completions(outer):
    _NoInfill.seen.clear()
    status, body = post(outer, "/v1/completions", {"model": "vllm-like", "prompt": PREFIX, "suffix": SUFFIX})
    assert status == 200 and body["choices"][0]["text"] == f"[{SUFFIX!r}]", body
    assert _NoInfill.seen[-1]["prompt"] == PREFIX and _NoInfill.seen[-1]["suffix"] == SUFFIX
    status, body = post(outer, "/infill", {"model": "vllm-like", "input_prefix": PREFIX, "input_suffix": SUFFIX,
                                           "input_extra": [{"filename": "a.py", "text": "b"}]})
    assert status == 501 and body["error"]["param"] == "input_extra", body
