"""The real `gguf-gateway serve` process, driven by the official openai SDK."""

import os
import signal

import openai
import pytest
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("sdk")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    tm.utf8_split(d / "utf8.gguf", "naïve 日本 🙂")
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  models_dirs: [{d}]\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv
    # ServerProcess.__exit__ sent SIGTERM; a clean exit is part of the contract
    assert srv.proc.returncode == 0


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models(client):
    assert sorted(m.id for m in client.models.list()) == ["loop", "plain", "thinker", "utf8"]


def test_chat_whole(client):
    r = client.chat.completions.create(model="plain", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello, world!"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 4


def test_chat_streamed(client):
    stream = client.chat.completions.create(model="utf8", messages=[{"role": "user", "content": "hi"}],
                                            stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == "naïve 日本 🙂" and finish == "stop"
    assert usage.completion_tokens == len("naïve 日本 🙂".encode())  # each word is spelled in bytes
    assert usage.prompt_tokens > 0


def test_reasoning_whole_and_streamed(client):
    r = client.chat.completions.create(model="thinker", messages=[{"role": "user", "content": "2+2?"}])
    message = r.choices[0].message
    assert message.content == "It is 4."
    assert message.model_extra["reasoning_content"] == message.model_extra["reasoning"] == "Two and two."
    assert r.usage.completion_tokens_details.reasoning_tokens == 4  # <think>, Two, " and", " two."
    thinking = content = ""
    for chunk in client.chat.completions.create(model="thinker", messages=[{"role": "user", "content": "2+2?"}],
                                                stream=True):
        delta = chunk.choices[0].delta
        thinking += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert (thinking, content) == ("Two and two.", "It is 4.")


def test_text_completion_whole_and_streamed(client):
    r = client.completions.create(model="loop", prompt="go\n", max_tokens=4)
    assert r.choices[0].text == " tick tock tick tock" and r.choices[0].finish_reason == "length"
    parts = [c.choices[0].text for c in client.completions.create(model="plain", prompt="go\n", stream=True)]
    assert "".join(parts) == "Hello, world!"


def test_errors_come_back_as_sdk_exceptions(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="plain", messages=[{"role": "user", "content": "hi"}], n=3)
    assert e.value.param == "n"


def test_a_killed_worker_surfaces_as_an_api_error_mid_stream(client, server):
    stream = client.chat.completions.create(model="loop", messages=[{"role": "user", "content": "hi"}], stream=True)
    it = iter(stream)
    next(it)
    _, health = server.get("/health")
    os.kill(health["workers"]["loop"], signal.SIGKILL)
    with pytest.raises(openai.APIError, match="exited unexpectedly"):
        for _ in it:
            pass
    r = client.chat.completions.create(model="plain", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello, world!"

