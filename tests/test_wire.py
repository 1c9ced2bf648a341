"""Anthropic Messages, embeddings, tokenize/detokenize and structured output, on real workers."""

import base64
import json
import struct

import jsonschema
import pytest
from helpers import REPO, tiny_random_model
from openapi import validate
from workerevents import under_way

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

S = tm.Special
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("wire")
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    return d


@pytest.fixture(scope="module")
def random_model():
    """A small random-weight llama with llama.cpp's real 32k SentencePiece vocabulary (kept between runs)."""
    return tiny_random_model("llama-spm", seed=3)


@pytest.fixture
async def client(aiohttp_client, files, random_model, write_config):
    cfg = load_config(write_config(f"""
        models:
          thinker: {files}/thinker.gguf
          plain: {files}/plain.gguf
          loop: {files}/loop.gguf
          random: {random_model}
          embed:
            path: {random_model}
            embeddings: true
    """))
    return await aiohttp_client(create_app(cfg))


async def post(client, path, body):
    r = await client.post(path, json=body)
    return r.status, await r.json()


# --- Anthropic ---------------------------------------------------------------------------

async def test_messages_whole_with_a_thinking_block(client):
    status, body = await post(client, "/v1/messages", {"model": "thinker", "max_tokens": 50, "messages": HI})
    assert status == 200, body
    assert body["type"] == "message" and body["role"] == "assistant" and body["id"].startswith("msg_")
    assert body["content"] == [{"type": "thinking", "thinking": "Two and two.", "signature": ""},
                               {"type": "text", "text": "It is 4."}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    # <think>, Two, " and", " two.", </think>, It, " is", " 4."
    assert body["usage"]["output_tokens"] == 8 and body["usage"]["input_tokens"] > 0


@pytest.mark.parametrize("extra, reason, seq, text", [
    ({"max_tokens": 3}, "max_tokens", None, " tick tock tick"),
    ({"max_tokens": 50, "stop_sequences": ["k t", "zzz"]}, "stop_sequence", "k t", " tic"),
])
async def test_messages_stop_reasons(client, extra, reason, seq, text):
    status, body = await post(client, "/v1/messages", {"model": "loop", "messages": HI, **extra})
    assert (body["stop_reason"], body["stop_sequence"]) == (reason, seq)
    assert body["content"] == [{"type": "text", "text": text}]


async def test_messages_streamed_events(client):
    r = await client.post("/v1/messages", json={"model": "thinker", "max_tokens": 50, "messages": HI,
                                                "stream": True})
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = []
    name = None
    async for line in r.content:
        line = line.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
            assert data["type"] == name
            events.append(data)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    thinking = "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta"
                       and e["delta"]["type"] == "thinking_delta")
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == "text_delta")
    assert (thinking, text) == ("Two and two.", "It is 4.")
    assert events[-2]["delta"]["stop_reason"] == "end_turn" and events[-2]["usage"]["output_tokens"] == 8


async def test_messages_system_blocks_thinking_history_and_disabled_thinking(client):
    status, body = await post(client, "/v1/messages", {
        "model": "plain", "max_tokens": 20, "system": [{"type": "text", "text": "be brief"}],
        "thinking": {"type": "disabled"}, "metadata": {"user_id": "u"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                                       {"type": "text", "text": "a"}]},
                     {"role": "user", "content": "again"}]})
    assert status == 200, body
    assert body["content"] == [{"type": "text", "text": "Hello, world!"}]


