"""The OpenAI wire spoken to an upstream (gateway/backends/upstream_wire.py): request bodies, server-sent
events cut anywhere, chunks read into events, malformed streams, and error bodies."""

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.backends import upstream_wire as wire
from gateway.base.errors import ApiError
from gateway.protocol import CallDelta, Done, GenerationRequest, Start, Text, Thinking
from gateway.text.toolformats import AnswerParser
from gateway.wire import anthropic as anth
from gateway.wire import openai as oai
from gateway.wire.answer import Call, CallArgs, Finish, Piece, Reader


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
                      CallDelta(3, 0, "call_1", "f", "", 4), CallDelta(3, 0, None, None, '{"a":', 5),
                      CallDelta(3, 0, None, None, " 1}", 6), Done(3, "tool_calls", None, 5, 7, 2)]


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
    reader = Reader(parser)
    return [item async for event in Events(events) for item in reader.read(event)]


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
    reader = wire.ChunkReader(2, chat=True)
    events = reader.take(wire.whole_as_chunk(body, chat=True), len(body)) + reader.feed("[DONE]")
    assert events == [Thinking(2, "hm", 1), CallDelta(2, 0, "call_1", "f", '{"a": 1}', 2), Text(2, "Hi", 3),
                      Done(2, "tool_calls", None, 3, 5, 0)]
    text = json.dumps({"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]}).encode()
    reader = wire.ChunkReader(3, chat=False)
    assert reader.take(wire.whole_as_chunk(text, chat=False), len(text)) + reader.feed("[DONE]") == [
        Text(3, "ok", 1), Done(3, "length", None, 0, 1, 0)]
    with pytest.raises(wire.MalformedStream, match="without `choices`"):
        wire.whole_as_chunk(b'{"error": "x"}', chat=True)
    with pytest.raises(wire.MalformedStream, match="not JSON"):  # too deep for the parser is not JSON either
        wire.whole_as_chunk(b"[" * 100_000, chat=True)


# --- a hostile upstream: every answer bounded, the SSE reader linear ------------------------------

def test_the_sse_reader_is_linear_in_blank_lines_comments_and_other_fields():
    for filler in (b"\n", b"\r\n", b":\n", b": keep-alive\n", b"event: x\n", b"id: 7\n"):
        decoder, began = wire.SSEDecoder(), time.perf_counter()
        for _ in range(16):  # 16 MiB in 64 KiB reads, then an event: its data is all that is kept
            for _ in range(16):
                assert decoder.feed(filler * (65536 // len(filler))) == []
        assert decoder.feed(b"data: {}\n\n") == ["{}"]
        assert time.perf_counter() - began < 2.0, filler  # was 7 s a MiB of blank lines


def test_a_line_cut_into_many_reads_is_searched_once():
    decoder, began = wire.SSEDecoder(), time.perf_counter()
    decoder.feed(b"data: ")
    for _ in range(100):
        assert decoder.feed(b"x" * 65536) == []
    assert decoder.feed(b"\n\n") == ["x" * 6553600]
    assert time.perf_counter() - began < 1.0
    comment = wire.SSEDecoder(limit=100)
    comment.feed(b":" + b"c" * 90)
    with pytest.raises(wire.MalformedStream, match="more than 100 bytes"):  # an unfinished line counts too
        comment.feed(b"c" * 20)


def test_empty_data_lines_count_against_the_event_bound():
    decoder = wire.SSEDecoder(limit=1000)
    assert decoder.feed(b"data:\n" * 500) == []
    with pytest.raises(wire.MalformedStream, match="more than 1000 bytes"):
        decoder.feed(b"data:\n" * 600)
    decoder = wire.SSEDecoder()
    assert decoder.feed(b"data: a\ndata\ndata:b\n\n\n\n") == ["a\n\nb"]  # "data" alone is an empty line of data
    assert decoder.feed(b"data: {}") == [] and decoder.close() == ["{}"]


def test_answer_bounds_follow_max_tokens_and_cut_with_length():
    assert wire.answer_bounds(GenerationRequest(prompt="p")) == wire.Bounds(wire.MAX_ANSWER_CHUNKS,
                                                                            wire.MAX_ANSWER_BYTES)
    b = wire.answer_bounds(GenerationRequest(prompt="p", max_tokens=4))
    assert b.chunks == 24 and b.bytes == 24 * wire.CHUNK_BYTES
    echo = wire.answer_bounds(GenerationRequest(prompt="x" * 1000, max_tokens=4, echo=True))
    assert echo.chunks == 25 and echo.bytes == 25 * wire.CHUNK_BYTES + 6000
    reader = wire.ChunkReader(1, chat=False, bounds=b)
    events = [e for _ in range(30) for e in reader.feed(chunk(text="t"))]
    assert [type(e) for e in events] == [Text] * 24 + [Done]
    assert events[-1].finish_reason == "length" and reader.done and reader.truncated
    assert reader.feed(chunk(text="more")) == [] and reader.feed("[DONE]") == []
    big = wire.ChunkReader(2, chat=True, bounds=wire.Bounds(bytes=1000))
    assert big.feed(chunk({"content": "x" * 2000})) == [Done(2, "length", None, 0, 1, 0)]
    usage_only = wire.ChunkReader(3, chat=True, bounds=wire.Bounds(1, 100))
    for _ in range(5):  # chunks without generated output are not counted
        assert usage_only.feed(json.dumps({"choices": [], "usage": {"prompt_tokens": 2}})) == []
    assert not usage_only.done


def test_embeddings_answers_are_bounded_by_their_inputs_and_checked():
    assert wire.embeddings_bound(2) == wire.MAX_ERROR_BYTES + 2 * wire.EMBEDDING_BYTES
    body = json.dumps({"data": [{"index": 1, "embedding": [2, 3]}, {"index": 0, "embedding": [0.5, 1]}],
                       "usage": {"prompt_tokens": 4}}).encode()
    assert wire.embeddings_answer(body, 2) == ([[0.5, 1.0], [2.0, 3.0]], 4)
    for bad, why in [(b"{", "not JSON"), (b'{"data": [{"index": 0, "embedding": [1]}]}', "one vector for each"),
                     (b'{"data": [{"index": 0}, {"index": 1}]}', "list of numbers"),
                     (b'{"data": [{"index": 0, "embedding": [1' + b"0" * 400 + b']}, {"index": 1, "embedding": []}]}',
                      "list of numbers")]:
        with pytest.raises(wire.MalformedStream, match=why) as e:
            wire.embeddings_answer(bad, 2)
        assert e.value.status == 502 and "embeddings answer" in e.value.message


def test_a_listing_takes_only_names_and_at_most_max_listed():
    ids = ["good", "org/model:Q4", "\x1b[31mred", "../../etc", "a/./b", "back\\slash", "bidi\u202eevil", "x" * 257, "",
           "zero\u200bwidth", "good", 7, None]
    found = wire.listing(json.dumps({"data": [{"id": i} for i in ids] + ["not an object"]}).encode())
    assert found is not None and found.ids == ["good", "org/model:Q4"] and found.left_out == 0
    assert found.refused == len(ids) - 3 + 1 and "\\x1b" in found.why
    many = wire.listing(json.dumps({"data": [{"id": f"m{i}"} for i in range(5000)]}).encode())
    assert len(many.ids) == wire.MAX_LISTED and many.left_out == 5000 - wire.MAX_LISTED
    assert wire.listing(b'{"object": "list"}') is None
    with pytest.raises(wire.MalformedStream, match="not JSON"):
        wire.listing(b"<html>")


@pytest.mark.parametrize("header, seconds", [
    ("120", 120.0), (" 5 ", 5.0), ("0", 0.0), ("9" * 400, wire.MAX_RETRY_AFTER), ("86400", wire.MAX_RETRY_AFTER),
    ("Wed, 21 Oct 2015 07:28:00 GMT", None), ("-1", None), ("1.5", None), ("\u0663", None), ("\u00b2", None),
    ("", None), (None, None),
])
def test_retry_after_is_a_small_number_of_seconds_or_nothing(header, seconds):
    assert wire.retry_after(header) == seconds


def test_an_upstream_error_is_shown_escaped_and_its_code_kept_only_when_plain():
    e = wire.error_from(404, json.dumps({"error": {"message": "\x1b[2Jgone\u202e", "code": "model_not_found",
                                                   "param": "model"}}).encode())
    assert e.message == "\\x1b[2Jgone\\u202e" and e.code == "model_not_found" and e.param == "model"
    e = wire.error_from(400, json.dumps({"error": {"message": "m" * 5000, "code": "x" * 100 + "\n",
                                                   "param": "\x1b"}}).encode())
    assert len(e.message) == 501 and e.code is None and e.param is None
    assert wire.error_from(400, b"[" * 50_000).message.startswith("[[[")  # too deep: read as text
    assert "\\x07" in wire.in_band_error({"message": "bell\x07"}).message
