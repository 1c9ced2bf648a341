"""Hosted tools on the wire (issue 67): each wire's shape of web search, web fetch and MCP read into
``tools.hosted.Ask`` (``Parsed.hosted``), every bad field a 400 naming its param in the wire's own
words, a hosted tool's earlier calls and results read into the model's conversation, and
Responses' approvals read into ``Parsed.approvals``. Parsing does not depend on the server's
configuration: which of the Asks run is the pipeline's question."""

import json

import anthropic
import openai
import pytest

from gateway.base.errors import InvalidRequest
from gateway.models.config import ServerConfig
from gateway.protocol import Start
from gateway.server.events import Observation
from gateway.tools.hosted import Approval, Ask, CallOutcome, Kind, SearchResult
from gateway.wire import anthropic as anth
from gateway.wire import anthropic_answer, asks, responses
from gateway.wire import openai as oai
from gateway.wire.answer import Finish, Piece
from gateway.wire.context import Context
from gateway.wire.writer import Hosted, HostedResult

ASK = [{"role": "user", "content": "Weather in Paris?"}]
SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3, "allowed_domains": ["example.com"],
          "user_location": {"type": "approximate", "city": "Paris", "country": "FR"}}
FETCH = {"type": "web_fetch_20250910", "name": "web_fetch", "blocked_domains": ["evil.example"],
         "citations": {"enabled": True}, "max_content_tokens": 1000}
SERVER = {"type": "url", "url": "https://mcp.example/mcp", "name": "docs", "authorization_token": "tok"}
CUSTOM = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def anth_parse(**body):
    return anth.parse({"model": "m", "max_tokens": 64, "messages": ASK, **body})


def resp_parse(**body):
    return responses.parse({"model": "m", "input": "hi", **body})


def chat_parse(**body):
    return oai.parse_chat({"model": "m", "messages": ASK, **body})


# --- Anthropic ---------------------------------------------------------------------------------

def test_anthropic_web_search_and_fetch_are_asks_of_every_dated_version():
    p = anth_parse(tools=[SEARCH, CUSTOM, FETCH, {"type": "web_search_20260209", "name": "web_search"},
                          {"type": "code_execution_20250825", "name": "code_execution"}])
    search, fetch, later = p.hosted
    assert search == Ask(Kind.WEB_SEARCH, "web_search_20250305", param="tools.0", name="web_search", max_uses=3,
                         allowed_domains=("example.com",))
    assert fetch == Ask(Kind.WEB_FETCH, "web_fetch_20250910", param="tools.2", name="web_fetch",
                        blocked_domains=("evil.example",))
    assert (later.kind, later.type, later.param) == (Kind.WEB_SEARCH, "web_search_20260209", "tools.3")
    assert p.dropped == ["code_execution_20250825"]  # a hosted tool the gateway never runs: dropped as today
    assert [t["function"]["name"] for t in p.request.tools] == ["get_weather"]  # the Asks are the pipeline's to offer
    assert anth_parse(tools=[SEARCH]).request.tools is None


def test_anthropic_mcp_servers_in_both_beta_forms():
    old = anth_parse(mcp_servers=[SERVER, {"type": "url", "url": "http://127.0.0.1:9/mcp", "name": "local",
                                           "tool_configuration": {"enabled": True, "allowed_tools": ["a", "b"]}},
                                  {"type": "url", "url": "https://off.example/", "name": "off",
                                   "tool_configuration": {"enabled": False}}])
    docs, local = old.hosted  # "off" is turned off: no Ask
    assert docs == Ask(Kind.MCP, "mcp", param="mcp_servers.0", server="docs", url="https://mcp.example/mcp",
                       headers={"Authorization": "Bearer tok"})
    assert (local.server, local.headers, local.allowed_tools) == ("local", {}, ("a", "b"))
    assert "tok" not in repr(docs)  # a token is not shown where an Ask is logged

    servers = [SERVER, {**SERVER, "name": "cal"}, {**SERVER, "name": "all"}]
    new = anth_parse(mcp_servers=servers, tools=[
        {"type": "mcp_toolset", "mcp_server_name": "docs", "default_config": {"enabled": False},
         "configs": {"search": {"enabled": True}, "write": {"enabled": False}, "read": {"defer_loading": True}}},
        {"type": "mcp_toolset", "mcp_server_name": "cal", "configs": {"delete_all": {"enabled": False}}},
        {"type": "mcp_toolset", "mcp_server_name": "all"}, CUSTOM])
    allow, deny, every = new.hosted
    assert (allow.type, allow.param, allow.server, allow.allowed_tools, allow.denied_tools) == (
        "mcp_toolset", "tools.0", "docs", ("search",), ())
    assert (deny.server, deny.allowed_tools, deny.denied_tools) == ("cal", None, ("delete_all",))
    assert (every.server, every.allowed_tools, every.denied_tools) == ("all", None, ())
    assert new.dropped == [] and [t["function"]["name"] for t in new.request.tools] == ["get_weather"]


