"""The hosted tools' answer shapes of each wire's writer (wire/anthropic_answer.py,
wire/responses/output.py, wire/openai_answer.py), driven through one scripted answer (a web
search, a fetch, an MCP call, then text quoting what they found), whole and streamed: the
body and the folded stream agree, and the official SDKs read both, the streams served from a
loopback HTTP server to the SDKs' own stream readers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anthropic
import openai
import pydantic
from aiohttp import web
from openapi import validate, validate_event

from gateway.models.config import ServerConfig
from gateway.protocol import Start
from gateway.server.events import Observation
from gateway.server.sse import EventStream
from gateway.tools.hosted import CallOutcome, Page, SearchResult, ToolInfo
from gateway.wire import anthropic as wire_anthropic
from gateway.wire import anthropic_answer, openai_answer, responses
from gateway.wire import openai as wire_openai
from gateway.wire.answer import Finish, Piece
from gateway.wire.context import Context
from gateway.wire.readback import read_answer
from gateway.wire.writer import Hosted, HostedResult, Writer

CTX = Context("r1", None, False, ServerConfig(), Observation("r1", "/"))
USER = [{"role": "user", "content": "weather?"}]

RAIN = SearchResult("Paris weather", "https://weather.example/paris",
                    "Paris will see steady rain through the weekend, with highs near twelve degrees.", "2 days ago")
SUN = SearchResult("Lyon", "https://weather.example/lyon", "Lyon stays dry.")
PAGE = Page("https://weather.example/paris/coat", "Coats", "Bring a warm coat to Paris.\nUmbrellas sell out fast.",
            retrieved_at="2025-01-02T03:04:05Z")
SEARCH = Hosted("call_s1", "web_search", "web_search", '{"query": "weather in Paris"}')
FETCH = Hosted("call_f1", "web_fetch", "web_fetch", '{"url": "https://weather.example/paris/coat"}')
TOOL = Hosted("call_m1", "mcp", "lookup", '{"city": "Paris"}', server="docs")
# said before any result: it quotes the search result but cannot cite it
BEFORE = "Paris will see steady rain through the weekend, I guess. "
AFTER = ("As reported, Paris will see steady rain through the weekend, with highs near twelve degrees. "
         "Bring a warm coat to Paris. More at https://weather.example/lyon.")


def script(out: Writer, mcp: bool = True) -> list:
    """open, text, a search, a fetch, (an MCP call,) each followed by a further generation, text
    that quotes what they found, close, end."""
    frames = out.open(Start(1, 10, 0, 0))
    frames += out.feed(Piece("content", BEFORE))
    for call, result in [(SEARCH, HostedResult("call_s1", "web_search", output=[RAIN, SUN])),
                         (FETCH, HostedResult("call_f1", "web_fetch", output=PAGE)),
                         *([(TOOL, HostedResult("call_m1", "mcp", output=CallOutcome("12 degrees")))] if mcp else [])]:
        frames += out.hosted(call)
        frames += out.hosted_result(result)
        frames += out.go_on(Finish("stop", None, 10, 2, 0), Start(2, 20, 10, 0))
    for n in range(0, len(AFTER), 17):
        frames += out.feed(Piece("content", AFTER[n:n + 17]))
    frames += out.close(Finish("stop", None, 20, 5, 0, cached_tokens=10))
    frames += out.end()
    if out.done is not None:
        frames.append((out.done, None))
    return frames


def sse(frames: list) -> bytes:
    return b"".join(EventStream._frame(data if isinstance(data, str) else json.dumps(data), name)
                    for data, name in frames)


@asynccontextmanager
async def serving(frames: list) -> AsyncIterator[str]:
    """A loopback server that answers any POST with ``frames`` as server-sent events."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=sse(frames), content_type="text/event-stream")
    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _anthropic(stream: bool) -> Writer:
    parsed = wire_anthropic.parse({"model": "m", "max_tokens": 50, "messages": USER, "stream": stream})
    return anthropic_answer.Writer(parsed, CTX)


def _responses(stream: bool) -> responses.ResponseBuilder:
    return responses.ResponseBuilder("m", responses.parse({"model": "m", "input": "weather?", "stream": stream}))


def _chat(stream: bool) -> Writer:
    return openai_answer.Writer(wire_openai.parse_chat({"model": "m", "messages": USER, "stream": stream}), CTX,
                                kind="chat")


def agree(route: str, body: dict, frames: list) -> None:
    """The captures' reader reads the whole and the streamed answer alike."""
    whole, streamed = read_answer(route, False, json.dumps(body).encode()), read_answer(route, True, sse(frames))
    for key in ("content", "thinking", "calls", "error"):
        assert whole.get(key) == streamed.get(key), key
    assert whole["content"] == BEFORE + AFTER and not whole["calls"]


