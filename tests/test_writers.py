"""The answer writers (gateway/wire/writer.py and one per wire), on their own: each owns its
whole and its streamed form, so the same pieces written both ways read back (wire/readback.py,
the captures' reader) as the same answer; a tool the gateway runs itself, and a second
generation continuing the answer after it, are told in each wire's own documented shapes."""

from __future__ import annotations

import json
from functools import partial

import anthropic
import pydantic
import pytest
from openapi import validate, validate_event

from gateway.base.errors import ApiError, InvalidRequest
from gateway.models.config import ServerConfig
from gateway.protocol import Start
from gateway.server.events import Observation
from gateway.server.sse import EventStream, LineStream
from gateway.tools.hosted import CallOutcome, SearchResult
from gateway.wire import anthropic as wire_anthropic
from gateway.wire import anthropic_answer, fim, ollama, openai_answer, responses
from gateway.wire import openai as wire_openai
from gateway.wire.answer import Call, CallArgs, Finish, Piece
from gateway.wire.context import Context
from gateway.wire.readback import read_answer
from gateway.wire.writer import Hosted, HostedResult, Writer

CTX = Context("r1", None, False, ServerConfig(), Observation("r1", "/"))
USER = [{"role": "user", "content": "hi"}]
ITEMS = [Piece("thinking", "Let me see. "), Piece("thinking", "Two."), Piece("content", "It is "),
         Piece("content", "2."), Call(0, "call_1", "get_weather"), CallArgs(0, '{"city": '), CallArgs(0, '"Paris"}')]
FINISH = Finish("tool_calls", None, 12, 7, 3, cached_tokens=4)


def _openai(stream: bool) -> Writer:
    parsed = wire_openai.parse_chat({"model": "m", "messages": USER, "stream": stream})
    return openai_answer.Writer(parsed, CTX, kind="chat")


def _anthropic(stream: bool) -> Writer:
    parsed = wire_anthropic.parse({"model": "m", "max_tokens": 50, "messages": USER, "stream": stream})
    return anthropic_answer.Writer(parsed, CTX)


def _responses(stream: bool) -> Writer:
    return responses.ResponseBuilder("m", responses.parse({"model": "m", "input": "hi", "stream": stream}))


def _ollama(stream: bool) -> Writer:
    return ollama.Writer(ollama.parse_chat({"model": "m", "messages": USER, "stream": stream}), CTX, chat=True)


WIRES = {"/v1/chat/completions": _openai, "/v1/messages": _anthropic, "/v1/responses": _responses,
         "/api/chat": _ollama}


def written(make, stream: bool, items=ITEMS, finish=FINISH) -> tuple[Writer, list]:
    out = make(stream)
    out.leased("m")
    frames = out.open(Start(1, finish.prompt_tokens, finish.cached_tokens, 0))
    for item in items:
        frames += out.feed(item)
    frames += out.close(finish)
    frames += out.end()
    if out.done is not None:
        frames.append((out.done, None))
    return out, frames


def wire_bytes(out: Writer, frames: list) -> bytes:
    if out.lines:
        return b"".join(LineStream._frame(json.dumps(data), None) for data, _ in frames)
    return b"".join(EventStream._frame(data if isinstance(data, str) else json.dumps(data), name)
                    for data, name in frames)


@pytest.mark.parametrize("route", WIRES)
def test_the_whole_and_the_streamed_answer_read_back_alike(route):
    whole, _ = written(WIRES[route], False)
    streamed, frames = written(WIRES[route], True)
    read_whole = read_answer(route, False, json.dumps(whole.body()).encode())
    read_stream = read_answer(route, True, wire_bytes(streamed, frames))
    for key in ("content", "thinking", "calls", "error"):
        assert read_whole.get(key) == read_stream.get(key), key
    assert read_whole["content"] == "It is 2." and read_whole["thinking"] == "Let me see. Two."
    assert read_whole["error"] is None


def test_a_writer_that_failed_in_a_stream_says_so_in_its_wires_words():
    err = ApiError("the model broke", status=500, code="boom")
    for route, make in WIRES.items():
        out, frames = make(True), []
        frames += out.open(Start(1, 3, 0, 0))
        frames += out.feed(Piece("content", "so far"))
        frames += out.fail(err)
        read = read_answer(route, True, wire_bytes(out, frames))
        assert (read["content"], read["error"]) == ("so far", "the model broke"), route


SEARCH = Hosted("srvtoolu_1", "web_search", "web_search", '{"query": "weather in Paris"}')
FOUND = HostedResult("srvtoolu_1", "web_search", output=[SearchResult("Paris", "https://example.com/", "Rain.")])
TOOL = Hosted("mcp_1", "mcp", "search_docs", '{"q": "lease"}', server="docs")
TOLD = HostedResult("mcp_1", "mcp", output=CallOutcome("Registry.lease holds a model."))


def hosted_answer(out: Writer) -> list:
    """An answer that runs two hosted tools, each followed by a further generation."""
    frames = out.open(Start(1, 10, 0, 0))
    frames += out.feed(Piece("content", "Searching. "))
    frames += out.hosted(SEARCH)
    frames += out.hosted_result(FOUND)
    frames += out.go_on(Finish("stop", None, 10, 3, 0), Start(2, 30, 10, 0))
    frames += out.hosted(TOOL)
    frames += out.hosted_result(TOLD)
    frames += out.go_on(Finish("stop", None, 30, 4, 0, cached_tokens=10), Start(3, 50, 30, 0))
    frames += out.feed(Piece("content", "It rains."))
    frames += out.close(Finish("stop", None, 50, 5, 0, cached_tokens=30))
    return frames


