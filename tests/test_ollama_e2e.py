"""Ollama's API on the real `gguf-gateway serve` process, driven by the official `ollama` Python
client: chat and generate whole and streamed, thinking, tool calls, embeddings, the model
listings, keep_alive, and errors in Ollama's own shape."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import ollama
import pytest
from helpers import WEATHER, ServerProcess, agent_model, free_port, noise_picture

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("ollama")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    tm.plain(d / "emb.gguf", ["x", "y"])
    agent_model(d / "agent.gguf")
    cfg = d / "models.yaml"
    port = free_port()
    cfg.write_text(f"server:\n  discover_default_stores: false\n  ollama_port: {port}\nmodels:\n"
                   f"  plain: {d}/plain.gguf\n  thinker: {d}/thinker.gguf\n  loop: {d}/loop.gguf\n"
                   f"  agent: {d}/agent.gguf\n  emb:\n    path: {d}/emb.gguf\n    embeddings: true\n")
    with ServerProcess("--config", str(cfg)) as srv:
        srv.ollama_port = port
        yield srv


@pytest.fixture
def client(server):
    with ollama.Client(host=server.url) as c:
        yield c


def test_chat_whole_and_streamed(client):
    r = client.chat(model="plain", messages=ASK, stream=False)
    assert r.message.role == "assistant" and r.message.content == "Hello, world!"
    assert r.done and r.done_reason == "stop" and r.eval_count == 4 and r.prompt_eval_count > 0
    assert r.total_duration >= r.eval_duration > 0
    parts = list(client.chat(model="plain", messages=ASK, stream=True))
    assert "".join(p.message.content for p in parts) == "Hello, world!" and len(parts) >= 5
    assert [p.done for p in parts][-1] and not any(p.done for p in parts[:-1])


def test_generate_whole_streamed_and_raw(client):
    r = client.generate(model="plain", prompt="2+2?", stream=False)
    assert r.response == "Hello, world!" and r.done_reason == "stop"
    assert "".join(p.response for p in client.generate(model="plain", prompt="hi", stream=True)) == "Hello, world!"
    raw = client.generate(model="loop", prompt="Say\n", raw=True, options={"num_predict": 4}, stream=False)
    assert raw.response == " tick tock tick tock" and raw.done_reason == "length" and raw.eval_count == 4


def test_thinking_comes_apart_from_the_answer(client):
    r = client.chat(model="thinker", messages=ASK, think=True, stream=False)
    assert r.message.thinking == "Two and two." and r.message.content == "It is 4."
    parts = list(client.chat(model="thinker", messages=ASK, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Two and two."
    assert "".join(p.message.content for p in parts) == "It is 4."
    g = client.generate(model="thinker", prompt="2+2?", stream=False)
    assert g.thinking == "Two and two." and g.response == "It is 4."


def test_tool_calls_round_trip(client):
    first = client.chat(model="agent", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
                        stream=False)
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    history = [{"role": "user", "content": "Weather?"}, first.message,
               {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]
    second = client.chat(model="agent", messages=history, tools=[WEATHER], stream=False)
    assert second.message.content == "It is 18 C."
    streamed = [p for p in client.chat(model="agent", messages=[{"role": "user", "content": "Weather?"}],
                                       tools=[WEATHER], stream=True) if p.message.tool_calls]
    assert len(streamed) == 1 and streamed[0].message.tool_calls[0].function.arguments == {"city": "Paris"}


def test_embeddings_both_routes(client):
    r = client.embed(model="emb", input=["one", "two"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 64 and r.prompt_eval_count > 0
    legacy = client.embeddings(model="emb", prompt="one")
    assert legacy.embedding == pytest.approx(r.embeddings[0])


def test_listings_show_and_version(client):
    names = {m.model for m in client.list().models}
    assert {"plain:latest", "thinker:latest", "emb:latest"} <= names
    client.chat(model="plain", messages=ASK, stream=False)
    loaded = {m.model: m for m in client.ps().models}
    assert "plain:latest" in loaded and loaded["plain:latest"].expires_at is not None
    shown = client.show("agent")
    assert "tools" in shown.capabilities and "completion" in shown.capabilities
    assert shown.details.format == "gguf" and shown.modelinfo["general.architecture"] == "llama"
    assert "<tool_call>" in shown.template
    client.chat(model="thinker", messages=ASK, stream=False)  # loaded: its vocabulary's <think> shows
    assert "thinking" in client.show("thinker").capabilities and client.show("emb").capabilities == ["embedding"]
    assert "thinking" not in client.show("plain").capabilities
    assert client.ps() is not None


def test_version_and_a_bad_field_over_plain_http(server):
    with urllib.request.urlopen(server.url + "/api/version") as r:
        assert json.loads(r.read())["version"]
    req = urllib.request.Request(server.url + "/api/chat", method="POST", data=json.dumps(
        {"model": "plain", "messages": ASK, "format": "yaml"}).encode())
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and json.loads(e.value.read()) == {
        "error": "format must be \"json\" or a JSON schema object, got 'yaml'"}


def test_keep_alive_zero_unloads(client):
    client.generate(model="loop", prompt="Say\n", options={"num_predict": 1}, stream=False)
    assert "loop:latest" in {m.model for m in client.ps().models}
    client.generate(model="loop", prompt="", keep_alive=0)
    deadline = time.monotonic() + 10
    while "loop:latest" in {m.model for m in client.ps().models} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "loop:latest" not in {m.model for m in client.ps().models}
    client.generate(model="plain", prompt="", keep_alive=1e308)  # kept for good: /api/ps still answers
    assert "plain:latest" in {m.model for m in client.ps().models}
    loaded = client.generate(model="plain", prompt="")  # an empty prompt loads the model
    assert loaded.done_reason == "load"
    assert client.chat(model="loop", messages=[]).done_reason == "load"  # and so do no messages
    assert "loop:latest" in {m.model for m in client.ps().models}
    assert client.chat(model="loop", messages=[], keep_alive=0).done_reason == "unload"


@pytest.mark.parametrize("call, status, words", [
    (lambda c: c.chat(model="nope", messages=ASK, stream=False), 404, "does not exist"),
    (lambda c: c.chat(model="plain", messages=[{"role": "user", "content": "hi", "images": [noise_picture(1)]}],
                      stream=False), 400, "does not take images"),
    (lambda c: c.chat(model="plain", messages=[{"role": "user", "content": "hi", "images": ["aGk="]}],
                      stream=False), 400, "is not an image this server reads"),
    (lambda c: c.chat(model="plain", messages=ASK, options={"temperature": "hot"}, stream=False), 400,
     "options.temperature"),
    (lambda c: c.generate(model="plain", prompt="hi", keep_alive="soon", stream=False), 400, "keep_alive"),
    (lambda c: c.embed(model="plain", input="x"), 501, "cannot embed"),
    (lambda c: c.pull("llama3.2"), 501, "discover_default_stores is false"),  # no store to pull into
    (lambda c: c.delete("plain"), 409, "not a model the gateway pulled"),  # models.yaml's entry
    (lambda c: c.delete("nope"), 404, "no pulled model"),
    (lambda c: c.pull("../x"), 400, "neither a Hugging Face repo"),
])
def test_errors_in_ollamas_shape(client, call, status, words):
    with pytest.raises(ollama.ResponseError) as e:
        call(client)
    assert e.value.status_code == status and words in e.value.error


def test_the_same_gateway_answers_on_ollamas_port(server):
    with ollama.Client(host=f"http://127.0.0.1:{server.ollama_port}") as c:
        assert "plain:latest" in {m.model for m in c.list().models}
        assert c.chat(model="plain", messages=ASK, stream=False).message.content == "Hello, world!"