TOOLSET = {"type": "mcp_toolset", "mcp_server_name": "docs"}


@pytest.mark.parametrize("body, param", [
    ({"tools": [{**SEARCH, "max_uses": 0}]}, "tools.0.max_uses"),
    ({"tools": [{**SEARCH, "max_uses": True}]}, "tools.0.max_uses"),
    ({"tools": [{**SEARCH, "name": "search"}]}, "tools.0.name"),
    ({"tools": [{**SEARCH, "blocked_domains": ["x.example"]}]}, "tools.0"),  # allowed and blocked: not both
    ({"tools": [{**SEARCH, "allowed_domains": "example.com"}]}, "tools.0.allowed_domains"),
    ({"tools": [{**SEARCH, "allowed_domains": ["https://example.com"]}]}, "tools.0.allowed_domains.0"),
    ({"tools": [{**SEARCH, "allowed_domains": ["a.example"] * 300}]}, "tools.0.allowed_domains"),
    ({"tools": [{**SEARCH, "allowed_domains": ["x" * 300]}]}, "tools.0.allowed_domains.0"),
    ({"tools": [{**SEARCH, "user_location": {"type": "exact"}}]}, "tools.0.user_location.type"),
    ({"tools": [{**SEARCH, "user_location": {"type": "approximate", "city": 5}}]}, "tools.0.user_location.city"),
    ({"tools": [CUSTOM, {**FETCH, "max_content_tokens": -1}]}, "tools.1.max_content_tokens"),
    ({"tools": [{**FETCH, "citations": {"enabled": "yes"}}]}, "tools.0.citations.enabled"),
    ({"tools": [{**FETCH, "name": "web_search"}]}, "tools.0.name"),
    ({"mcp_servers": {"docs": SERVER}}, "mcp_servers"),
    ({"mcp_servers": [SERVER] * 17}, "mcp_servers"),
    ({"mcp_servers": [{**SERVER, "type": "stdio"}]}, "mcp_servers.0.type"),
    ({"mcp_servers": [{**SERVER, "name": "has space"}]}, "mcp_servers.0.name"),
    ({"mcp_servers": [{**SERVER, "url": "file:///etc/passwd"}]}, "mcp_servers.0.url"),
    ({"mcp_servers": [{**SERVER, "url": None}]}, "mcp_servers.0.url"),
    ({"mcp_servers": [{**SERVER, "authorization_token": "a\r\nX-Evil: 1"}]}, "mcp_servers.0.authorization_token"),
    ({"mcp_servers": [{**SERVER, "tool_configuration": {"allowed_tools": "a"}}]},
     "mcp_servers.0.tool_configuration.allowed_tools"),
    ({"mcp_servers": [{**SERVER, "tool_configuration": {"enabled": 1}}]}, "mcp_servers.0.tool_configuration.enabled"),
    ({"mcp_servers": [SERVER, SERVER]}, "mcp_servers.1.name"),
    ({"mcp_servers": [SERVER], "tools": [{**TOOLSET, "mcp_server_name": "other"}]}, "tools.0.mcp_server_name"),
    ({"tools": [TOOLSET]}, "tools.0.mcp_server_name"),
    ({"mcp_servers": [SERVER], "tools": [TOOLSET, TOOLSET]}, "tools.1.mcp_server_name"),
    ({"mcp_servers": [SERVER, {**SERVER, "name": "b"}], "tools": [TOOLSET]}, "mcp_servers.1.name"),
    ({"mcp_servers": [SERVER], "tools": [{**TOOLSET, "default_config": {"enabled": "no"}}]},
     "tools.0.default_config.enabled"),
    ({"mcp_servers": [SERVER], "tools": [{**TOOLSET, "configs": {"a": {"enabled": 0}}}]}, "tools.0.configs.a.enabled"),
    ({"mcp_servers": [SERVER], "tools": [{**TOOLSET, "configs": {"a": True}}]}, "tools.0.configs.a"),
])
def test_anthropic_bad_hosted_fields_name_their_param(body, param):
    with pytest.raises(InvalidRequest) as e:
        anth_parse(**body)
    assert e.value.param == param and e.value.status == 400 and e.value.message.startswith(param + ":")


