"""Tools on the wire: OpenAI's and Anthropic's tool fields and tool history read into one
shape, and every mistake a 400 naming its param."""

import pytest

from gateway.base.errors import InvalidRequest
from gateway.wire import anthropic, anthropic_answer, openai, openai_answer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def chat(**body):
    return openai.parse_chat({"model": "m", "messages": ASK, **body}).request


def anth(**body):
    return anthropic.parse({"model": "m", "max_tokens": 64, "messages": ASK, **body}).request


def test_openai_tools_and_choice():
    req = chat(tools=[WEATHER])
    assert req.tools == [WEATHER] and req.tool_choice == "auto" and req.tool_names is None and req.parallel_tool_calls
    req = chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
               parallel_tool_calls=False)
    assert req.tool_choice == "required" and req.tool_names == ("get_weather",) and not req.parallel_tool_calls
    assert chat(tools=[WEATHER], tool_choice="none").tools is None  # none: the model sees no tools
    bare = chat(tools=[{"type": "function", "function": {"name": "now"}}]).tools[0]["function"]
    assert bare == {"name": "now", "parameters": {"type": "object", "properties": {}}}


def test_openai_tool_history_reaches_the_template_shape():
    messages = [*ASK,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    got = openai.parse_chat({"model": "m", "messages": messages, "tools": [WEATHER]}).request.messages
    assert got[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert got[2] == {"role": "tool", "content": "18 C", "name": "get_weather", "tool_call_id": "call_1"}


@pytest.mark.parametrize("body, param", [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
    ({"tools": [WEATHER] * 129}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tools"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c"}]}]}, "messages[1].tool_calls[0]"),
])
def test_openai_tool_mistakes_name_their_param(body, param):
    with pytest.raises(InvalidRequest) as e:
        openai.parse_chat({"model": "m", "messages": ASK, **body})
    assert e.value.param == param and e.value.status == 400


ANTH_TOOL = {"name": "get_weather", "description": "Weather in a city",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def test_anthropic_tools_choice_and_history():
    req = anth(tools=[ANTH_TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert req.tools[0]["function"]["name"] == "get_weather" and req.tools[0]["function"]["parameters"] == \
        ANTH_TOOL["input_schema"]
    assert req.tool_choice == "required" and req.tool_names is None and not req.parallel_tool_calls
    req = anth(tools=[ANTH_TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    assert req.tool_choice == "required" and req.tool_names == ("get_weather",) and req.parallel_tool_calls
    messages = [*ASK,
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "text", "text": "18 C"}]},
                                             {"type": "text", "text": "And tomorrow?"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                                                   "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "no data",
                                              "is_error": True}]}]
    got = anth(tools=[ANTH_TOOL], messages=messages).messages
    assert got[1] == {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert got[2] == {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "18 C"}
    assert got[3] == {"role": "user", "content": "And tomorrow?"}
    assert got[5] == {"role": "tool", "tool_call_id": "toolu_2", "name": "get_weather", "content": "Error: no data"}
    assert len(got) == 6  # a user turn of results only adds no empty user message


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"description": "x", "input_schema": {"type": "object"}}]}, "tools.0.name"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools.0.input_schema"),
    ({"tools": [{"type": 5, "name": "web_search"}]}, "tools.0.type"),  # Anthropic's own tools are left out
    ({"tools": [ANTH_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [ANTH_TOOL], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "any"}}, "tool_choice.type"),
    ({"messages": [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                            "input": [1]}]}]}, "messages.1.content.0.input"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x",
                                                  "content": "r"}]}]}, "messages.0.content.0.tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
     "messages.0.content.0.type"),
])
def test_anthropic_tool_mistakes_name_their_param(body, param):
    with pytest.raises(InvalidRequest) as e:
        anthropic.parse({"model": "m", "max_tokens": 64, "messages": ASK, **body})
    assert e.value.param == param and e.value.status == 400


# --- answers with calls, in each shape ---------------------------------------------------------

def test_openai_calls_whole_and_streamed_fit_the_schema():
    from openapi import validate

    from gateway.wire.answer import Call, CallArgs, Finish

    render = openai_answer.Renderer("chat", "m")
    finish = Finish("tool_calls", None, 10, 5, 0)
    calls = [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    body = render.whole([render.choice(0, "", "", finish, None, calls=calls)], [finish])
    validate(body, "CreateChatCompletionResponse")
    message = body["choices"][0]["message"]
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"] == [{"id": "call_1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    opened = render.call_chunk(Call(0, "call_1", "get_weather"))
    piece = render.call_chunk(CallArgs(0, '{"city": '))
    for chunk in (opened, piece, render.final_chunk("tool_calls")):
        validate(chunk, "CreateChatCompletionStreamResponse")
    assert opened["choices"][0]["delta"]["tool_calls"] == [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]
    assert piece["choices"][0]["delta"]["tool_calls"] == [{"index": 0, "function": {"arguments": '{"city": '}}]


def test_anthropic_tool_use_blocks():
    from gateway.wire.answer import Call, Finish

    block = anthropic_answer.tool_block(Call(0, "call_abc", "get_weather"), {"city": "Paris"})
    assert block == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {"city": "Paris"}}
    assert anthropic_answer.stop_reason(Finish("tool_calls", None, 1, 1, 0)) == ("tool_use", None)


# --- through the real server: tools are part of the prompt ---------------------------------------

async def test_tools_and_their_history_reach_the_models_template(aiohttp_client, tmp_path, write_config):
    from realmodel import CACHE

    from gateway.app import create_app
    from gateway.models import testmodels as tm
    from gateway.models.config import load_config

    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", CACHE / "templates")
    tm.plain(tmp_path / "q.gguf", chat_template=qwen.read_text())
    client = await aiohttp_client(create_app(load_config(write_config(f"models:\n  q: {tmp_path}/q.gguf\n"))))
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    r = await client.post("/apply-template", json={"model": "q", "messages": history, "tools": [WEATHER]})
    prompt = (await r.json())["prompt"]
    assert r.status == 200 and "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt and "18 C" in prompt
    count = "/v1/messages/count_tokens"
    without = await (await client.post(count, json={"model": "q", "messages": ASK})).json()
    counted = await (await client.post(count, json={"model": "q", "messages": ASK, "tools": [ANTH_TOOL]})).json()
    assert counted["input_tokens"] > without["input_tokens"]  # a count includes the tools the prompt lists
    bad = await client.post("/apply-template", json={"model": "q", "messages": ASK, "tools": [{"type": "function"}]})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "tools[0].type"