@pytest.mark.parametrize("body, needle", [
    ({"model": "plain", "messages": HI}, "max_tokens: Field required"),
    ({"model": "plain", "max_tokens": 5, "messages": HI, "temperature": 1.5}, "temperature"),
    ({"model": "plain", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"model": "plain", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "messages.0.content.0.source"),
    ({"model": "plain", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
     "messages.0.content.0.type"),
    ({"model": "plain", "max_tokens": 5, "messages": HI, "tools": [{"name": "f"}]}, "tools"),
    ({"model": "plain", "max_tokens": 5, "messages": HI, "stop_sequences": "x"}, "stop_sequences"),
])
async def test_messages_errors_in_anthropic_shape(client, body, needle):
    status, out = await post(client, "/v1/messages", body)
    assert status == 400
    assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    assert needle in out["error"]["message"]


async def test_messages_unknown_model_and_bad_json(client):
    status, out = await post(client, "/v1/messages", {"model": "nope", "max_tokens": 5, "messages": HI})
    assert status == 404 and out == {"type": "error", "error": {"type": "not_found_error",
                                                                "message": out["error"]["message"]}}
    r = await client.post("/v1/messages", data=b"{", headers={"Content-Type": "application/json"})
    assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"


async def test_count_tokens(client):
    status, body = await post(client, "/v1/messages/count_tokens", {"model": "plain", "messages": HI})
    _, whole = await post(client, "/v1/messages", {"model": "plain", "max_tokens": 5, "messages": HI})
    usage = whole["usage"]  # Anthropic's count: tokens read afresh plus those read from the cache
    assert status == 200 and body == {"input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"]}


# --- embeddings ----------------------------------------------------------------------------

@pytest.mark.parametrize("inputs, n", [("one text", 1), (["a", "b c", "d"], 3), ([1, 2, 3], 1), ([[1, 2], [3]], 2)])
async def test_embeddings_one_normalized_vector_per_input(client, inputs, n):
    status, body = await post(client, "/v1/embeddings", {"model": "embed", "input": inputs})
    assert status == 200, body
    validate(body, "CreateEmbeddingResponse")
    assert [d["index"] for d in body["data"]] == list(range(n))
    for d in body["data"]:
        assert len(d["embedding"]) == 64
        assert abs(sum(x * x for x in d["embedding"]) - 1) < 1e-4
    assert body["usage"]["prompt_tokens"] > 0


async def test_embeddings_differ_by_input_and_base64_decodes_to_the_same(client):
    _, body = await post(client, "/v1/embeddings", {"model": "embed", "input": ["cats", "quantum physics"]})
    a, b = (d["embedding"] for d in body["data"])
    assert a != b
    _, enc = await post(client, "/v1/embeddings", {"model": "embed", "input": ["cats"], "encoding_format": "base64"})
    raw = base64.b64decode(enc["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert all(abs(x - y) < 1e-6 for x, y in zip(decoded, a))


async def test_501_for_the_wrong_kind_of_model(client):
    status, body = await post(client, "/v1/embeddings", {"model": "plain", "input": "x"})
    assert status == 501 and body["error"]["param"] == "model"
    status, body = await post(client, "/v1/chat/completions", {"model": "embed", "messages": HI})
    assert status == 501
    status, body = await post(client, "/v1/messages", {"model": "embed", "max_tokens": 5, "messages": HI})
    assert status == 501 and body["type"] == "error"


@pytest.mark.parametrize("body, param", [
    ({"model": "embed"}, "input"), ({"model": "embed", "input": []}, "input"),
    ({"model": "embed", "input": [1, "a"]}, "input"), ({"model": "embed", "input": "x", "encoding_format": "hex"},
                                                        "encoding_format"),
    ({"model": "embed", "input": [10 ** 9]}, "input"),
])
async def test_bad_embedding_requests(client, body, param):
    status, out = await post(client, "/v1/embeddings", body)
    assert status == 400 and out["error"]["param"] == param, out


# --- tokenize / detokenize -------------------------------------------------------------------

async def test_tokenize_and_detokenize_round_trip(client):
    for prefix in ("", "/v1"):
        status, body = await post(client, f"{prefix}/tokenize", {"model": "random", "content": "Hello world"})
        assert status == 200 and body["tokens"] == [15043, 3186]  # llama's SentencePiece ids
        _, with_bos = await post(client, "/tokenize", {"model": "random", "content": "Hello world", "add_special": True})
        assert with_bos["tokens"] == [1, 15043, 3186]
        _, pieces = await post(client, "/tokenize", {"model": "random", "content": "Hello world", "with_pieces": True})
        assert pieces["tokens"] == [{"id": 15043, "piece": " Hello"}, {"id": 3186, "piece": " world"}]
        status, body = await post(client, f"{prefix}/detokenize", {"model": "random", "tokens": [15043, 3186]})
        assert status == 200 and body == {"content": "Hello world"}
    status, body = await post(client, "/detokenize", {"model": "random", "tokens": [99999999]})
    assert status == 400 and body["error"]["param"] == "tokens"


# --- structured output ---------------------------------------------------------------------

# Bounds on non-integer numbers are not enforced by the grammar, so the schema holds only what
# a grammar can enforce (integer bounds included).
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "ok", "color", "tags"],
          "properties": {"answer": {"type": "integer", "minimum": -5, "maximum": 40}, "ok": {"type": "boolean"},
                         "color": {"enum": ["red", "green", "blue"]},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_json_schema_on_a_random_weight_model_gives_valid_json(client, seed):
    status, body = await post(client, "/v1/chat/completions", {
        "model": "random", "messages": HI, "max_tokens": 200, "seed": seed, "temperature": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMA)


async def test_json_object_and_gbnf_grammar(client):
    status, body = await post(client, "/v1/chat/completions", {
        "model": "random", "messages": HI, "max_tokens": 300, "seed": 5, "response_format": {"type": "json_object"}})
    assert status == 200
    text = body["choices"][0]["message"]["content"]
    if body["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), (dict, list))
    else:  # a random model may write a long string; whatever it wrote so far is JSON's start
        assert text.lstrip()[:1] in "{["
    status, body = await post(client, "/v1/completions", {
        "model": "random", "prompt": "Answer:", "max_tokens": 10, "grammar": 'root ::= ("yes" | "no") "."'})
    assert status == 200 and body["choices"][0]["text"] in ("yes.", "no.")


@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"grammar": "root ::= [unclosed"}, "grammar"),
    ({"grammar": 5}, "grammar"),
])
async def test_bad_structured_output_requests(client, body, param):
    status, out = await post(client, "/v1/chat/completions", {"model": "random", "messages": HI, **body})
    assert status == 400 and out["error"]["param"] == param, out


@pytest.fixture(scope="module")
def bench_model():
    """The benchmark model (81M random-weight llama, Qwen2's 152k vocabulary), kept between runs."""
    path = REPO / ".cache" / "models" / "random-qwen2-81m.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tm.write_random_model(path.with_suffix(".part"), tm.find_vocab("qwen2", cache_dir=REPO / ".cache" / "vocab"))
        path.with_suffix(".part").replace(path)
    return path


async def test_json_schema_on_the_benchmark_model(aiohttp_client, bench_model, write_config):
    cfg = load_config(write_config(f"models:\n  bench:\n    path: {bench_model}\n    n_ctx: 1024\n"))
    client = await aiohttp_client(create_app(cfg))
    status, body = await post(client, "/v1/chat/completions", {
        "model": "bench", "messages": HI, "max_tokens": 200, "seed": 7, "temperature": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}})
    assert status == 200, body
    assert body["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMA)


async def test_anthropic_stream_ends_with_an_error_event_when_the_worker_dies(aiohttp_client, files, write_config):
    import os
    import signal

    from gateway.app import REGISTRY

    client = await aiohttp_client(create_app(load_config(write_config(f"models:\n  loop: {files}/loop.gguf\n"))))
    r = await client.post("/v1/messages", json={"model": "loop", "max_tokens": 100000 // 30, "messages": HI,
                                                "stream": True})
    await under_way(r)
    os.kill(client.app[REGISTRY].loaded()["loop"].proc.pid, signal.SIGKILL)
    text = (await r.read()).decode()
    last = [line for line in text.splitlines() if line.startswith("event: ")][-1]
    assert last == "event: error" and '"type":"api_error"' in text and "exited unexpectedly" in text
