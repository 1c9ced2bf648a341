"""``wire.readback.read_answer``, a captured answer read back into thinking, content and calls,
against the real gateway's bytes: scripted models answer through the real app on every wire,
whole and streamed, and each answer's raw bytes are read back and compared with what the wire's
official client (the openai, anthropic and ollama SDKs, replaying those very bytes through an
httpx mock transport) reads from them. Then the same bytes cut at every frame and at many bytes,
mutated, and hand-written hostile answers: it never raises and reads in linear time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from realmodel import CACHE

from gateway.app import create_app
from gateway.base.errors import ApiError
from gateway.models import testmodels as tm
from gateway.models.config import ServerConfig, load_config
from gateway.protocol import Start
from gateway.server.events import Observation
from gateway.server.sse import EventStream, LineStream
from gateway.wire import anthropic as wire_anthropic
from gateway.wire import anthropic_answer, openai_answer
from gateway.wire import fim as wire_fim
from gateway.wire import openai as wire_openai
from gateway.wire.answer import Piece
from gateway.wire.context import Context
from gateway.wire.readback import read_answer

S = tm.Special
HELLO = ["Héllo", ",", " 日本", " 🙂!"]  # the plain model's answer: characters of 2, 3 and 4 bytes
MIDDLE = [" return", " a", " +", " b"]  # its fill-in-the-middle answer
FIM_SPECIAL = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
THINK, SAY = "Paris weather needed.", "Let me check."
CALL = ['{"name":', ' "get_weather",', ' "arguments":', ' {"city":', ' "Paris"}}']
PATCH = ['{"name":', ' "apply_patch",', ' "arguments":', ' {"input":', ' "*** Begin Patch"}}']
PARIS = {"city": "Paris"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ANTH_WEATHER = {"name": "get_weather", "description": "Weather in a city",
                "input_schema": WEATHER["function"]["parameters"]}
RESP_WEATHER = {"type": "function", **WEATHER["function"]}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HI = [{"role": "user", "content": "hi"}]
KEYS = {"thinking", "content", "calls", "finish_reason", "usage", "error", "choices"}


def caller_script(call: list[str]) -> tm.Script:
    """Qwen 3's thinking, a sentence, then a call (Hermes' syntax, as Qwen 3 writes it)."""
    return tm.Script([S("<think>"), "Paris", " weather", " needed.", S("</think>"), "\n\n", "Let", " me", " check", ".",
                      "\n", S("<tool_call>"), "\n", *call, "\n", S("</tool_call>")])


@dataclass
class Captured:
    route: str
    stream: bool
    status: int
    body: bytes

    def read(self) -> dict[str, Any]:
        return read_answer(self.route, self.stream, self.body)


# name -> (route, request body); each is asked whole and streamed
EXCHANGES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": "caller", "messages": ASK, "tools": [WEATHER],
                                      "stream_options": {"include_usage": True}}),
    "chat_plain": ("/v1/chat/completions", {"model": "plain", "messages": HI}),
    "completions": ("/v1/completions", {"model": "plain", "prompt": ["a\n", "b\n"], "max_tokens": 20}),
    "fim": ("/v1/fim/completions", {"model": "plain", "prompt": "def add(a, b):\n", "suffix": "\n"}),
    "infill": ("/infill", {"model": "plain", "input_prefix": "def add(a, b):\n", "input_suffix": "\n"}),
    "messages": ("/v1/messages", {"model": "caller", "max_tokens": 300, "messages": ASK, "tools": [ANTH_WEATHER]}),
    "responses": ("/v1/responses", {"model": "caller", "input": "Weather in Paris?", "tools": [RESP_WEATHER],
                                    "reasoning": {"summary": "auto"}}),
    "responses_custom": ("/v1/responses", {"model": "patcher", "input": "Patch it.",
                                           "tools": [{"type": "custom", "name": "apply_patch"}]}),
    "ollama_chat": ("/api/chat", {"model": "caller", "messages": ASK, "tools": [WEATHER]}),
    "ollama_generate": ("/api/generate", {"model": "thinker", "prompt": "2+2?", "think": True}),
    "ollama_generate_plain": ("/api/generate", {"model": "plain", "prompt": "hi"}),
    "responses_cut": ("/v1/responses", {"model": "loop", "input": "hi", "max_output_tokens": 4}),
    "messages_cut": ("/v1/messages", {"model": "loop", "max_tokens": 4, "messages": HI}),
    "missing_chat": ("/v1/chat/completions", {"model": "missing", "messages": HI}),
    "missing_messages": ("/v1/messages", {"model": "missing", "max_tokens": 5, "messages": HI}),
    "missing_responses": ("/v1/responses", {"model": "missing", "input": "hi"}),
    "missing_ollama": ("/api/chat", {"model": "missing", "messages": HI}),
    "broken_chat": ("/v1/chat/completions", {"model": "broken", "messages": HI}),
}
WHOLE_ONLY = {"embeddings": ("/v1/embeddings", {"model": "emb", "input": ["one", "two"]}),
              "ollama_embed": ("/api/embed", {"model": "emb", "input": ["one", "two"]}),
              "ollama_embeddings": ("/api/embeddings", {"model": "emb", "prompt": "one"})}
# streams whose worker is killed once its first words are out: the wire's in-band error
KILLED = {"chat": ("/v1/chat/completions", {"model": "loop", "messages": HI}),
          "messages": ("/v1/messages", {"model": "loop", "max_tokens": 3000, "messages": HI}),
          "responses": ("/v1/responses", {"model": "loop", "input": "hi"}),
          "ollama_chat": ("/api/chat", {"model": "loop", "messages": HI})}


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, Captured]:
    """Every exchange's answer as its client received it: ``name`` (whole) and ``name~`` (streamed),
    ``killed~name`` (the loop model's worker killed mid-stream)."""
    d = tmp_path_factory.mktemp("readback")
    qwen3 = tm.llama_cpp_source_file("models/templates/Qwen-Qwen3-0.6B.jinja", CACHE / "templates").read_text()
    tm.write_scripted_model(d / "plain.gguf", [tm.Script(HELLO), tm.Script(MIDDLE, trigger="<|fim_middle|>")],
                            extra_special=FIM_SPECIAL)
    tm.write_scripted_model(d / "caller.gguf", caller_script(CALL), chat_template=qwen3)
    tm.write_scripted_model(d / "patcher.gguf", caller_script(PATCH), chat_template=qwen3)
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.endless(d / "loop.gguf")
    (d / "broken.gguf").write_bytes((d / "plain.gguf").read_bytes().replace(b"llama", b"zzzzz"))
    names = ("plain", "caller", "patcher", "thinker", "loop", "broken")
    (d / "models.yaml").write_text("server:\n  models_dirs: []\nmodels:\n"
                                   + "".join(f"  {n}: {d}/{n}.gguf\n" for n in names)
                                   + f"  emb:\n    path: {d}/plain.gguf\n    embeddings: true\n")
    return asyncio.run(_collect(d / "models.yaml"))


async def _collect(config: Path) -> dict[str, Captured]:
    out: dict[str, Captured] = {}
    client = TestClient(TestServer(create_app(load_config(config))))
    await client.start_server()
    try:
        for name, (route, body) in [*EXCHANGES.items(), *WHOLE_ONLY.items()]:
            for stream in (False, True) if name in EXCHANGES else (False,):
                r = await client.post(route, json={**body, "stream": stream})
                out[name + "~" * stream] = Captured(route, stream, r.status, await r.read())
        for name, (route, body) in KILLED.items():
            r = await client.post(route, json={**body, "stream": True})
            got = [await r.content.readany()]
            while b"tick" not in b"".join(got) and got[-1]:
                got.append(await r.content.readany())
            health = await (await client.get("/health")).json()
            os.kill(health["workers"]["loop"], signal.SIGKILL)
            got.append(await r.content.read())
            out[f"killed~{name}"] = Captured(route, True, r.status, b"".join(got))
    finally:
        await client.close()
    return out


# --- the official clients, reading the captured bytes ------------------------------------------

def _transport(c: Captured, http: Any = httpx) -> Any:
    """An httpx (or, for the anthropic SDK, httpx2) transport that answers ``c``'s bytes."""
    kind = ("application/x-ndjson" if c.route.startswith("/api/") else "text/event-stream") if c.stream \
        else "application/json"
    return http.MockTransport(lambda request: http.Response(c.status, content=c.body, headers={"content-type": kind}))


def openai_client(c: Captured) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://gateway/v1", api_key="x", max_retries=0,
                         http_client=httpx.Client(transport=_transport(c)))


