"""The real `gguf-gateway serve` process, driven by the official anthropic SDK (and openai's for embeddings)."""

import anthropic
import openai
import pytest
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("anthropic")
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    tm.plain(d / "emb.gguf", ["x", "y"])
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys: [sekrit]\nmodels:\n"
                   f"  thinker: {d}/thinker.gguf\n  loop: {d}/loop.gguf\n"
                   f"  emb:\n    path: {d}/emb.gguf\n    embeddings: true\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with anthropic.Anthropic(base_url=server.url, api_key="sekrit", max_retries=0) as c:
        yield c


def test_whole_message_with_thinking(client):
    msg = client.messages.create(model="thinker", max_tokens=64, messages=[{"role": "user", "content": "2+2?"}])
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Two and two." and msg.content[1].text == "It is 4."
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens == 8


def test_streaming_helper_assembles_the_same_message(client):
    with client.messages.stream(model="thinker", max_tokens=64, messages=[{"role": "user", "content": "2+2?"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "It is 4."
    assert final.content[0].type == "thinking" and final.content[0].thinking == "Two and two."
    assert final.content[1].text == "It is 4." and final.stop_reason == "end_turn"


@pytest.mark.parametrize("kwargs, reason, seq, text", [
    ({"max_tokens": 4}, "max_tokens", None, " tick tock tick tock"),
    ({"max_tokens": 64, "stop_sequences": ["tock"]}, "stop_sequence", "tock", " tick "),
])
def test_stop_reasons_whole_and_streamed(client, kwargs, reason, seq, text):
    msg = client.messages.create(model="loop", messages=[{"role": "user", "content": "go"}], **kwargs)
    assert (msg.stop_reason, msg.stop_sequence, msg.content[0].text) == (reason, seq, text)
    with client.messages.stream(model="loop", messages=[{"role": "user", "content": "go"}], **kwargs) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == (reason, seq, text)


def test_errors_are_sdk_exceptions(client, server):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="missing", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        with anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as bad:
            bad.messages.create(model="thinker", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    count = client.messages.count_tokens(model="thinker", messages=[{"role": "user", "content": "2+2?"}])
    assert count.input_tokens > 0


def test_embeddings_through_the_openai_sdk(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sekrit", max_retries=0) as c:
        r = c.embeddings.create(model="emb", input=["one", "two", "three"])
        assert len(r.data) == 3 and all(len(d.embedding) == 64 for d in r.data)  # the model's width
        b64 = c.embeddings.create(model="emb", input="one")  # the SDK asks for base64 and decodes it
        assert len(b64.data[0].embedding) == 64
