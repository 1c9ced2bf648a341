"""The Responses wire as Codex uses it (gateway/wire/responses/), on its own: namespace and
custom tools flattened for the model and named back, hosted tools dropped, the reasoning summary
and the sealed reasoning, and the fields Codex sends that change nothing."""

import base64
import json

import pytest
from openapi import validate, validate_event

from gateway.base.errors import InvalidRequest
from gateway.protocol import GenerationRequest
from gateway.wire import media as wire_media
from gateway.wire import responses
from gateway.wire.answer import Call, CallArgs, Finish, Piece
from gateway.wire.media import MARKER
from gateway.wire.tools import IMAGE_NOTE

SEARCH = {"type": "function", "name": "search", "description": "Search the docs",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
DOCS = {"type": "namespace", "name": "mcp__docs__", "description": "The docs server", "tools": [SEARCH]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"*** Begin Patch\""}}
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command", "strict": False,
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
HOSTED = [{"type": "web_search", "external_web_access": False}, {"type": "image_generation"},
          {"type": "web_search_preview"}, {"type": "local_shell"}, {"type": "web_search"}]

FINISH = Finish("stop", None, 10, 5, 3)


def parse(**fields):
    return responses.parse({"model": "m", "input": "hi", **fields})


def run(parsed, items):
    builder = responses.ResponseBuilder("m", parsed)
    frames = builder.open()
    for item in items:
        frames += builder.feed(item)
    frames += builder.close(FINISH)
    body = builder.body()
    assert all(name == event["type"] for event, name in frames)  # each sent under its type's name
    events = [event for event, _ in frames]
    for event in events:
        validate_event(event)
    validate(body, "Response")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return builder, events, body


def test_codex_flat_names():
    assert responses.flat_name("mcp__docs__", "_search") == "mcp__docs__search"
    assert responses.flat_name("collab", "spawn") == "collab__spawn"
    assert responses.flat_name(None, "exec_command") == "exec_command"


def test_namespaces_are_flattened_custom_tools_take_text_and_hosted_tools_are_dropped():
    parsed = parse(tools=[EXEC, DOCS, PATCH, *HOSTED])
    names = [t["function"]["name"] for t in parsed.request.tools]
    assert names == ["exec_command", "mcp__docs__search", "apply_patch"]
    # issue 67: the web searches the gateway can run are asked for; Codex's cached one (no live access) stays dropped
    assert parsed.dropped == ["web_search", "image_generation", "local_shell"]
    assert [(a.type, a.param) for a in parsed.hosted] == [("web_search_preview", "tools[5]"), ("web_search", "tools[7]")]
    patch = parsed.request.tools[2]["function"]
    assert patch["parameters"]["properties"] == {"input": {"type": "string"}}
    assert "Apply a patch" in patch["description"] and "*** Begin Patch" in patch["description"]
    assert parsed.origins == {"mcp__docs__search": responses.ToolOrigin("search", "mcp__docs__"),
                              "apply_patch": responses.ToolOrigin("apply_patch", None, custom=True)}
    echo = parsed.echo["tools"]
    assert [t["type"] for t in echo] == ["function", "namespace", "custom", "web_search_preview", "web_search"]


def test_only_hosted_tools_leave_no_tools_at_all():
    parsed = parse(tools=HOSTED)
    assert parsed.request.tools is None and parsed.dropped[0] == "web_search"


@pytest.mark.parametrize("tools, param", [
    ([{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}], "tools[0].tools[0].type"),
    ([{"type": "namespace", "name": "bad name", "tools": [SEARCH]}], "tools[0].name"),
    ([{"type": "namespace", "name": "ns", "tools": "x"}], "tools[0].tools"),
    ([{"type": "namespace", "name": "ns", "tools": [{**SEARCH, "name": None}]}], "tools[0].tools[0].name"),
    ([{"type": "Web Search!"}], "tools[0].type"),
    ([{"name": "x"}], "tools[0].type"),
    ([{**PATCH, "format": {"type": "xml"}}], "tools[0].format"),
    ([{"type": "namespace", "name": "a", "tools": [{**SEARCH, "name": "b"}]}, {**SEARCH, "name": "a__b"}], "tools[1]"),
])
def test_tool_mistakes_name_the_field(tools, param):
    with pytest.raises(InvalidRequest) as e:
        parse(tools=tools)
    assert e.value.param == param