def anthropic_client(c: Captured) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url="http://gateway", api_key="x", max_retries=0,
                               http_client=httpx2.Client(transport=_transport(c, httpx2)))


def ollama_client(c: Captured) -> ollama.Client:
    return ollama.Client(host="http://gateway", transport=_transport(c))


def without_ids(read: dict[str, Any]) -> dict[str, Any]:
    """A reading, less what differs between two asks (ids, counts of cached tokens, durations)."""
    return {**read, "calls": [{**c, "id": None} for c in read["calls"]], "usage": None}


def check_shape(read: dict[str, Any]) -> None:
    assert set(read) == KEYS
    assert isinstance(read["thinking"], str) and isinstance(read["content"], str)
    assert isinstance(read["calls"], list) and isinstance(read["choices"], int) and read["choices"] >= 0
    for call in read["calls"]:
        assert set(call) == {"id", "name", "arguments"}
        assert (call["id"] is None or isinstance(call["id"], str)) and isinstance(call["name"], str)
        assert isinstance(call["arguments"], str)
    assert read["finish_reason"] is None or isinstance(read["finish_reason"], str)
    assert read["usage"] is None or isinstance(read["usage"], dict)
    assert read["error"] is None or isinstance(read["error"], str)


# --- every wire, whole and streamed, as its client reads it ------------------------------------

