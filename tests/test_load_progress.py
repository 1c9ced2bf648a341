"""Load progress, from llama.cpp's callback to the client: the worker passes llama.cpp's reports
on, and a streamed request that waits for a load hears ``: loading N%`` comment lines, which
the official clients skip; a load that fails after that is told in the stream's own wire shape.

The waits here are real: ``max_loaded_models: 1`` and an endless answer on another model hold
the one place, so a request for a second model waits in its load (making room) until the
endless answer's client leaves."""

import contextlib
import http.client
import json
import threading
import time
import urllib.request

import anthropic
import openai
import pytest
from helpers import ServerProcess

from gateway.backends.local import start_local
from gateway.models import testmodels as tm
from gateway.models.config import ModelSpec, ServerConfig

HI = [{"role": "user", "content": "hi"}]


async def test_the_worker_passes_llama_cpps_load_reports_on(tmp_path):
    tm.plain(tmp_path / "p.gguf")
    seen: list[float] = []
    backend = await start_local(ModelSpec("p", tmp_path / "p.gguf"), ServerConfig(), on_exit=lambda b, e: None,
                                on_busy=lambda: None, on_progress=seen.append)
    try:
        assert len(seen) >= 2 and seen[0] < 1.0 and seen[-1] == 1.0, seen
        assert seen == sorted(seen) and all(0.0 <= f <= 1.0 for f in seen)
    finally:
        await backend.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf")
    good = (d / "plain.gguf").read_bytes()
    for name in ("broken1", "broken2", "broken3"):  # a header the gateway reads, weights llama.cpp refuses
        (d / f"{name}.gguf").write_bytes(good.replace(b"llama", b"zzzzz"))
    cfg = d / "models.yaml"
    # loop's context is long enough that its endless answer outlasts each test's wait
    cfg.write_text(f"server:\n  models_dirs: [{d}]\n  discover_default_stores: false\n  max_loaded_models: 1\n"
                   f"models:\n  loop:\n    path: {d / 'loop.gguf'}\n    n_ctx: 131072\n    parallel: 1\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv
    assert srv.proc.returncode == 0


@contextlib.contextmanager
def holding(server):
    """An endless streamed answer on ``loop``, the one loaded model, until the block ends."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": "loop", "messages": HI, "stream": True}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    while not response.readline().startswith(b"data: "):  # generating
        pass
    try:
        yield
        row = next(m for m in server.get("/models")[1]["data"] if m["id"] == "loop")
        assert row["in_flight"] == 1, "the endless answer ended before the test was done with it"
    finally:
        conn.close()  # the client leaves: the answer stops and the place is free


def waiting_for(server, name: str, timeout: float = 10.0) -> dict:
    """``name``'s /models row once a request has waited in its load for a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = next(m for m in server.get("/models")[1]["data"] if m["id"] == name)
        if row["state"] == "loading" and row["queued"] >= 1:
            time.sleep(1.2)  # past the supervisor's PROGRESS_AFTER: the stream is open
            return row
        time.sleep(0.05)
    raise AssertionError(f"no request waited for {name}")


def in_thread(fn):
    result: dict = {}

    def run():
        try:
            result["value"] = fn()
        except Exception as e:  # handed to the test
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, result


@pytest.mark.slow
def test_a_waiting_stream_hears_the_loads_progress_then_its_answer(server):
    with holding(server):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": "plain", "messages": HI, "stream": True}),
                     {"Content-Type": "application/json"})
        row = waiting_for(server, "plain")
        assert row["progress"] == 0.0 and row["queued"] == 1  # making room: nothing read yet
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
        assert 'gguf_gateway_model_load_progress{model="plain"} 0.0' in metrics
        assert 'gguf_gateway_model_load_progress{model="loop"} 1.0' in metrics
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
        assert response.readline() == b": loading 0%\n"
    lines = [line.decode().rstrip("\n") for line in response.readlines()]
    conn.close()
    told = [int(line[len(": loading "):-1]) for line in lines if line.startswith(": loading ")]
    assert told == sorted(told) and all(0 <= n <= 100 for n in told)
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello, world!"
    assert lines[-2:] == ["data: [DONE]", ""]
    row = next(m for m in server.get("/models")[1]["data"] if m["id"] == "plain")
    assert row["state"] == "ready" and row["progress"] is None


@pytest.mark.slow
def test_the_openai_client_skips_the_progress_lines(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with holding(server):
        t, result = in_thread(lambda: "".join(
            c.choices[0].delta.content or "" for c in
            client.chat.completions.create(model="plain", messages=HI, stream=True) if c.choices))
        waiting_for(server, "plain")
    t.join(30)
    assert result == {"value": "Hello, world!"}


@pytest.mark.slow
def test_a_load_that_fails_after_the_stream_opened_is_an_in_band_error(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with holding(server):
        t, result = in_thread(lambda: list(client.chat.completions.create(model="broken1", messages=HI, stream=True)))
        waiting_for(server, "broken1")
    t.join(30)
    err = result["error"]
    assert isinstance(err, openai.APIError) and "could not load" in err.message, result
    assert err.body["code"] == "model_load_failed" and err.body["param"] == "model"
    assert server.get("/health")[0] == 200


@pytest.mark.slow
def test_anthropics_client_gets_its_error_event(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)

    def ask():
        with client.messages.stream(model="broken2", max_tokens=8, messages=HI) as stream:
            return stream.get_final_text()

    with holding(server):
        t, result = in_thread(ask)
        waiting_for(server, "broken2")
    t.join(30)
    err = result["error"]
    assert isinstance(err, anthropic.APIError) and "could not load" in str(err), result
    assert err.body["error"]["type"] == "overloaded_error"  # a 503, as when no stream had opened


@pytest.mark.slow
def test_the_responses_stream_fails_as_a_response(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with holding(server):
        t, result = in_thread(lambda: list(client.responses.create(model="broken3", input="hi", stream=True)))
        waiting_for(server, "broken3")
    t.join(30)
    events = result["value"]
    assert [e.type for e in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    assert events[-1].response.status == "failed" and "could not load" in events[-1].response.error.message


@pytest.mark.slow
def test_a_load_that_does_not_wait_is_told_nothing(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", json.dumps({"model": "plain", "messages": HI, "stream": True}),
                 {"Content-Type": "application/json"})
    body = conn.getresponse().read().decode()
    conn.close()
    assert ": loading" not in body and body.endswith("data: [DONE]\n\n")