def test_a_namespaced_call_is_named_back_with_its_namespace():
    parsed = parse(tools=[DOCS])
    builder, events, body = run(parsed, [Call(0, "call_1", "mcp__docs__search"), CallArgs(0, '{"q": "x"}')])
    (call,) = body["output"]
    assert (call["type"], call["name"], call["namespace"], call["arguments"]) == (
        "function_call", "search", "mcp__docs__", '{"q": "x"}')
    # the stored conversation names it as the model saw it
    assert builder.messages()[0]["tool_calls"][0]["function"]["name"] == "mcp__docs__search"


def test_a_custom_call_comes_back_as_its_free_text():
    parsed = parse(tools=[PATCH])
    text = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    args = json.dumps({"input": text})
    builder, events, body = run(parsed, [Call(0, "call_1", "apply_patch"), CallArgs(0, args[:10]),
                                         CallArgs(0, args[10:])])
    (call,) = body["output"]
    assert call == {"type": "custom_tool_call", "id": call["id"], "call_id": "call_1", "name": "apply_patch",
                    "input": text}
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == text
    assert builder.messages()[0]["tool_calls"][0]["function"] == {"name": "apply_patch", "arguments": {"input": text}}


@pytest.mark.parametrize("written, text", [('{"input": "a"}', "a"), ('{"input": ["a"]}', '["a"]'),
                                           ('{"other": 1}', '{"other": 1}'), ('{"input": "a', '{"input": "a')])
def test_custom_input_from_what_the_model_wrote(written, text):
    assert responses.custom_input(written) == text


def test_history_of_namespaced_and_custom_calls_reads_back():
    messages = responses.input_messages([
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "call_id": "c1", "name": "search", "namespace": "mcp__docs__",
         "arguments": '{"q": "x"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}},
    ])
    # issue 67: a web search's call is a call of web_search and its result, as a function's would be
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                             "tool"]
    assert messages[6]["tool_calls"][0]["function"] == {"name": "web_search", "arguments": {"query": "x"}}
    assert messages[2]["tool_calls"][0]["function"] == {"name": "mcp__docs__search", "arguments": {"q": "x"}}
    assert messages[3]["name"] == "mcp__docs__search" and messages[5]["name"] == "apply_patch"
    assert messages[4]["tool_calls"][0]["function"]["arguments"] == {"input": "*** Begin Patch"}


def test_instructions_and_opening_developer_messages_are_one_system_turn():
    history = [{"role": "system", "content": "Dev."}, {"role": "system", "content": "Perms."},
               {"role": "user", "content": "hi"}, {"role": "system", "content": "Later."}]
    out = responses.conversation("Inst.", [], history)
    assert out == [{"role": "system", "content": "Inst.\n\nDev.\n\nPerms."}, {"role": "user", "content": "hi"},
                   {"role": "system", "content": "Later."}]
    assert responses.conversation(None, [], [{"role": "user", "content": "x"}]) == [{"role": "user", "content": "x"}]


def test_the_summary_streams_beside_the_thinking():
    parsed = parse(reasoning={"effort": "medium", "summary": "auto"})
    _, events, body = run(parsed, [Piece("thinking", "Two and"), Piece("thinking", " two."),
                                   Piece("content", "4.")])
    kinds = [e["type"] for e in events]
    assert kinds[2:5] == ["response.output_item.added", "response.reasoning_summary_part.added",
                          "response.reasoning_text.delta"]
    summary = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    assert summary == "Two and two."
    done = kinds.index("response.reasoning_summary_part.done")
    assert kinds.index("response.reasoning_summary_text.done") < done < kinds.index("response.output_item.done")
    reasoning = body["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Two and two."}]
    assert "encrypted_content" not in reasoning and body["reasoning"] == {"effort": "medium", "summary": "auto"}


def test_no_summary_asked_no_summary_events():
    _, events, body = run(parse(), [Piece("thinking", "Hm."), Piece("content", "4.")])
    assert not any("summary" in e["type"] for e in events) and body["output"][0]["summary"] == []