def test_openai_chat_whole_and_streamed(captured):
    whole, streamed = captured["chat"], captured["chat~"]
    read = whole.read()
    message = openai_client(whole).chat.completions.create(model="caller", messages=ASK).choices[0].message
    assert read["thinking"] == message.reasoning_content == THINK
    assert read["content"] == message.content == SAY
    assert [(c["id"], c["name"], c["arguments"]) for c in read["calls"]] == [
        (t.id, t.function.name, t.function.arguments) for t in message.tool_calls or []]
    assert json.loads(read["calls"][0]["arguments"]) == PARIS
    assert read["finish_reason"] == "tool_calls" and read["choices"] == 1 and read["error"] is None
    assert read["usage"] == json.loads(whole.body)["usage"]

    s = streamed.read()
    with openai_client(streamed).chat.completions.stream(model="caller", messages=ASK) as events:
        final = events.get_final_completion()
    m = final.choices[0].message
    assert s["thinking"] == m.reasoning_content
    assert s["content"] == m.content
    assert [(c["id"], c["name"], c["arguments"]) for c in s["calls"]] == [
        (t.id, t.function.name, t.function.arguments) for t in m.tool_calls or []]
    assert s["finish_reason"] == final.choices[0].finish_reason == "tool_calls"
    assert s["usage"] == final.usage.model_dump(exclude_none=True)
    assert without_ids(s) == without_ids(read) and s["calls"][0]["id"].startswith("call_")


def test_openai_plain_chat(captured):
    for name in ("chat_plain", "chat_plain~"):
        read = captured[name].read()
        assert (read["content"], read["thinking"], read["calls"]) == ("".join(HELLO), "", []), name
        assert read["finish_reason"] == "stop" and read["error"] is None


