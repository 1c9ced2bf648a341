"""/v1/chat/completions and /v1/completions on real llama.cpp workers running scripted models."""

import asyncio
import contextlib
import json
import os
import signal

import pytest
from openapi import validate, validate_completion_chunk
from workerevents import record_events, until

from gateway.app import REGISTRY, create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

HI = [{"role": "user", "content": "hi"}]
UTF8_TOKENS = 1 + 6 + 7 + 7 + 5  # "Price:" is one token; every other word is spelled in bytes
TRIGGER_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if shout %}?{% else %}\n{% endif %}"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen-models")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.plain(d / "stopper.gguf", ["Hel", "lo", " wor", "ld", "!", " Bye", "."])
    assert tm.utf8_split(d / "utf8.gguf", "Price: 5€, naïve 日本 🙂").n_tokens() == UTF8_TOKENS
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    tm.write_scripted_model(d / "triggers.gguf", [tm.Script(["normal", " path"]),
                                                 tm.Script(["kwarg", " path"], trigger="?")])
    return d


@pytest.fixture
def config(models, write_config):
    return load_config(write_config(f"""
        server:
          models_dirs: []
        models:
          plain: {models}/plain.gguf
          stopper: {models}/stopper.gguf
          utf8: {models}/utf8.gguf
          loop:
            path: {models}/loop.gguf
            n_ctx: 8192
          capped:
            path: {models}/loop.gguf
            n_ctx: 256
            defaults:
              max_tokens: 3
          triggers:
            path: {models}/triggers.gguf
            chat_template: {json.dumps(TRIGGER_TEMPLATE)}
    """))


@pytest.fixture
async def client(aiohttp_client, config):
    return await aiohttp_client(create_app(config), server_kwargs={"handler_cancellation": True})


async def chat(client, **body):
    body.setdefault("messages", HI)
    r = await client.post("/v1/chat/completions", json=body)
    return r.status, await r.json()


async def sse_events(resp):
    """Every ``data:`` payload of an SSE response, parsed (``[DONE]`` kept as a string)."""
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = []
    async for line in resp.content:
        line = line.decode().rstrip("\n")
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def stream_chat(client, **body):
    body.setdefault("messages", HI)
    r = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status == 200, await r.text()
    return await sse_events(r)


def chunk_text(events):
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])


# --- whole and streamed answers ----------------------------------------------------------

async def test_chat_whole_answer_is_exact_and_schema_valid(client):
    status, body = await chat(client, model="plain")
    assert status == 200, body
    validate(body, "CreateChatCompletionResponse")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "plain"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello, world!", "refusal": None}
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 4