async def test_anthropic_server_tools_results_and_citations_whole_and_streamed():
    whole = _anthropic(False)
    script(whole)
    body = whole.body()
    message = anthropic.types.beta.BetaMessage.model_validate(body)
    assert [b.type for b in message.content] == [
        "text", "server_tool_use", "web_search_tool_result", "server_tool_use", "web_fetch_tool_result",
        "mcp_tool_use", "mcp_tool_result", "text"]
    search, found, fetch, fetched, use, told = body["content"][1:7]
    assert search == {"type": "server_tool_use", "id": "srvtoolu_s1", "name": "web_search",
                      "input": {"query": "weather in Paris"}}
    assert found["tool_use_id"] == "srvtoolu_s1" and fetch["input"] == {"url": PAGE.url}
    assert [(r["url"], r["title"], r["page_age"]) for r in found["content"]] == [
        (RAIN.url, "Paris weather", "2 days ago"), (SUN.url, "Lyon", None)]
    assert fetched["content"]["content"]["source"] == {"type": "text", "media_type": "text/plain", "data": PAGE.text}
    assert fetched["content"]["retrieved_at"] == PAGE.retrieved_at
    assert use == {"type": "mcp_tool_use", "id": "mcptoolu_m1", "name": "lookup", "server_name": "docs",
                   "input": {"city": "Paris"}}
    assert told == {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_m1", "is_error": False,
                    "content": [{"type": "text", "text": "12 degrees"}]}
    assert "citations" not in body["content"][0]  # written before the search: it cites nothing
    cites = body["content"][-1]["citations"]
    assert [(c["type"], c["url"]) for c in cites] == [("web_search_result_location", RAIN.url),
                                                      ("web_search_result_location", SUN.url)]  # not the page
    assert cites[0]["cited_text"] == "Paris will see steady rain through the weekend, with highs near twelve degrees"
    assert body["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 1}
    assert body["usage"]["output_tokens"] == 3 * 2 + 5

    out = _anthropic(True)
    frames = script(out)
    adapter = pydantic.TypeAdapter(anthropic.types.beta.BetaRawMessageStreamEvent)
    for data, name in frames:
        if name != "ping":
            assert adapter.validate_python(data).type == name
    async with serving(frames) as url:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0) as client, \
                client.beta.messages.stream(model="m", max_tokens=50, messages=USER) as stream:
            folded = await stream.get_final_message()
    assert [b.model_dump() for b in folded.content] == [b.model_dump() for b in message.content]
    assert folded.usage.server_tool_use is not None and folded.usage.server_tool_use.web_search_requests == 1
    agree("/v1/messages", body, frames)


async def test_anthropic_web_blocks_are_the_plain_sdks_too_and_failures_are_error_blocks():
    out = _anthropic(False)
    script(out, mcp=False)
    message = anthropic.types.Message.model_validate(out.body())
    assert [b.type for b in message.content][1:5] == ["server_tool_use", "web_search_tool_result",
                                                       "server_tool_use", "web_fetch_tool_result"]
    failed = [anthropic_answer.hosted_result_block(HostedResult("call_x", kind, error="no", outcome=outcome))
              for kind, outcome in [("web_search", "max_uses"), ("web_search", "timeout"), ("web_fetch", "refused"),
                                    ("web_fetch", "too_large"), ("web_fetch", None), ("web_fetch", "url_too_long")]]
    assert [b["content"]["error_code"] for b in failed] == ["max_uses_exceeded", "unavailable", "url_not_allowed",
                                                            "content_too_large", "url_not_accessible", "url_too_long"]
    for block in failed:
        anthropic.types.Message.model_validate({**out.body(), "content": [block]})
    broke = anthropic_answer.hosted_result_block(HostedResult("call_m", "mcp", output=CallOutcome("bad", is_error=True)))
    assert broke["is_error"] and broke["content"] == [{"type": "text", "text": "bad"}]
    gone = anthropic_answer.hosted_result_block(HostedResult("call_m", "mcp", error="the server is gone"))
    assert gone["is_error"] and gone["content"][0]["text"] == "the server is gone"