def test_a_batch_of_completions_reads_choice_zero_and_counts_them(captured):
    whole, streamed = captured["completions"], captured["completions~"]
    completion = openai_client(whole).completions.create(model="plain", prompt=["a\n", "b\n"])
    texts: dict[int, str] = {}
    for chunk in openai_client(streamed).completions.create(model="plain", prompt=["a\n", "b\n"], stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    for c, zero, count in ((whole, completion.choices[0].text, len(completion.choices)), (streamed, texts[0], len(texts))):
        read = c.read()
        assert read["content"] == zero == "".join(HELLO)
        assert read["choices"] == count == 2 and read["finish_reason"] == "stop" and read["calls"] == []


def test_mistrals_fim_and_llama_servers_infill(captured):
    for name in ("fim", "fim~", "infill", "infill~"):
        read = captured[name].read()
        assert read["content"] == "".join(MIDDLE) and read["error"] is None and read["choices"] == 1, name
    fim = openai_client(captured["fim"]).chat.completions.create(model="plain", messages=HI)
    assert fim.choices[0].message.content == "".join(MIDDLE)
    assert captured["fim~"].read()["usage"]["completion_tokens"] == len(MIDDLE)  # on its last chunk
    frames = [json.loads(line[6:]) for line in captured["infill~"].body.decode().split("\n") if line.startswith("data: ")]
    assert "".join(f["content"] for f in frames) == "".join(MIDDLE)  # llama-server's shape: no SDK reads it
    for name in ("infill", "infill~"):
        read = captured[name].read()
        assert read["finish_reason"] == "eos" and read["usage"]["tokens_predicted"] == len(MIDDLE), read


def test_anthropic_whole_and_streamed(captured):
    whole, streamed = captured["messages"], captured["messages~"]
    msg = anthropic_client(whole).messages.create(model="caller", max_tokens=300, messages=ASK)
    with anthropic_client(streamed).messages.stream(model="caller", max_tokens=300, messages=ASK) as events:
        final = events.get_final_message()
    for c, message in ((whole, msg), (streamed, final)):
        read = c.read()
        blocks = message.content
        assert read["thinking"] == "".join(b.thinking for b in blocks if b.type == "thinking") == THINK
        assert read["content"] == "".join(b.text for b in blocks if b.type == "text") == SAY
        uses = [b for b in blocks if b.type == "tool_use"]
        assert [(c["id"], c["name"]) for c in read["calls"]] == [(b.id, b.name) for b in uses]
        assert [json.loads(c["arguments"]) for c in read["calls"]] == [b.input for b in uses] == [PARIS]
        assert read["finish_reason"] == message.stop_reason == "tool_use"
        assert read["usage"]["output_tokens"] == message.usage.output_tokens > 0
        assert read["usage"]["input_tokens"] == message.usage.input_tokens
    assert without_ids(whole.read()) == without_ids(streamed.read())


def test_responses_whole_and_streamed(captured):
    whole, streamed = captured["responses"], captured["responses~"]
    response = openai_client(whole).responses.create(model="caller", input="x")
    with openai_client(streamed).responses.stream(model="caller", input="x") as events:
        final = events.get_final_response()
    assert b"response.reasoning_summary_text.delta" in streamed.body  # the thinking told twice, read once
    for c, resp in ((whole, response), (streamed, final)):
        read = c.read()
        reasoning = [i for i in resp.output if i.type == "reasoning"]
        assert read["thinking"] == "".join(p.text for i in reasoning for p in i.content or []) == THINK
        assert read["content"] == resp.output_text == SAY
        calls = [i for i in resp.output if i.type == "function_call"]
        assert [(c["id"], c["name"], c["arguments"]) for c in read["calls"]] == [
            (i.call_id, i.name, i.arguments) for i in calls]
        assert json.loads(read["calls"][0]["arguments"]) == PARIS
        assert read["finish_reason"] == resp.status == "completed"
        assert read["usage"] == resp.usage.model_dump(exclude_none=True)
    assert without_ids(whole.read()) == without_ids(streamed.read())


def test_a_responses_custom_tool_call(captured):
    for name in ("responses_custom", "responses_custom~"):
        c = captured[name]
        if c.stream:
            with openai_client(c).responses.stream(model="patcher", input="x") as events:
                resp = events.get_final_response()
        else:
            resp = openai_client(c).responses.create(model="patcher", input="x")
        customs = [i for i in resp.output if i.type == "custom_tool_call"]
        read = c.read()
        assert [(c["id"], c["name"], c["arguments"]) for c in read["calls"]] == [
            (i.call_id, i.name, i.input) for i in customs] == [(customs[0].call_id, "apply_patch", "*** Begin Patch")]
        assert (read["thinking"], read["content"]) == (THINK, SAY)


def test_an_answer_cut_by_its_token_limit(captured):
    for name in ("responses_cut", "responses_cut~", "messages_cut", "messages_cut~"):
        c = captured[name]
        if c.route == "/v1/responses":
            if c.stream:  # the SDK's stream helper wants response.completed: its events, read one by one
                resp = [e.response for e in openai_client(c).responses.create(model="loop", input="x", stream=True)
                        if e.type == "response.incomplete"][-1]
            else:
                resp = openai_client(c).responses.create(model="loop", input="x")
            text, reason = resp.output_text, resp.incomplete_details.reason
        else:
            if c.stream:
                with anthropic_client(c).messages.stream(model="loop", max_tokens=4, messages=HI) as events:
                    msg = events.get_final_message()
            else:
                msg = anthropic_client(c).messages.create(model="loop", max_tokens=4, messages=HI)
            text, reason = "".join(b.text for b in msg.content if b.type == "text"), msg.stop_reason
        read = c.read()
        assert (read["content"], read["finish_reason"]) == (text, reason), name
        assert text == " tick tock tick tock" and reason in ("max_output_tokens", "max_tokens")


def test_ollama_chat_and_generate(captured):
    whole, streamed = captured["ollama_chat"], captured["ollama_chat~"]
    message = ollama_client(whole).chat(model="caller", messages=ASK, stream=False).message
    parts = list(ollama_client(streamed).chat(model="caller", messages=ASK, stream=True))
    for c, thinking, content, calls in (
            (whole, message.thinking, message.content, message.tool_calls or []),
            (streamed, "".join(p.message.thinking or "" for p in parts), "".join(p.message.content or "" for p in parts),
             [t for p in parts for t in p.message.tool_calls or []])):
        read = c.read()
        assert (read["thinking"], read["content"]) == (thinking, content) == (THINK, SAY)
        assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in read["calls"]] == [
            (None, t.function.name, dict(t.function.arguments)) for t in calls] == [(None, "get_weather", PARIS)]
        assert read["finish_reason"] == "stop" and read["usage"]["eval_count"] > 0
    for name, thinking, content in (("ollama_generate", "Two and two.", "It is 4."),
                                    ("ollama_generate_plain", "", "".join(HELLO))):
        for c in (captured[name], captured[name + "~"]):
            got = ollama_client(c).generate(model="x", prompt="x", stream=c.stream)
            parts = list(got) if c.stream else [got]
            read = c.read()
            assert read["thinking"] == "".join(p.thinking or "" for p in parts) == thinking, name
            assert read["content"] == "".join(p.response for p in parts) == content, name
            assert read["calls"] == [] and read["finish_reason"] == "stop" and read["choices"] == 1


