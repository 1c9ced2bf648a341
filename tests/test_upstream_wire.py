"""The OpenAI wire spoken to an upstream (gateway/upstream_wire.py): request bodies, server-sent
events cut anywhere, chunks read into events, malformed streams, and error bodies."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import upstream_wire as wire
from gateway.answer import Call, CallArgs, Finish, Piece, pieces
from gateway.engine.protocol import CallDelta, Done, GenerationRequest, Start, Text, Thinking
from gateway.errors import ApiError
from gateway.protocol import anthropic as anth
from gateway.protocol import openai as oai
from gateway.toolcalls import AnswerParser


def chunk(delta=None, finish=None, text=None, usage=None):
    choice = {"index": 0, "finish_reason": finish}
    if text is not None:
        choice["text"] = text
    else:
        choice["delta"] = delta or {}
    out = {"id": "x", "choices": [choice]}
    if usage is not None:
        out["usage"] = usage
    return json.dumps(out)


def test_a_chat_request_becomes_an_openai_body_with_only_the_fields_given():
    parsed = oai.parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2,
                             "max_tokens": 9, "stop": ["x"], "tools": [{"type": "function", "function": {
                                 "name": "f", "parameters": {"type": "object"}}}], "tool_choice": "required"})
    oai.apply_defaults(parsed, {"top_k": 7})
    path, body = wire.request_body(parsed.request, "up-model")
    assert path == "/chat/completions"
    assert body["model"] == "up-model" and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.2 and body["top_k"] == 7 and "top_p" not in body and "min_p" not in body
    assert body["max_tokens"] == 9 and body["stop"] == ["x"] and body["tool_choice"] == "required"
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_history_from_anthropic_reaches_the_upstream_in_openai_shape():
    parsed = anth.parse({"model": "m", "max_tokens": 8, "system": "be brief", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                          {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "w"}})
    _, body = wire.request_body(parsed.request, "m")
    system, user, assistant, tool = body["messages"]
    assert system == {"role": "system", "content": "be brief"} and user["content"] == "weather?"
    assert assistant["content"] is None and assistant["reasoning_content"] == "hmm"
    assert assistant["tool_calls"] == [{"id": "toolu_1", "type": "function",
                                        "function": {"name": "w", "arguments": '{"c": "P"}'}}]
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "w"}}


def test_a_text_completion_and_structured_output():
    req = GenerationRequest(prompt="Say", echo=True, response_format="json_schema", json_schema={"type": "object"})
    path, body = wire.request_body(req, "m")
    assert path == "/completions" and body["prompt"] == "Say" and body["echo"] is True
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer",
                                                                              "schema": {"type": "object"}}}


STREAM = (b": keep-alive\n\n"
          + "".join(f"data: {c}\n\n" for c in [
              chunk({"role": "assistant", "content": ""}),
              chunk({"reasoning_content": "Think.", "reasoning": "Think."}),
              chunk({"content": "Hé"}), chunk({"content": "llo 🙂"}),
              chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "f", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
              chunk(finish="tool_calls"),
              json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7,
                                                             "prompt_tokens_details": {"cached_tokens": 2}}}),
              "[DONE]"]).encode())


def read(data: bytes, cuts: list[int]):
    decoder, reader, events = wire.SSEDecoder(), wire.ChunkReader(3, chat=True), []
    at = 0
    for cut in [*sorted(cuts), len(data)]:
        for payload in decoder.feed(data[at:cut]):
            events += reader.feed(payload)
        at = cut
    for payload in decoder.close():
        events += reader.feed(payload)
    return events


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_a_stream_cut_anywhere_reads_the_same(cuts):
    events = read(STREAM, cuts)
    assert events == [Thinking(3, "Think.", 1), Text(3, "Hé", 2), Text(3, "llo 🙂", 3),
                      CallDelta(3, 0, "call_1", "f", ""), CallDelta(3, 0, None, None, '{"a":'),
                      CallDelta(3, 0, None, None, " 1}"), Done(3, "tool_calls", None, 5, 7, 2)]


@pytest.mark.parametrize("payload, why", [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"choices": {"0": {}}}), "`choices`"),
    (chunk({"content": 5}), "not a string"),
    (chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}), "no name"),
    (chunk({"tool_calls": "x"}), "not a list"),
    (json.dumps({"choices": [], "usage": "lots"}), "`usage`"),
])
def test_malformed_chunks_are_named(payload, why):
    with pytest.raises(wire.MalformedStream, match=why) as e:
        wire.ChunkReader(1, chat=True).feed(payload)
    assert e.value.status == 502 and e.value.code == "upstream_malformed"


def test_an_in_band_error_and_an_oversized_event():
    with pytest.raises(ApiError, match="boom") as e:
        wire.ChunkReader(1, chat=True).feed(json.dumps({"error": {"message": "boom"}}))
    assert e.value.code == "upstream_error"
    with pytest.raises(wire.MalformedStream, match="more than 100 bytes"):
        wire.SSEDecoder(limit=100).feed(b"data: " + b"x" * 200)


def test_a_stream_without_usage_counts_its_chunks():
    reader = wire.ChunkReader(1, chat=False)
    for text in ("a", "b", "c"):
        reader.feed(chunk(text=text))
    reader.feed(chunk(text="", finish="length"))
    assert reader.feed("[DONE]") == [Done(1, "length", None, 0, 3, 0)]


@pytest.mark.parametrize("status, body, message, param, code", [
    (404, b'{"error": {"message": "no such model", "type": "invalid_request_error", "param": "model", '
          b'"code": "model_not_found"}}', "no such model", "model", "model_not_found"),
    (400, b'{"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}', "bad", None, None),
    (400, b'{"error": "plain words"}', "plain words", None, None),
    (401, b"Unauthorized", "Unauthorized", None, None),
    (422, b"", "HTTP 422", None, None),
])
def test_upstream_errors_keep_status_message_param_and_code(status, body, message, param, code):
    e = wire.error_from(status, body)
    assert (e.status, e.message, e.param, e.code) == (status, message, param, code)


class Events:
    """Events as a backend's generation gives them."""

    def __init__(self, events):
        self.events = list(events)
        self.on_idle = None

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)