def test_anthropic_hosted_calls_in_history_are_calls_and_tool_messages():
    content = [
        {"type": "thinking", "thinking": "Let me look.", "signature": "s"},
        {"type": "text", "text": "Searching. "},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "paris weather"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
            {"type": "web_search_result", "title": "Paris", "url": "https://example.com/paris",
             "encrypted_content": "opaque", "page_age": "today"},
            {"type": "web_search_result", "title": "Météo", "url": "https://example.org/", "encrypted_content": ""}]},
        {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_fetch", "input": {"url": "https://example.com/"}},
        {"type": "web_fetch_tool_result", "tool_use_id": "srvtoolu_2", "content": {
            "type": "web_fetch_result", "url": "https://example.com/", "retrieved_at": "2025-01-01T00:00:00Z",
            "content": {"type": "document", "title": "Example", "source": {
                "type": "text", "media_type": "text/plain", "data": "It rains."}}}},
        {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "lookup", "server_name": "docs", "input": {"q": "x"}},
        {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "is_error": True,
         "content": [{"type": "text", "text": "no such page"}]},
        {"type": "server_tool_use", "id": "srvtoolu_3", "name": "web_search", "input": {"query": "y"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_3",
         "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}},
        {"type": "text", "text": "It rains."},
        {"type": "server_tool_use", "id": "srvtoolu_4", "name": "web_search", "input": {"query": "cut"}},  # no result
    ]
    messages = anth_parse(messages=[*ASK, {"role": "assistant", "content": content},
                                    {"role": "user", "content": "Thanks"}]).request.messages

    def call(cid, name, args):
        return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}

    assert messages[1] == {"role": "assistant", "content": "Searching. ", "reasoning_content": "Let me look.",
                           "thinking": "Let me look.",
                           "tool_calls": [call("srvtoolu_1", "web_search", {"query": "paris weather"})]}
    assert messages[2] == {"role": "tool", "tool_call_id": "srvtoolu_1", "name": "web_search",
                           "content": "1. Paris\n   https://example.com/paris\n2. Météo\n   https://example.org/"}
    assert messages[3]["tool_calls"] == [call("srvtoolu_2", "web_fetch", {"url": "https://example.com/"})]
    assert messages[3]["content"] == "" and "thinking" not in messages[3]
    assert messages[4]["content"] == "Example\nhttps://example.com/\n\nIt rains."
    assert messages[5]["tool_calls"] == [call("mcptoolu_1", "docs_lookup", {"q": "x"})]
    assert messages[6] == {"role": "tool", "tool_call_id": "mcptoolu_1", "name": "docs_lookup",
                           "content": "Error: no such page"}
    assert messages[8]["content"] == "Error: max_uses_exceeded"
    assert messages[9] == {"role": "assistant", "content": "It rains."}  # the call with no result is left out
    assert messages[10] == {"role": "user", "content": "Thanks"} and len(messages) == 11


def test_anthropic_reads_back_what_its_writer_wrote():
    parsed = anth_parse()
    out = anthropic_answer.Writer(parsed, Context("r1", None, False, ServerConfig(), Observation("r1", "/")))
    out.open(Start(1, 10, 0, 0))
    out.feed(Piece("content", "Searching. "))
    out.hosted(Hosted("srvtoolu_1", "web_search", "web_search", '{"query": "weather in Paris"}'))
    out.hosted_result(HostedResult("srvtoolu_1", "web_search", output=[SearchResult("Paris", "https://example.com/")]))
    out.hosted(Hosted("mcp_1", "mcp", "search_docs", '{"q": "lease"}', server="docs"))
    out.hosted_result(HostedResult("mcp_1", "mcp", output=CallOutcome("Registry.lease holds a model.")))
    out.feed(Piece("content", "Done."))
    out.close(Finish("stop", None, 10, 3, 0))
    answer = out.body()["content"]
    messages = anth_parse(messages=[*ASK, {"role": "assistant", "content": answer}]).request.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "1. Paris\n   https://example.com/"
    assert messages[3]["tool_calls"][0]["function"] == {"name": "docs_search_docs", "arguments": {"q": "lease"}}
    assert messages[4]["content"] == "Registry.lease holds a model." and messages[5]["content"] == "Done."


@pytest.mark.parametrize("content, param", [
    ([{"type": "web_search_tool_result", "tool_use_id": "nope", "content": []}], "messages.1.content.0.tool_use_id"),
    ([{"type": "server_tool_use", "id": "s", "name": "code_execution", "input": {}}], "messages.1.content.0.name"),
    ([{"type": "server_tool_use", "id": "s", "name": "web_search", "input": []}], "messages.1.content.0.input"),
    ([{"type": "mcp_tool_use", "id": "m", "name": "t", "input": {}}], "messages.1.content.0.server_name"),
    ([{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
      {"type": "web_search_tool_result", "tool_use_id": "s", "content": [{"type": "web_search_result", "url": 1}]}],
     "messages.1.content.1.content.0.title"),
    ([{"type": "server_tool_use", "id": "s", "name": "web_fetch", "input": {}},
      {"type": "web_fetch_tool_result", "tool_use_id": "s", "content": "text"}], "messages.1.content.1.content"),
    ([{"type": "mcp_tool_use", "id": "m", "name": "t", "server_name": "d", "input": {}},
      {"type": "mcp_tool_result", "tool_use_id": "m", "is_error": "no"}], "messages.1.content.1.is_error"),
])
def test_anthropic_bad_history_blocks_name_their_param(content, param):
    with pytest.raises(InvalidRequest) as e:
        anth_parse(messages=[*ASK, {"role": "assistant", "content": content}])
    assert e.value.param == param


# --- Responses ---------------------------------------------------------------------------------

MCP = {"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example/mcp", "server_description": "Docs",
       "headers": {"X-Key": "k"}, "authorization": "tok", "allowed_tools": ["search", "read"]}


def test_responses_web_search_and_mcp_are_asks():
    p = resp_parse(tools=[{"type": "web_search", "filters": {"allowed_domains": ["example.com"]},
                           "search_context_size": "low", "user_location": {"type": "approximate", "city": "Paris"}},
                          {"type": "web_search_preview"}, {"type": "web_search_preview_2025_03_11"},
                          {"type": "web_search_2025_08_26"}, MCP,
                          {"type": "mcp", "server_label": "cfg", "require_approval": "never",
                           "allowed_tools": {"tool_names": ["a"]}},
                          {"type": "mcp", "server_label": "gmail", "connector_id": "connector_gmail"},
                          {"type": "file_search", "vector_store_ids": ["v"]}])
    assert [(a.kind, a.type, a.param) for a in p.hosted[:4]] == [
        (Kind.WEB_SEARCH, "web_search", "tools[0]"), (Kind.WEB_SEARCH, "web_search_preview", "tools[1]"),
        (Kind.WEB_SEARCH, "web_search_preview_2025_03_11", "tools[2]"),
        (Kind.WEB_SEARCH, "web_search_2025_08_26", "tools[3]")]
    assert p.hosted[0].allowed_domains == ("example.com",)
    docs, cfg = p.hosted[4:]
    assert docs == Ask(Kind.MCP, "mcp", param="tools[4]", server="docs", url="https://mcp.example/mcp",
                       headers={"X-Key": "k", "Authorization": "Bearer tok"}, allowed_tools=("search", "read"),
                       approval=("*",))  # OpenAI's default: every call waits for approval
    assert (cfg.server, cfg.url, cfg.allowed_tools, cfg.approval) == ("cfg", None, ("a",), ())
    assert p.dropped == ["mcp", "file_search"]  # a connector is OpenAI's own: dropped, as file search
    echoed = [t for t in p.echo["tools"] if t["type"] == "mcp"]
    assert [t["server_label"] for t in echoed] == ["docs", "cfg"] and "authorization" not in echoed[0]
    assert "headers" not in echoed[0]  # the response repeats no secret


@pytest.mark.parametrize("approval, waits, exempt", [
    (None, ("*",), ()), ("always", ("*",), ()), ("never", (), ()),
    ({"always": {"tool_names": ["write"]}}, ("write",), ()),
    ({"always": {"tool_names": ["write"]}, "never": {"tool_names": ["read"]}}, ("write",), ()),
    ({"never": {"tool_names": ["read", "list"]}}, ("*",), ("read", "list")),
    ({"never": {"read_only": True}}, ("*",), ()),  # the servers' annotations are not read: every call waits
    ({"always": {"read_only": True}}, ("*",), ()),
])
def test_responses_require_approval(approval, waits, exempt):
    tool = {"type": "mcp", "server_label": "docs", **({} if approval is None else {"require_approval": approval})}
    [ask] = resp_parse(tools=[tool]).hosted
    assert (ask.approval, ask.approval_exempt) == (waits, exempt)


def test_a_hosted_tool_choice_still_reads():
    for choice in ({"type": "web_search_preview"}, {"type": "mcp", "server_label": "docs", "name": "search"}):
        p = resp_parse(tools=[{"type": "web_search_preview"}, {"type": "mcp", "server_label": "docs"}],
                       tool_choice=choice)
        assert len(p.hosted) == 2 and p.request.tools is None


@pytest.mark.parametrize("tool, param", [
    ({"type": "web_search", "filters": {"allowed_domains": "example.com"}}, "tools[0].filters.allowed_domains"),
    ({"type": "web_search", "filters": {"allowed_domains": [5]}}, "tools[0].filters.allowed_domains[0]"),
    ({"type": "web_search", "filters": []}, "tools[0].filters"),
    ({"type": "web_search", "search_context_size": "huge"}, "tools[0].search_context_size"),
    ({"type": "web_search", "user_location": {"type": "exact"}}, "tools[0].user_location.type"),
    ({"type": "web_search", "external_web_access": "no"}, "tools[0].external_web_access"),
    ({"type": "mcp"}, "tools[0].server_label"),
    ({"type": "mcp", "server_label": "a b"}, "tools[0].server_label"),
    ({"type": "mcp", "server_label": "d", "server_url": "ftp://x"}, "tools[0].server_url"),
    ({"type": "mcp", "server_label": "d", "server_url": "http://" + "x" * 3000}, "tools[0].server_url"),
    ({"type": "mcp", "server_label": "d", "headers": {"Bad Name": "v"}}, "tools[0].headers"),
    ({"type": "mcp", "server_label": "d", "headers": {"X": "a\nb"}}, "tools[0].headers.X"),
    ({"type": "mcp", "server_label": "d", "headers": {f"h{i}": "v" for i in range(40)}}, "tools[0].headers"),
    ({"type": "mcp", "server_label": "d", "authorization": 5}, "tools[0].authorization"),
    ({"type": "mcp", "server_label": "d", "allowed_tools": "all"}, "tools[0].allowed_tools"),
    ({"type": "mcp", "server_label": "d", "allowed_tools": [""]}, "tools[0].allowed_tools[0]"),
    ({"type": "mcp", "server_label": "d", "allowed_tools": {"read_only": True}}, "tools[0].allowed_tools.read_only"),
    ({"type": "mcp", "server_label": "d", "allowed_tools": {"tool_names": "a"}}, "tools[0].allowed_tools.tool_names"),
    ({"type": "mcp", "server_label": "d", "require_approval": "sometimes"}, "tools[0].require_approval"),
    ({"type": "mcp", "server_label": "d", "require_approval": {"always": {"tool_names": [1]}}},
     "tools[0].require_approval.always.tool_names[0]"),
    ({"type": "mcp", "server_label": "d", "connector_id": 5}, "tools[0].connector_id"),
])
def test_responses_bad_hosted_fields_name_their_param(tool, param):
    with pytest.raises(InvalidRequest) as e:
        resp_parse(tools=[tool])
    assert e.value.param == param and e.value.status == 400 and f"`{param}`" in e.value.message


def test_responses_one_label_per_server():
    with pytest.raises(InvalidRequest) as e:
        resp_parse(tools=[{"type": "mcp", "server_label": "d"}, {"type": "mcp", "server_label": "d"}])
    assert e.value.param == "tools[1].server_label"


REQUEST = {"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "docs", "name": "write",
           "arguments": '{"page": "x"}'}


def test_responses_hosted_items_in_history_and_approvals():
    items = [
        {"type": "message", "role": "user", "content": "find"},
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "docs", "tools": [{"name": "search",
                                                                                     "input_schema": {}}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Search first."}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "paris", "sources": [{"type": "url", "url": "https://a.example/"}]}},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "docs", "name": "search", "arguments": '{"q": "x"}',
         "output": "found it"},
        {"type": "mcp_call", "id": "mcp_2", "server_label": "docs", "name": "read", "arguments": "{}",
         "error": {"type": "mcp_protocol_error", "code": -1, "message": "gone"}},
        {"type": "mcp_call", "id": "mcp_3", "server_label": "docs", "name": "read", "arguments": "{}",
         "status": "calling"},  # no outcome: nothing for the model
        REQUEST,
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True},
        {"type": "mcp_approval_response", "approval_request_id": "mcpr_9", "approve": False, "reason": "no"},
    ]
    p = resp_parse(input=items)
    messages = p.request.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "web_search", "arguments": {"query": "paris"}}
    assert messages[1]["thinking"] == "Search first."
    assert messages[2]["content"] == "1. https://a.example/\n   https://a.example/"
    assert messages[3]["tool_calls"][0]["function"] == {"name": "docs_search", "arguments": {"q": "x"}}
    assert messages[4] == {"role": "tool", "tool_call_id": "mcp_1", "name": "docs_search", "content": "found it"}
    assert messages[6]["content"] == "Error: gone"
    assert p.approvals == [Approval("mcpr_1", True, None, "docs", "write", '{"page": "x"}'),
                           Approval("mcpr_9", False, "no")]
    # with previous_response_id, the request is in the previous response's output
    answer = [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": False}]
    assert responses.approvals(answer, [REQUEST]) == [Approval("mcpr_1", False, None, "docs", "write",
                                                               '{"page": "x"}')]
    assert resp_parse(input=answer, previous_response_id="resp_1").approvals == []  # read once it is known


@pytest.mark.parametrize("item, param", [
    ({"type": "mcp_approval_response", "approval_request_id": 5, "approve": True}, "input[0].approval_request_id"),
    ({"type": "mcp_approval_response", "approval_request_id": "a", "approve": "yes"}, "input[0].approve"),
    ({"type": "mcp_approval_response", "approval_request_id": "a", "approve": True, "reason": 1}, "input[0].reason"),
    ({"type": "mcp_call", "id": "m", "server_label": "d", "name": "t", "arguments": "{oops", "output": "x"},
     "input[0].arguments"),
    ({"type": "mcp_call", "id": "m", "server_label": "d", "name": "t", "arguments": "[]", "output": "x"},
     "input[0].arguments"),
    ({"type": "mcp_call", "id": "m", "name": "t", "arguments": "{}", "output": "x"}, "input[0].server_label"),
    ({"type": "mcp_call", "id": "m", "server_label": "d", "name": "t", "arguments": "{}", "output": 5},
     "input[0].output"),
    ({"type": "web_search_call", "status": "completed"}, "input[0].id"),
])
def test_responses_bad_hosted_items_name_their_param(item, param):
    with pytest.raises(InvalidRequest) as e:
        resp_parse(input=[item])
    assert e.value.param == param


def test_too_many_approvals_are_refused():
    item = {"type": "mcp_approval_response", "approval_request_id": "a", "approve": True}
    with pytest.raises(InvalidRequest):
        resp_parse(input=[item] * 129)


# --- chat completions --------------------------------------------------------------------------

def test_chat_web_search_options_and_hosted_tools():
    p = chat_parse(web_search_options={"search_context_size": "high", "user_location": {
        "type": "approximate", "approximate": {"city": "Paris", "country": "FR"}}},
        tools=[{"type": "function", "function": {"name": "f"}}, {"type": "web_search"},
               {"type": "mcp", "server_label": "docs", "require_approval": "never"}])
    search, web, mcp = p.hosted
    assert search == Ask(Kind.WEB_SEARCH, "web_search_options", param="web_search_options")
    assert (web.type, web.param, mcp.server, mcp.param) == ("web_search", "tools[1]", "docs", "tools[2]")
    assert [t["function"]["name"] for t in p.request.tools] == ["f"]
    assert chat_parse(web_search_options={}).hosted[0].type == "web_search_options"
    assert chat_parse(tools=[{"type": "web_search"}]).request.tools is None


@pytest.mark.parametrize("body, param", [
    ({"web_search_options": "on"}, "web_search_options"),
    ({"web_search_options": {"search_context_size": "max"}}, "web_search_options.search_context_size"),
    ({"web_search_options": {"user_location": {"type": "approximate"}}}, "web_search_options.user_location.approximate"),
    ({"web_search_options": {"user_location": {"type": "approximate", "approximate": {"city": 1}}}},
     "web_search_options.user_location.approximate.city"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),  # a type the gateway does not run: still a 400
    ({"tools": [{"type": "mcp", "server_label": "docs", "server_url": "nope"}]}, "tools[0].server_url"),
])
def test_chat_bad_hosted_fields_name_their_param(body, param):
    with pytest.raises(InvalidRequest) as e:
        chat_parse(**body)
    assert e.value.param == param


def test_responses_runs_is_what_chat_accepts():
    assert asks.RESPONSES_RUNS == {"web_search", "web_search_2025_08_26", "web_search_preview",
                                   "web_search_preview_2025_03_11", "mcp"}


# --- through the real app, driven by the official SDKs -----------------------------------------

@pytest.fixture
async def base_url(aiohttp_client, tmp_path, write_config):
    from gateway.app import create_app
    from gateway.models import testmodels as tm
    from gateway.models.config import load_config

    tm.plain(tmp_path / "plain.gguf", ["It", " rains", "."])
    client = await aiohttp_client(create_app(load_config(write_config(f"models:\n  plain: {tmp_path}/plain.gguf\n"))))
    return str(client.make_url("")).rstrip("/")


async def test_bad_hosted_fields_are_each_wires_own_400(base_url):
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0) as c:
        with pytest.raises(anthropic.BadRequestError) as e:
            await c.beta.messages.create(model="plain", max_tokens=20, messages=ASK, betas=["mcp-client-2025-11-20"],
                                         mcp_servers=[SERVER], tools=[{**TOOLSET, "mcp_server_name": "nope"}])
        assert e.value.body["error"]["message"].startswith("tools.0.mcp_server_name:")
        with pytest.raises(anthropic.BadRequestError) as e:
            await c.messages.create(model="plain", max_tokens=20, messages=ASK, tools=[{**SEARCH, "max_uses": 0}])
        assert e.value.body["error"]["type"] == "invalid_request_error"
        assert e.value.body["error"]["message"].startswith("tools.0.max_uses:")
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as e:
            await c.responses.create(model="plain", input="hi", tools=[
                {"type": "mcp", "server_label": "docs", "server_url": "https://x.example/", "require_approval": "maybe"}])
        assert e.value.param == "tools[0].require_approval"
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="plain", messages=ASK,
                                            web_search_options={"search_context_size": "huge"})
        assert e.value.param == "web_search_options.search_context_size"


async def test_hosted_tools_are_accepted_by_every_wire(base_url):
    """Asked for and not refused; whether they run is the pipeline's (here none is configured)."""
    async with anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0) as c:
        history = [*ASK, {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "paris"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                {"type": "web_search_result", "title": "P", "url": "https://p.example/", "encrypted_content": "e"}]},
            {"type": "text", "text": "Sunny."}]}, {"role": "user", "content": "And tomorrow?"}]
        message = await c.beta.messages.create(model="plain", max_tokens=20, messages=history,
                                               betas=["mcp-client-2025-11-20"], mcp_servers=[SERVER],
                                               tools=[SEARCH, FETCH, TOOLSET])
        assert message.content[-1].text == "It rains."
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as c:
        response = await c.responses.create(model="plain", input="hi", tools=[{"type": "web_search"}, MCP])
        assert response.output_text == "It rains."
        assert json.loads(response.model_dump_json())["tools"][1]["server_label"] == "docs"
        chat = await c.chat.completions.create(model="plain", messages=ASK, web_search_options={},
                                               tools=[{"type": "web_search"}])
        assert chat.choices[0].message.content == "It rains."