def test_embeddings_give_their_usage_only(captured):
    read = captured["embeddings"].read()
    usage = openai_client(captured["embeddings"]).embeddings.create(model="emb", input=["one"]).usage
    assert read["usage"] == usage.model_dump() and usage.prompt_tokens > 0
    embed = captured["ollama_embed"].read()
    assert embed["usage"]["prompt_eval_count"] == ollama_client(captured["ollama_embed"]).embed(
        model="emb", input="x").prompt_eval_count
    for got in (read, embed, captured["ollama_embeddings"].read()):
        check_shape(got)
        assert (got["content"], got["calls"], got["choices"], got["error"]) == ("", [], 0, None)


# --- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["missing_chat", "missing_messages", "missing_responses", "missing_ollama",
                                  "broken_chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_an_error_answer_is_read_as_its_message(captured, name, stream):
    """A refusal before anything of the answer: a plain error body, streamed or not."""
    c = captured[name + "~" * stream]
    assert c.status >= 400
    read = c.read()
    check_shape(read)
    word = "broken" if name.startswith("broken") else "missing"
    assert word in read["error"] and read["content"] == "" and read["choices"] == 0
    if c.route.startswith("/v1/messages"):
        with pytest.raises(anthropic.APIStatusError) as e:
            anthropic_client(c).messages.create(model="x", max_tokens=5, messages=HI)
        assert e.value.body["error"]["message"] == read["error"]
    elif c.route.startswith("/api/"):
        with pytest.raises(ollama.ResponseError) as e2:
            ollama_client(c).chat(model="x", messages=HI, stream=False)
        assert e2.value.error == read["error"]
    else:
        with pytest.raises(openai.APIStatusError) as e3:
            openai_client(c).chat.completions.create(model="x", messages=HI)
        assert e3.value.body["message"] == read["error"]