@pytest.mark.parametrize("model", ["plain", "stopper", "utf8", "triggers"])
async def test_streamed_text_equals_the_whole_answer(client, model):
    _, whole = await chat(client, model=model)
    events = await stream_chat(client, model=model, stream_options={"include_usage": True})
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    for e in chunks + [usage_chunk]:
        validate(e, "CreateChatCompletionStreamResponse")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [e["choices"][0]["finish_reason"] for e in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert len({e["id"] for e in chunks + [usage_chunk]}) == 1 and chunks[0]["id"] != whole["id"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    # the same prompt again: all of it but the last token comes from the slot's cache
    cached = usage_chunk["usage"].pop("prompt_tokens_details")["cached_tokens"]
    whole["usage"].pop("prompt_tokens_details")
    assert cached == whole["usage"]["prompt_tokens"] - 1
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole["usage"]


async def test_without_include_usage_there_is_no_usage_chunk(client):
    events = await stream_chat(client, model="plain")
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_content_as_text_parts(client):
    _, body = await chat(client, model="plain", messages=[
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}])
    assert body["choices"][0]["message"]["content"] == "Hello, world!"


# --- stop strings, UTF-8, length ----------------------------------------------------------

@pytest.mark.parametrize("stop, text", [
    ("o w", "Hell"),                 # across the "lo" | " wor" token boundary
    (["ld!", "xyz"], "Hello wor"),
    (["Bye", "wor"], "Hello "),      # the earliest match wins
    ("!", "Hello world"),
    ("nothing like it", "Hello world! Bye."),
])
async def test_stop_strings_across_tokens_never_leak(client, stop, text):
    _, whole = await chat(client, model="stopper", stop=stop)
    assert whole["choices"][0]["message"]["content"] == text
    assert whole["choices"][0]["finish_reason"] == "stop"
    events = await stream_chat(client, model="stopper", stop=stop)
    assert chunk_text(events) == text


async def test_utf8_split_over_byte_tokens_comes_out_whole(client):
    events = await stream_chat(client, model="utf8")
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
    assert "".join(pieces) == "Price: 5€, naïve 日本 🙂"
    assert not any("\ufffd" in p for p in pieces)
    _, whole = await chat(client, model="utf8")
    assert whole["usage"]["completion_tokens"] == UTF8_TOKENS


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_length_at_max_tokens_with_the_exact_count(client, field):
    _, body = await chat(client, model="loop", **{field: 7})
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == " tick tock tick tock tick tock tick"
    assert body["usage"]["completion_tokens"] == 7
    events = await stream_chat(client, model="loop", max_tokens=3)
    assert chunk_text(events) == " tick tock tick"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


async def test_models_yaml_defaults_fill_what_the_request_leaves_out(client):
    _, body = await chat(client, model="capped")
    assert body["usage"]["completion_tokens"] == 3
    _, body = await chat(client, model="capped", max_tokens=5)
    assert body["usage"]["completion_tokens"] == 5


async def test_sampling_fields_are_honoured_and_scripts_survive_them(client):
    _, body = await chat(client, model="plain", temperature=1.5, top_p=0.5, top_k=3, min_p=0.1, seed=7,
                         presence_penalty=0.5, frequency_penalty=0.5, repeat_penalty=1.1, user="u1")
    assert body["choices"][0]["message"]["content"] == "Hello, world!"
    _, body = await chat(client, model="plain", temperature=0)
    assert body["choices"][0]["message"]["content"] == "Hello, world!"


# --- chat template ---------------------------------------------------------------------

async def test_per_model_template_and_chat_template_kwargs(client):
    _, body = await chat(client, model="triggers")
    assert body["choices"][0]["message"]["content"] == "normal path"
    _, body = await chat(client, model="triggers", chat_template_kwargs={"shout": True})
    assert body["choices"][0]["message"]["content"] == "kwarg path"


async def test_template_exception_is_the_callers_400(aiohttp_client, models, write_config):
    tmpl = "{{ raise_exception('Conversation roles must alternate') }}"
    cfg = load_config(write_config(f"models:\n  m:\n    path: {models}/plain.gguf\n    chat_template: \"{tmpl}\"\n"))
    client = await aiohttp_client(create_app(cfg))
    status, body = await chat(client, model="m")
    assert status == 400 and body["error"]["param"] == "messages"
    assert "Conversation roles must alternate" in body["error"]["message"]


# --- /v1/completions ---------------------------------------------------------------------

async def test_completions_with_text_and_token_prompts(client):
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": "Say it\n", "max_tokens": 50})
    body = await r.json()
    validate(body, "CreateCompletionResponse")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == "Hello, world!"
    # the same prompt as ids: bos, then byte tokens ("S" is <0x53> = 3 + 0x53 under bos/eos/... ids)
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": [1, 3 + 2 + 0x0A], "max_tokens": 50})
    body = await r.json()
    assert r.status == 200, body
    assert body["usage"]["prompt_tokens"] == 2


async def test_completions_default_max_tokens_is_16_and_streams(client):
    r = await client.post("/v1/completions", json={"model": "loop", "prompt": "go\n"})
    body = await r.json()
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": "go\n", "stream": True,
                                                   "stream_options": {"include_usage": True}})
    events = await sse_events(r)
    assert events[-1] == "[DONE]"
    for e in events[:-2]:
        validate_completion_chunk(e)
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    validate(events[-3], "CreateCompletionResponse")
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == "Hello, world!"
    assert events[-2]["usage"]["completion_tokens"] == 4