def test_anthropic_tells_hosted_tools_as_its_own_server_and_mcp_blocks():
    for stream in (False, True):
        out = _anthropic(stream)
        frames = hosted_answer(out)
        if not stream:
            body = out.body()
            message = anthropic.types.beta.BetaMessage.model_validate(body)  # the SDK's own reading
            kinds = [b.type for b in message.content]
            assert kinds == ["text", "server_tool_use", "web_search_tool_result", "mcp_tool_use", "mcp_tool_result",
                             "text"]
            assert body["content"][1]["input"] == {"query": "weather in Paris"}
            assert body["content"][3]["server_name"] == "docs"
            assert body["usage"]["output_tokens"] == 3 + 4 + 5  # every generation's
            assert body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"] == 10 + 30 + 50
            continue
        adapter = pydantic.TypeAdapter(anthropic.types.beta.BetaRawMessageStreamEvent)
        assert [name for _, name in frames][:2] == ["message_start", "ping"]  # ping: in no union, as the SDK skips it
        events = [adapter.validate_python(data) for data, _ in frames[:1] + frames[2:]]
        assert [name for _, name in frames[:1] + frames[2:]] == [e.type for e in events]
        starts = [e.content_block.type for e in events if e.type == "content_block_start"]
        assert starts == ["text", "server_tool_use", "web_search_tool_result", "mcp_tool_use", "mcp_tool_result", "text"]
        opened = [e.index for e in events if e.type == "content_block_start"]
        closed = [e.index for e in events if e.type == "content_block_stop"]
        assert opened == closed == list(range(6))  # each block opened and closed once, in order
        assert events[-2].usage.output_tokens == 12


def test_responses_tells_hosted_tools_as_web_search_and_mcp_call_items():
    for stream in (False, True):
        out = _responses(stream)
        frames = hosted_answer(out)
        events = [data for data, _ in frames]
        for event in events:
            validate_event(event)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        body = out.body()
        validate(body, "Response")
        kinds = [item["type"] for item in body["output"]]
        assert kinds == ["message", "web_search_call", "mcp_call", "message"]
        search, call = body["output"][1], body["output"][2]
        assert search["status"] == "completed" and search["action"]["query"] == "weather in Paris"
        assert call["output"] == "Registry.lease holds a model." and call["server_label"] == "docs"
        assert body["usage"]["output_tokens"] == 12 and body["usage"]["input_tokens"] == 90


def test_a_hosted_tool_that_failed_is_told_as_failed():
    out = _responses(True)
    out.open(Start(1, 1, 0, 0))
    out.hosted(TOOL)
    frames = out.hosted_result(HostedResult("mcp_1", "mcp", error="the server is gone"))
    for event, _ in frames:
        validate_event(event)
    assert frames[0][0]["type"] == "response.mcp_call.failed"
    assert frames[-1][0]["item"]["error"]["content"][0]["text"] == "the server is gone"
    block = anthropic_answer.hosted_result_block(HostedResult("x", "web_search", error="unavailable"))
    assert block["content"] == {"type": "web_search_tool_result_error", "error_code": "unavailable"}


def test_wires_with_no_form_for_a_hosted_tool_tell_nothing_and_count_every_generation():
    for make in (_openai, _ollama):
        out = make(False)
        hosted_answer(out)
        body = out.body()
        text = body["choices"][0]["message"]["content"] if "choices" in body else body["message"]["content"]
        assert text == "Searching. It rains."
    assert _ollama_counts() == (90, 12)


def _ollama_counts() -> tuple[int, int]:
    out = _ollama(False)
    hosted_answer(out)
    return out.body()["prompt_eval_count"], out.body()["eval_count"]


def test_infill_answers_in_llama_servers_completion_shape():
    parsed = fim.parse_infill({"input_prefix": "def f():", "input_suffix": "\n", "stream": True})
    streamed, frames = written(partial(lambda s, p: fim.InfillWriter(p, CTX), p=parsed), True,
                               [Piece("content", " return 1")], Finish("stop", None, 5, 3, 0))
    assert [data["content"] for data, _ in frames] == [" return 1", ""] and frames[-1][0]["stop"] is True
    parsed.stream = False
    whole, _ = written(lambda s: fim.InfillWriter(parsed, CTX), False, [Piece("content", " return 1")],
                       Finish("stop", None, 5, 3, 0))
    assert whole.body()["content"] == " return 1" and whole.body()["tokens_predicted"] == 3


@pytest.mark.parametrize("body", [
    {"messages": [5]}, {"messages": [{"role": "wizard", "content": "x"}]}])
def test_openai_and_ollama_say_the_same_of_the_same_broken_message(body):
    told = []
    for parse in (wire_openai.parse_chat, ollama.parse_chat):
        with pytest.raises(InvalidRequest) as e:
            parse({"model": "m", **body})
        told.append((e.value.message, e.value.param))
    (said, param), (also, same) = told
    assert param == same
    # the same words; only the roles each wire takes differ
    assert said.split(" must be one of ")[0] == also.split(" must be one of ")[0] and said.startswith("`")
    assert (said == also) == (" must be one of " not in said)