@pytest.mark.parametrize("name", list(KILLED))
def test_a_worker_killed_mid_stream_is_an_in_band_error(captured, name):
    c = captured[f"killed~{name}"]
    assert c.status == 200
    read = c.read()
    check_shape(read)
    assert "exited unexpectedly" in read["error"], read
    assert read["content"].startswith(" tick") and read["choices"] == 1
    if name == "chat":
        assert read["finish_reason"] == "error"
        with pytest.raises(openai.APIError) as e:
            for _ in openai_client(c).chat.completions.create(model="loop", messages=HI, stream=True):
                pass
        assert e.value.message == read["error"]
    if name == "responses":
        assert read["finish_reason"] == "failed"  # its last item, in progress, still has the streamed text


# --- cut short, as a capture's bound cuts it ---------------------------------------------------

STREAMS = sorted(n for n in [f"{e}~" for e in EXCHANGES if not e.startswith(("missing", "broken"))]
                 + [f"killed~{k}" for k in KILLED])


@pytest.mark.parametrize("name", STREAMS)
def test_a_stream_cut_anywhere_reads_as_a_prefix_of_the_whole(captured, name):
    c = captured[name]
    full = c.read()
    frame_ends = [i + 1 for i, b in enumerate(c.body) if b == 0x0A]
    cuts = sorted(set(frame_ends) | set(range(0, len(c.body), max(1, len(c.body) // 150))))
    for cut in cuts:
        read = read_answer(c.route, True, c.body[:cut])
        check_shape(read)
        assert full["content"].startswith(read["content"]), (cut, read)
        assert full["thinking"].startswith(read["thinking"]), (cut, read)
        assert len(read["calls"]) <= len(full["calls"])
        for part, whole in zip(read["calls"], full["calls"]):
            assert whole["arguments"].startswith(part["arguments"]) and whole["name"].startswith(part["name"])
        assert read["choices"] <= full["choices"]
        if read["error"] is not None and full["error"] is None:  # only where nothing could be read yet
            assert not (read["content"] or read["thinking"] or read["calls"] or read["usage"]), (cut, read)
    assert read_answer(c.route, True, c.body) == full


@pytest.mark.parametrize("name", ["chat", "messages", "responses", "ollama_chat", "infill"])
def test_the_stream_flag_the_wrong_way_round_still_reads(captured, name):
    whole, streamed = captured[name], captured[name + "~"]
    assert read_answer(whole.route, True, whole.body) == whole.read()
    assert read_answer(streamed.route, False, streamed.body) == streamed.read()


def test_a_cut_inside_a_character_keeps_the_whole_characters_before_it(captured):
    c = captured["chat_plain~"]
    pieces = [i for i in range(len(c.body)) if c.body[i:i + 1] in (b"\xe6", b"\xf0")]  # inside 日 and 🙂 frames
    for at in pieces:
        for cut in range(at, at + 4):
            read = read_answer(c.route, True, c.body[:cut])
            assert "\ufffd" not in read["content"] and "".join(HELLO).startswith(read["content"])


# --- hand-written answers: progress comments, n > 1, in-band errors ------------------------------

def sse(*frames: tuple[dict[str, Any] | str, str | None]) -> bytes:
    """Frames as the gateway writes them (``EventStream._frame``)."""
    return b"".join(EventStream._frame(data if isinstance(data, str) else json.dumps(data), event)
                    for data, event in frames)


def lines(*objects: dict[str, Any]) -> bytes:
    return b"".join(LineStream._frame(json.dumps(o), None) for o in objects)


def test_load_progress_comments_are_skipped(captured):
    for name in ("chat~", "messages~", "responses~", "infill~"):
        c = captured[name]
        progress = b": loading 0%\n\n: loading 43%\n\n: loading 100%\n\n"
        assert read_answer(c.route, True, progress + c.body) == c.read()
        assert read_answer(c.route, True, progress)["error"] == "the stream holds no data frames"


def test_more_than_one_choice_reads_choice_zero():
    def chunk(index: int, **delta: Any) -> tuple[dict[str, Any], None]:
        return {"object": "chat.completion.chunk", "choices": [{"index": index, "delta": delta,
                                                                 "finish_reason": None}]}, None
    body = sse(chunk(0, role="assistant", content=""), chunk(1, content="B1"), chunk(0, reasoning_content="t0"),
               chunk(1, reasoning_content="t1"), chunk(0, content="A"), chunk(2, content="C"),
               chunk(1, tool_calls=[{"index": 0, "id": "call_b", "function": {"name": "b", "arguments": "{}"}}]),
               chunk(0, tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                                     "function": {"name": "f", "arguments": '{"x"'}}]),
               chunk(0, tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
               chunk(0, tool_calls=[{"index": 1, "id": "call_c", "function": {"name": "g", "arguments": "{}"}}]),
               ({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"},
                             {"index": 1, "delta": {}, "finish_reason": "stop"}]}, None),
               ({"choices": [], "usage": {"total_tokens": 9}}, None), ("[DONE]", None))
    read = read_answer("/v1/chat/completions", True, body)
    assert (read["thinking"], read["content"], read["choices"]) == ("t0", "A", 3)
    assert read["calls"] == [{"id": "call_a", "name": "f", "arguments": '{"x": 1}'},
                             {"id": "call_c", "name": "g", "arguments": "{}"}]
    assert read["finish_reason"] == "tool_calls" and read["usage"] == {"total_tokens": 9}
    whole = {"choices": [{"index": i, "message": {"content": f"c{i}", "reasoning": f"r{i}"}, "finish_reason": "stop"}
                         for i in (2, 0, 1)]}
    read = read_answer("/v1/chat/completions", False, json.dumps(whole).encode())
    assert (read["thinking"], read["content"], read["choices"]) == ("r0", "c0", 3)


def test_in_band_errors_in_each_wires_words():
    err = ApiError("the model broke", status=500, code="boom")
    ctx = Context("r", None, False, ServerConfig(), Observation("r", "/"))
    chat = openai_answer.Writer(wire_openai.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                      "stream": True}), ctx, kind="chat")
    begun = chat.open(Start(0, 1, 0, 0))
    oai = [*begun, *chat.feed(Piece("content", "so far")), *chat.fail(err), (chat.done, None)]
    read = read_answer("/v1/chat/completions", True, sse(*oai))  # as the chat stream's failure writes it
    assert (read["content"], read["finish_reason"], read["error"]) == ("so far", "error", "the model broke")
    messages = anthropic_answer.Writer(wire_anthropic.parse({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}), ctx)
    read = read_answer("/v1/messages", True, sse(*messages.fail(err)))
    assert read["error"] == "the model broke" and read["choices"] == 0
    infill = wire_fim.InfillWriter(wire_fim.parse_infill({"input_prefix": "a", "input_suffix": "b"}), ctx)
    read = read_answer("/infill", True, sse(({"content": "x", "stop": False}, None), *infill.fail(err)))
    assert (read["content"], read["error"]) == ("x", "the model broke")
    read = read_answer("/api/generate", True, lines({"response": "x", "done": False}, {"error": "the model broke"}))
    assert (read["content"], read["error"]) == ("x", "the model broke")
    events = sse(({"type": "error", "code": "boom", "message": "the model broke", "param": None}, "error"))
    assert read_answer("/v1/responses", True, events)["error"] == "the model broke"