# --- errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("body, status, param", [
    ({"model": "nope", "messages": HI}, 404, "model"),
    ({"messages": HI}, 400, "model"),
    ({"model": "plain"}, 400, "messages"),
    ({"model": "plain", "messages": []}, 400, "messages"),
    ({"model": "plain", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "plain", "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"model": "plain", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0].image_url"),
    ({"model": "plain", "messages": [{"role": "user", "content": [{"type": "video_url"}]}]}, 400,
     "messages[0].content[0].type"),
    ({"model": "plain", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}]}, 400,
     "messages[0].content[0]"),
    ({"model": "plain", "messages": HI, "n": 2}, 400, "n"),
    ({"model": "plain", "messages": HI, "temperature": "hot"}, 400, "temperature"),
    ({"model": "plain", "messages": HI, "temperature": 3}, 400, "temperature"),
    ({"model": "plain", "messages": HI, "top_p": -0.1}, 400, "top_p"),
    ({"model": "plain", "messages": HI, "top_k": 1.5}, 400, "top_k"),
    ({"model": "plain", "messages": HI, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "plain", "messages": HI, "max_completion_tokens": "9"}, 400, "max_completion_tokens"),
    ({"model": "plain", "messages": HI, "stop": 5}, 400, "stop"),
    ({"model": "plain", "messages": HI, "stop": ["x"] * 17}, 400, "stop"),
    ({"model": "plain", "messages": HI, "stream": "yes"}, 400, "stream"),
    ({"model": "plain", "messages": HI, "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage"),
    ({"model": "plain", "messages": HI, "seed": "x"}, 400, "seed"),
    ({"model": "plain", "messages": HI, "presence_penalty": 9}, 400, "presence_penalty"),
    ({"model": "plain", "messages": HI, "repeat_penalty": 0}, 400, "repeat_penalty"),
    ({"model": "plain", "messages": HI, "max_tokens": 100000}, 400, "messages"),
])
async def test_bad_requests_name_the_param(client, body, status, param):
    r = await client.post("/v1/chat/completions", json=body)
    out = await r.json()
    assert r.status == status, out
    validate(out, "ErrorResponse")
    assert out["error"]["param"] == param


async def test_context_overflow_gives_both_numbers(client):
    long = [{"role": "user", "content": "x" * 300}]
    status, body = await chat(client, model="capped", messages=long)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in body["error"]["message"]
    assert "requested 3" in body["error"]["message"]  # 300-odd prompt tokens + 3 (the model's default)
    r = await client.post("/v1/completions", json={"model": "capped", "prompt": "hi\n", "max_tokens": 300})
    body = await r.json()
    assert r.status == 400 and body["error"]["param"] == "prompt"
    assert "256 tokens" in body["error"]["message"] and "300 for the completion" in body["error"]["message"]


@pytest.mark.parametrize("raw", [b"{bad", b"", b"[1, 2]", b"\xff\xfe"])
async def test_bad_json_is_a_400(client, raw):
    r = await client.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    body = await r.json()
    assert r.status == 400 and body["error"]["code"] == "invalid_json"
    validate(body, "ErrorResponse")


@pytest.mark.parametrize("body, param", [
    ({"model": "plain", "prompt": 5}, "prompt"),
    ({"model": "plain", "prompt": ["a", 5]}, "prompt"),
    ({"model": "plain", "prompt": []}, "prompt"),
    ({"model": "plain", "prompt": [1, 10 ** 9]}, "prompt"),
    ({"model": "plain", "prompt": "x", "echo": "yes"}, "echo"),
    ({"model": "plain", "prompt": "x", "logprobs": 9}, "logprobs"),
    ({"model": "plain", "prompt": "x", "logprobs": 1, "echo": True}, "logprobs"),
    ({"model": "plain", "prompt": "x", "best_of": 3}, "best_of"),
    ({"model": "plain", "prompt": "x", "suffix": "y"}, "suffix"),  # a model without FIM tokens
    ({"model": "plain", "prompt": "x", "suffix": 5}, "suffix"),
])
async def test_bad_completion_requests(client, body, param):
    r = await client.post("/v1/completions", json=body)
    out = await r.json()
    assert r.status == 400 and out["error"]["param"] == param, out


async def test_unknown_fields_are_accepted(client):
    status, body = await chat(client, model="plain", logit_bias={}, parallel_tool_calls=False, metadata={"a": "b"},
                              store=False, service_tier="auto")
    assert status == 200, body


# --- disconnects, dead workers, the event loop ---------------------------------------------

# Tokens a worker may make once a cancel is in its pipe: its loop reads the pipe itself between two
# steps, so those of the step it was in (with speculation, its drafts too). A few beside the 8192
# the answer would otherwise run to, and beside what the worker made while the gateway noticed.
FEW = 128


@pytest.fixture
async def each_token_client(aiohttp_client, models, write_config):
    """The loop model with each token's event written at once (no ``stream_interval``): what the
    gateway has read is all the worker made, once its pipe is drained."""
    cfg = load_config(write_config(f"server:\n  models_dirs: []\n  stream_interval_ms: 0\n"
                                   f"models:\n  loop:\n    path: {models}/loop.gguf\n    n_ctx: 8192\n"))
    return await aiohttp_client(create_app(cfg), server_kwargs={"handler_cancellation": True})