async def collect(events, stream, reasoning=None):
    parser = AnswerParser(None, None, reasoning=reasoning, stream=stream)
    return [item async for item in pieces(Events(events), parser)]


async def test_native_calls_and_thinking_pass_through_the_answer():
    events = [Thinking(1, "hm", 1), Text(1, "ok", 2), CallDelta(1, 0, "call_9", "f", ""),
              CallDelta(1, 0, None, None, '{"a": 1}'), Done(1, "tool_calls", None, 3, 4, 0)]
    streamed = await collect(events, stream=True)
    assert streamed[:4] == [Piece("thinking", "hm"), Piece("content", "ok"), Call(0, "call_9", "f"),
                            CallArgs(0, '{"a": 1}')]
    assert isinstance(streamed[-1], Finish) and streamed[-1].reason == "tool_calls"
    assert streamed[-1].reasoning_tokens == 1


async def test_a_whole_answer_keeps_only_calls_whose_arguments_parse():
    events = [CallDelta(1, 0, "call_1", "f", '{"a": '), CallDelta(1, 1, "call_2", "g", '{"b": 2}'),
              Done(1, "tool_calls", None, 3, 4, 0)]
    whole = await collect(events, stream=False)
    assert whole[:3] == [Piece("content", '{"a": '), Call(0, "call_2", "g"), CallArgs(0, '{"b": 2}')]


async def test_raw_thinking_markers_in_upstream_text_are_split():
    events = [Start(1, 0, 0, 0), Text(1, "<think>", 1), Text(1, "hm</think>", 2), Text(1, "Yes.", 3),
              Done(1, "stop", None, 1, 3, 0)]
    items = await collect(events[1:], stream=True, reasoning="think_leading")
    assert [i for i in items if isinstance(i, Piece)] == [Piece("thinking", "hm"), Piece("content", "Yes.")]


def test_a_whole_answer_where_a_stream_was_asked_for_reads_as_that_stream():
    body = json.dumps({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
                       "message": {"role": "assistant", "content": "Hi", "reasoning_content": "hm", "tool_calls": [
                           {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 5}}).encode()
    reader, events = wire.ChunkReader(2, chat=True), []
    for data in wire.whole_as_chunks(body, chat=True):
        events += reader.feed(data)
    assert events == [Thinking(2, "hm", 1), CallDelta(2, 0, "call_1", "f", '{"a": 1}'), Text(2, "Hi", 2),
                      Done(2, "tool_calls", None, 3, 5, 0)]
    text = json.dumps({"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]}).encode()
    reader = wire.ChunkReader(3, chat=False)
    assert [e for d in wire.whole_as_chunks(text, chat=False) for e in reader.feed(d)] == [
        Text(3, "ok", 1), Done(3, "length", None, 0, 1, 0)]
    with pytest.raises(wire.MalformedStream, match="without `choices`"):
        wire.whole_as_chunks(b'{"error": "x"}', chat=True)