def test_what_is_not_an_answer_says_why():
    assert read_answer("/v1/chat/completions", False, b"")["error"] == "the answer is empty"
    assert "not valid JSON" in read_answer("/v1/chat/completions", False, b"500: Internal Server Error")["error"]
    assert read_answer("/v1/chat/completions", False, b"[1, 2]")["error"] == "the answer is not a JSON object"
    assert read_answer("/v1/chat/completions", True, b"data: [DONE]\n\n")["error"] == \
        "none of the stream's 1 frames is a JSON object"
    assert read_answer("/v1/messages", True, sse(({"hello": 1}, None)))["error"] == \
        "nothing in the answer has the shape of an answer on /v1/messages"
    assert "not read back" in read_answer("/v1/models", False, b"{}")["error"]
    assert "not read back" in read_answer(None, False, b"{}")["error"]


HOSTILE = [
    b"\xff\xfe\x00garbage", b"data: {\n\n", b"data:\n\ndata: \n\n", b"event: x\n\n", b"\r\n\r\n", b"{}" * 1000,
    b'{"choices": "x", "usage": [1], "error": 5}', b'{"choices": [1, null, {"index": true, "delta": [], "message": 1}]}',
    b'{"choices": [{"index": 0, "delta": {"tool_calls": [1, {"index": {}, "function": 5}, {"function": {"arguments": {"a": 1}}}]}}]}',
    b'{"choices": [{"index": 0, "message": {"content": [1, {"text": 2}, {"type": "text", "text": "ok"}]}}]}',
    b'{"type": "content_block_delta", "index": [], "delta": {"type": "input_json_delta", "partial_json": 1}}',
    b'{"type": "content_block_start", "index": {}, "content_block": {"type": "tool_use", "input": [1, {}]}}',
    b'{"type": "message", "content": [1, {"type": "tool_use", "id": 5, "name": null}], "usage": 3, "stop_reason": 1}',
    b'{"type": "response.output_item.done", "output_index": [], "item": {"type": "reasoning", "content": 5}}',
    b'{"type": "response.output_text.delta", "output_index": 1.5, "delta": "x"}',
    b'{"object": "response", "output": [5, {"type": "function_call", "arguments": {"a": [1]}}], "status": 3}',
    b'{"message": {"tool_calls": [5, {"function": {"arguments": "raw"}}], "content": 7}, "done": true}',
    b'{"response": null, "done": true, "done_reason": 5, "eval_count": true, "prompt_eval_count": 1e400}',
    b'{"content": 5, "stop": true, "stop_type": [], "timings": {"x": 1}}',
    b'{"a": NaN, "b": Infinity}', b'{"s": "\\ud800"}', b'{"n": ' + b"9" * 5000 + b"}",
    b"[" * 100_000, b"data: " + b"{" * 50_000 + b"\n\n", b'{"a":' * 150 + b"1" + b"}" * 150,
]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                                   "/api/chat", "/api/generate", "/infill", "/v1/embeddings", "/api/embed"])
def test_hostile_bytes_never_raise(route):
    for body in HOSTILE:
        for stream in (False, True):
            for data in (body, b"data: " + body + b"\n\n", body + b"\n" + body):
                check_shape(read_answer(route, stream, data))