def stopped(pid: int) -> bool:
    """Every thread of process ``pid`` is stopped (SIGSTOP)."""
    tasks = os.listdir(f"/proc/{pid}/task")
    states = []
    for t in tasks:
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return all(state in "tT" for state in states)


async def first_token(resp) -> dict:
    """Read a stream up to its first chunk with text: the model is loaded and generating (before
    it, the stream may carry ``: loading`` comments and the role's chunk)."""
    async for line in resp.content:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                return chunk
    raise AssertionError("the stream ended before its first token")


@pytest.mark.parametrize("stream", [True, False])
async def test_a_disconnect_stops_generation_within_a_few_tokens(each_token_client, stream, monkeypatch):
    """Counted in tokens, not in time: the worker is paused (SIGSTOP) while its client leaves and
    the gateway cancels the request, so what it made before the disconnect is all it wrote (read
    by the gateway before the cancel went out), and what it makes after it resumes is its
    answer to the cancel, however slow the machine."""
    client = each_token_client
    seen = record_events(monkeypatch)  # the worker's events, which no handler reads once its client left
    registry = client.app[REGISTRY]
    body = {"model": "loop", "messages": HI, "stream": stream}
    if stream:
        resp = await client.post("/v1/chat/completions", json=body)
        await first_token(resp)
    else:
        task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await seen.until(lambda: seen.made, "the answer's first token")
    worker = registry.loaded()["loop"].proc
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        await until(lambda: stopped(worker.pid), "the worker stopped")
        if stream:
            resp.close()
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        [rid] = await seen.until(lambda: seen.cancelled, "the gateway cancelled the request in its worker")
        made = seen.made[rid]
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    done = await seen.finished()
    assert (done.id, done.finish_reason) == (rid, "cancelled")
    assert made <= done.completion_tokens <= made + FEW, (made, done.completion_tokens)
    # the next request on the same model starts at once and completes
    _, body = await chat(client, model="loop", max_tokens=2)
    assert body["choices"][0]["message"]["content"] == " tick tock"


async def test_a_killed_worker_ends_its_stream_with_an_error_and_the_gateway_keeps_serving(client):
    resp = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True})
    await first_token(resp)  # the worker is running the answer
    registry = client.app[REGISTRY]
    os.kill(registry.loaded()["loop"].proc.pid, signal.SIGKILL)
    events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    error, final = events[-2], events[-3]
    assert final["choices"][0]["finish_reason"] == "error"
    assert error["error"]["code"] == "worker_crashed" and "exited unexpectedly" in error["error"]["message"]
    _, body = await chat(client, model="plain")
    assert body["choices"][0]["message"]["content"] == "Hello, world!"
    _, body = await chat(client, model="loop", max_tokens=2)  # reloads
    assert body["choices"][0]["message"]["content"] == " tick tock"
    assert registry.worker_failures == 1
    health = await (await client.get("/health")).json()
    assert health["worker_failures"] == 1


def generating(registry, name: str) -> bool:
    """Model ``name`` is loaded and has a request in its worker."""
    return name in registry.loaded() and bool(registry.loaded()[name].in_flight)


async def test_a_killed_worker_fails_a_whole_answer_with_a_5xx(client):
    task = asyncio.create_task(chat(client, model="loop"))
    registry = client.app[REGISTRY]
    await until(lambda: generating(registry, "loop"), "the answer under way")
    os.kill(registry.loaded()["loop"].proc.pid, signal.SIGKILL)
    status, body = await task
    assert status == 500
    validate(body, "ErrorResponse")
    assert body["error"]["code"] == "worker_crashed"


async def test_the_event_loop_keeps_answering_during_a_generation(client, monkeypatch):
    seen = record_events(monkeypatch)
    # as long an answer as the context holds (thousands of tokens: far longer than /health takes)
    task = asyncio.create_task(chat(client, model="loop", max_tokens=8000))
    await seen.until(lambda: seen.made, "the answer's first token")
    r = await client.get("/health")
    assert r.status == 200 and not seen.done  # answered while the worker was still generating
    status, _ = await task
    assert status == 200


async def test_concurrent_first_requests_load_one_worker(client):
    results = await asyncio.gather(*(chat(client, model="plain") for _ in range(4)))
    assert all(body["choices"][0]["message"]["content"] == "Hello, world!" for _, body in results)
    assert len(client.app[REGISTRY].loaded()) == 1