def test_sealed_thinking_comes_back_into_the_history():
    parsed = parse(include=["reasoning.encrypted_content"], reasoning={"summary": "detailed"})
    _, _, body = run(parsed, [Piece("thinking", "Secret plan."), Piece("content", "4.")])
    reasoning, message = body["output"]
    assert responses.unseal(reasoning["encrypted_content"], "x") == "Secret plan."
    # Codex sends the reasoning item back with its summary and sealed content, no content
    back = {"type": "reasoning", "id": reasoning["id"], "summary": [{"type": "summary_text", "text": "short"}],
            "content": None, "encrypted_content": reasoning["encrypted_content"]}
    messages = responses.input_messages([{"role": "user", "content": "2+2?"}, back,
                                         {"type": "message", "role": "assistant",
                                          "content": [{"type": "output_text", "text": "4."}]},
                                         {"role": "user", "content": "and 3+3?"}])
    assert messages[1]["reasoning_content"] == "Secret plan." and messages[1]["content"] == "4."


@pytest.mark.parametrize("sealed", [
    "not base64!", 5, base64.b64encode(b"not json").decode(), base64.b64encode(b"[1]").decode(),
    base64.b64encode(json.dumps({"v": "other/9", "thinking": "x"}).encode()).decode(),
    base64.b64encode(json.dumps({"v": responses.SEAL_VERSION, "thinking": 5}).encode()).decode(),
    "gAAAAABo" + "A" * 40,  # what OpenAI's own servers seal
])
def test_a_malformed_seal_is_a_400_naming_it(sealed):
    with pytest.raises(InvalidRequest) as e:
        responses.input_messages([{"role": "user", "content": "x"},
                                  {"type": "reasoning", "summary": [], "encrypted_content": sealed}])
    assert e.value.param == "input[1].encrypted_content"


def test_what_codex_sends_besides_is_accepted():
    parsed = parse(instructions="You are Codex.", store=False, stream=True, parallel_tool_calls=False,
                   tool_choice="auto", tools=[EXEC, DOCS, *HOSTED], prompt_cache_key="0199-session",
                   client_metadata={"x-codex-installation-id": "abc"}, include=["reasoning.encrypted_content"],
                   reasoning={"effort": "xhigh", "summary": "none"}, text={"verbosity": "low"},
                   service_tier="auto")
    assert parsed.store is False and parsed.request.parallel_tool_calls is False
    assert parsed.reasoning_effort == "high" and parsed.summary is None and parsed.encrypted


@pytest.mark.parametrize("choice, mode, name", [
    ("auto", "auto", None), ({"type": "function", "name": "exec_command"}, "required", "exec_command"),
    ({"type": "function", "name": "search", "namespace": "mcp__docs__"}, "required", "mcp__docs__search"),
    ({"type": "custom", "name": "apply_patch"}, "required", "apply_patch"),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "exec_command"}]},
     "required", "exec_command"),
    ({"type": "web_search_preview"}, "auto", None),
])
def test_tool_choice_shapes(choice, mode, name):
    parsed = parse(tools=[EXEC, DOCS, PATCH], tool_choice=choice)
    assert (parsed.request.tool_choice, parsed.request.tool_names) == (mode, name and (name,))


@pytest.mark.parametrize("fields, param", [
    ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
    ({"reasoning": "high"}, "reasoning"),
    ({"include": "reasoning.encrypted_content"}, "include"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "namespace": 5}]}, "input[0].namespace"),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "f"}]}, "input[0]"),
    ({"input": [{"type": "reasoning", "content": "x"}]}, "input[0].content"),
])
def test_mistakes_name_the_field(fields, param):
    with pytest.raises(InvalidRequest) as e:
        parse(**fields)
    assert e.value.param == param


def test_an_image_in_a_tool_output_is_told_as_a_note():
    media: list = []
    messages = responses.input_messages([
        {"role": "user", "content": "look"},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": '{"path": "a.png"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "a.png: "}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
    ], media=media)
    assert messages[-1]["content"] == "a.png: " + MARKER and media[0].note == IMAGE_NOTE
    req = GenerationRequest(messages=messages, media=media)
    wire_media.require(req, {}, "m")  # a model that takes no pictures reads the note
    assert messages[-1]["content"] == "a.png: " + IMAGE_NOTE and req.media == []