ROUTES = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/fim/completions", "/v1/messages",
                          "/v1/responses", "/api/chat", "/api/generate", "/infill", "/v1/embeddings"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ROUTES, st.booleans(), st.binary(max_size=400))
def test_any_bytes_read_without_raising(route, stream, body):
    check_shape(read_answer(route, stream, body))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(STREAMS), st.lists(st.tuples(st.integers(0, 1 << 30), st.binary(max_size=3)), max_size=6))
def test_a_real_stream_mangled_reads_without_raising(captured, name, edits):
    c = captured[name]
    body = bytearray(c.body)
    for at, new in edits:
        at %= len(body) + 1
        body[at:at + len(new) // 2] = new  # replace, insert or delete a few bytes
    check_shape(read_answer(c.route, c.stream, bytes(body)))


def test_reading_is_linear_in_the_answers_length():
    frame = sse(({"choices": [{"index": 0, "delta": {"content": "x", "tool_calls": [
        {"index": 0, "function": {"arguments": "y"}}]}}]}, None))
    anth = sse(({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "z"}},
                "content_block_delta"))
    resp = sse(({"type": "response.output_text.delta", "output_index": 0, "delta": "w"}, "response.output_text.delta"))
    line = lines({"message": {"content": "v", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}})

    def timed(route: str, stream: bool, body: bytes) -> tuple[float, dict[str, Any]]:
        started = time.perf_counter()
        read = read_answer(route, stream, body)
        return time.perf_counter() - started, read

    for route, unit, field in (("/v1/chat/completions", frame, "content"), ("/v1/messages", anth, None),
                               ("/v1/responses", resp, "content"), ("/api/chat", line, "content")):
        small, _ = timed(route, True, unit * 2_000)
        large, read = timed(route, True, unit * 16_000)
        if field:
            assert len(read[field]) == 16_000
        assert large < 8 * 4 * small + 0.5, (route, small, large)  # 8 times the bytes: not 64 times the time
    for body in (b'{"choices": [{"index": 0, "text": "' + b"a" * 2_000_000 + b'"}]}',
                 b"data: " + b"x" * 2_000_000, b"\n" * 2_000_000, b": c\n" * 500_000):
        assert isinstance(read_answer("/v1/completions", True, body)["content"], str)