async def test_a_file_that_is_not_gguf_is_a_503_and_others_still_serve(aiohttp_client, models, write_config, tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\x00" * 20)
    cfg = load_config(write_config(f"models:\n  bad: {tmp_path}/bad.gguf\n  plain: {models}/plain.gguf\n"))
    client = await aiohttp_client(create_app(cfg))
    status, body = await chat(client, model="bad")
    assert status == 503 and body["error"]["code"] == "model_load_failed"
    assert "bad" in body["error"]["message"]
    status, body = await chat(client, model="plain")
    assert status == 200


async def test_ignore_eos_runs_to_max_tokens(client):
    _, body = await chat(client, model="plain", ignore_eos=True, max_tokens=6)
    assert body["usage"]["completion_tokens"] == 6 and body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"].startswith("Hello, world!")
    assert "<|im_end|>" not in body["choices"][0]["message"]["content"]


def test_an_explicit_zero_beats_the_models_default():
    from gateway.wire.openai import apply_defaults, parse_chat

    parsed = parse_chat({"model": "m", "messages": HI, "temperature": 0, "presence_penalty": 0})
    apply_defaults(parsed, {"temperature": 0.7, "presence_penalty": 1.0, "top_k": 5, "max_tokens": 9})
    req = parsed.request
    assert (req.temperature, req.presence_penalty, req.top_k, req.max_tokens) == (0, 0, 5, 9)
    parsed = parse_chat({"model": "m", "messages": HI})
    assert (parsed.request.temperature, parsed.request.top_k, parsed.request.max_tokens) == (0.8, 40, None)


# --- batches, echo, log-probabilities -------------------------------------------------------

async def test_completions_batch_of_prompts_one_choice_each(client):
    r = await client.post("/v1/completions", json={"model": "loop", "prompt": ["a\n", [1, 3 + 2 + 0x0A], "b\n"],
                                                   "max_tokens": 3})
    body = await r.json()
    assert r.status == 200, body
    validate(body, "CreateCompletionResponse")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"] == " tick tock tick" for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 9
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": ["a\n", "b\n"], "stream": True,
                                                   "stream_options": {"include_usage": True}})
    events = await sse_events(r)
    by_index = {0: "", 1: ""}
    for e in events[:-2]:
        validate_completion_chunk(e)
        by_index[e["choices"][0]["index"]] += e["choices"][0]["text"]
    assert by_index == {0: "Hello, world!", 1: "Hello, world!"}
    assert events[-2]["usage"]["completion_tokens"] == 8


async def test_completions_echo(client):
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": "Say:\n", "echo": True})
    assert (await r.json())["choices"][0]["text"] == "Say:\nHello, world!"
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": "Say:\n", "echo": True,
                                                   "stream": True})
    events = await sse_events(r)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "Say:\nHello, world!"


async def test_completion_logprobs(client):
    r = await client.post("/v1/completions", json={"model": "plain", "prompt": "go\n", "logprobs": 2})
    body = await r.json()
    validate(body, "CreateCompletionResponse")
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == ["Hello", ",", " world", "!"]
    assert lp["text_offset"] == [0, 5, 6, 12]
    assert all(-0.01 < x <= 0 for x in lp["token_logprobs"])  # the script's margin: each is near-certain
    assert [list(t)[0] for t in lp["top_logprobs"]] == lp["tokens"] and all(len(t) == 2 for t in lp["top_logprobs"])


async def test_chat_logprobs_whole_and_streamed(client):
    _, body = await chat(client, model="plain", logprobs=True, top_logprobs=3)
    validate(body, "CreateChatCompletionResponse")
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hello", ",", " world", "!"]
    assert content[0]["bytes"] == list(b"Hello") and len(content[0]["top_logprobs"]) == 3
    assert content[0]["top_logprobs"][0]["token"] == "Hello"
    assert content[0]["top_logprobs"][0]["logprob"] >= content[0]["top_logprobs"][1]["logprob"]
    _, plain = await chat(client, model="plain")
    assert plain["choices"][0]["logprobs"] is None
    events = await stream_chat(client, model="plain", logprobs=True)
    tokens = [t["token"] for e in events[:-1] for t in ((e["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert tokens == ["Hello", ",", " world", "!"]
    status, body = await chat(client, model="plain", top_logprobs=2)
    assert status == 400 and body["error"]["param"] == "top_logprobs"
