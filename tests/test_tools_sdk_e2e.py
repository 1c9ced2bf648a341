"""Tool calling through the real `gguf-gateway serve` process, driven by the official openai and
anthropic SDKs: a call, the tool's result, the final answer; whole and streamed, read with each
SDK's own stream accumulator.

The model is scripted under Qwen 2.5's real chat template (so the history of calls and results
is rendered by the real template code), with one line added at its end: after a tool result the
prompt ends in "!" instead of a newline, and a scripted model's next token depends only on the
prompt's last token, so the second turn answers instead of calling again."""

import json

import anthropic
import openai
import pytest
from helpers import WEATHER, ServerProcess, agent_model

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Weather in Paris?"}]
FINAL = "It is 18 C in Paris."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools-sdk")
    agent_model(d / "agent.gguf", ["It", " is", " 18", " C", " in", " Paris", "."])
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  agent: {d}/agent.gguf\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d)}) as srv:
        yield srv


@pytest.fixture
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def anth(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as c:
        yield c


def test_openai_round_trip(oai):
    first = oai.chat.completions.create(model="agent", messages=ASK, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    history = [*ASK, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    second = oai.chat.completions.create(model="agent", messages=history, tools=[WEATHER])
    assert second.choices[0].message.content == FINAL and second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls


def test_openai_stream_accumulator(oai):
    with oai.chat.completions.stream(model="agent", messages=ASK, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds and "tool_calls.function.arguments.done" in kinds
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and json.loads(call.function.arguments) == {"city": "Paris"}


def test_anthropic_round_trip_and_stream(anth):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": WEATHER["function"]["parameters"]}]
    first = anth.messages.create(model="agent", max_tokens=100, messages=ASK, tools=tools)
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]}]
    second = anth.messages.create(model="agent", max_tokens=100, messages=history, tools=tools)
    assert second.stop_reason == "end_turn" and second.content[0].text == FINAL

    with anth.messages.stream(model="agent", max_tokens=100, messages=ASK, tools=tools) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert "input_json" in kinds
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert use.input == {"city": "Paris"} and message.stop_reason == "tool_use"