async def test_responses_web_search_mcp_items_and_url_citations_whole_and_streamed():
    whole = _responses(False)
    whole.listed("docs", [ToolInfo("lookup", "Looks a city up", {"type": "object", "properties": {}})])
    script(whole)
    body = whole.body()
    validate(body, "Response")
    parsed = openai.types.responses.Response.model_validate(body)
    assert [i.type for i in parsed.output] == ["mcp_list_tools", "message", "web_search_call", "web_search_call",
                                               "mcp_call", "message"]
    listed, _, search, fetch, call, said = body["output"]
    assert listed["tools"] == [{"name": "lookup", "description": "Looks a city up",
                                "input_schema": {"type": "object", "properties": {}}, "annotations": None}]
    assert listed["server_label"] == "docs" and listed["error"] is None
    assert search == {"type": "web_search_call", "id": "ws_s1", "status": "completed",
                      "action": {"type": "search", "query": "weather in Paris",
                                 "sources": [{"type": "url", "url": RAIN.url}, {"type": "url", "url": SUN.url}]}}
    assert fetch["action"] == {"type": "open_page", "url": PAGE.url} and fetch["id"] == "ws_f1"
    assert call["output"] == "12 degrees" and call["status"] == "completed" and call["arguments"] == TOOL.arguments
    assert body["output"][1]["content"][0]["annotations"] == []  # written before any result
    notes = said["content"][0]["annotations"]
    text = said["content"][0]["text"]
    assert [(n["url"], text[n["start_index"]:n["end_index"]]) for n in notes] == [
        (RAIN.url, "Paris will see steady rain through the weekend, with highs near twelve degrees"),
        (PAGE.url, "Bring a warm coat to Paris"), (SUN.url, "https://weather.example/lyon")]
    assert whole.messages()[-1]["content"] == AFTER  # the history leaves the hosted items out

    out = _responses(True)
    out.listed("docs", [ToolInfo("lookup")])  # before the response opened: told after its first events
    frames = script(out)
    events = [data for data, _ in frames]
    for event in events:
        validate_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.mcp_list_tools.in_progress"]
    assert kinds.count("response.output_text.annotation.added") == 3
    for done in ("response.web_search_call.in_progress", "response.web_search_call.searching",
                 "response.web_search_call.completed", "response.mcp_call_arguments.delta",
                 "response.mcp_call_arguments.done", "response.mcp_call.in_progress", "response.mcp_call.completed",
                 "response.mcp_list_tools.completed"):
        assert done in kinds, done
    async with serving(frames) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client, \
                client.responses.stream(model="m", input="weather?") as stream:
            folded = await stream.get_final_response()
    assert [i.type for i in folded.output] == [i.type for i in parsed.output]
    got = folded.output[-1]
    assert got.type == "message" and got.content[0].type == "output_text"
    assert [a.model_dump() for a in got.content[0].annotations] == [
        a.model_dump() for a in parsed.output[-1].content[0].annotations]  # type: ignore[union-attr]
    agree("/v1/responses", body, frames)


async def test_responses_failures_a_failed_listing_and_an_approval_request():
    out = _responses(True)
    frames = out.open(Start(1, 5, 0, 0))
    frames += out.listed("broken", [], error="the server did not answer")
    frames += out.hosted(SEARCH)
    frames += out.hosted_result(HostedResult("call_s1", "web_search", error="no backend", outcome="error"))
    frames += out.hosted(TOOL)
    frames += out.hosted_result(HostedResult("call_m1", "mcp", output=CallOutcome("denied", is_error=True)))
    frames += out.approval(Hosted("call_m2", "mcp", "delete", '{"all": true}', server="docs"), "mcpr_1")
    frames += out.close(Finish("stop", None, 5, 1, 0))
    for event, _ in frames:
        validate_event(event)
    kinds = [e["type"] for e, _ in frames]
    assert "response.mcp_list_tools.failed" in kinds and "response.mcp_call.failed" in kinds
    assert "response.web_search_call.completed" not in kinds  # a failed search has no event of its own
    body = out.body()
    validate(body, "Response")
    listed, search, call, asked = openai.types.responses.Response.model_validate(body).output
    assert listed.type == "mcp_list_tools" and listed.error == "the server did not answer" and listed.tools == []
    assert search.type == "web_search_call" and search.status == "failed"
    assert call.type == "mcp_call" and call.status == "failed" and call.output is None
    assert body["output"][2]["error"] == {"type": "mcp_tool_execution_error",
                                          "content": [{"type": "text", "text": "denied"}]}
    assert asked.type == "mcp_approval_request" and (asked.id, asked.name, asked.server_label) == (
        "mcpr_1", "delete", "docs")
    approved = responses.output.hosted_item(Hosted("call_m2", "mcp", "delete", "{}", "docs",
                                                   approval_request_id="mcpr_1"))
    assert approved["approval_request_id"] == "mcpr_1"


async def test_chat_completions_cite_what_came_after_a_result_whole_and_streamed():
    whole = _chat(False)
    assert script(whole) == [("[DONE]", None)]  # whole: no frames but the stream's end the script adds
    body = whole.body()
    message = body["choices"][0]["message"]
    assert message["content"] == BEFORE + AFTER
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    notes = parsed.choices[0].message.annotations or []
    assert [(n.url_citation.url, message["content"][n.url_citation.start_index:n.url_citation.end_index])
            for n in notes] == [
        (RAIN.url, "Paris will see steady rain through the weekend, with highs near twelve degrees"),
        (PAGE.url, "Bring a warm coat to Paris"), (SUN.url, "https://weather.example/lyon")]
    assert all(n.url_citation.start_index >= len(BEFORE) for n in notes)  # the text before the search cites nothing

    out = _chat(True)
    frames = script(out)
    assert frames[-3][0]["choices"][0]["delta"] == {"annotations": message["annotations"]}
    async with serving(frames) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client, \
                client.chat.completions.stream(model="m", messages=USER) as stream:  # type: ignore[arg-type]
            folded = await stream.get_final_completion()
    got = folded.choices[0].message
    assert got.content == BEFORE + AFTER
    assert [n.model_dump() for n in got.annotations or []] == [n.model_dump() for n in notes]
    agree("/v1/chat/completions", body, frames)
