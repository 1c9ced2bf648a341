"""OpenAI's Responses API on the real `gguf-gateway serve` process, driven by the official openai
SDK (`responses.create`, `responses.stream`, `retrieve`, `delete`), every body and stream event
validated against OpenAI's own OpenAPI schemas."""

from __future__ import annotations

import json

import openai
import pytest
from helpers import ServerProcess, agent_model
from openapi import validate, validate_event

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    agent_model(d / "agent.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  responses_store: 8\nmodels:\n"
                   f"  plain: {d}/plain.gguf\n  thinker: {d}/thinker.gguf\n  loop: {d}/loop.gguf\n"
                   f"  agent: {d}/agent.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def checked(response):
    validate(response.model_dump(mode="json", exclude_unset=True), "Response")
    return response


def test_a_whole_response(client):
    r = checked(client.responses.create(model="plain", input="2+2?", instructions="Be brief."))
    assert r.status == "completed" and r.output_text == "Hello, world!" and r.instructions == "Be brief."
    (message,) = r.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert r.usage.output_tokens == 4 and r.usage.input_tokens > 0 and r.usage.total_tokens > 4


def test_streamed_events_in_the_documented_order(client):
    events = list(client.responses.create(model="thinker", input=[{"role": "user", "content": "2+2?"}],
                                          stream=True))
    for e in events:
        validate_event(e.model_dump(mode="json", exclude_unset=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thinking, text) == ("Two and two.", "It is 4.")
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.content_part.added")
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == "Two and two." and final.usage.output_tokens_details.reasoning_tokens > 0


def test_the_stream_helper_assembles_the_same_response(client):
    with client.responses.stream(model="thinker", input="2+2?") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "It is 4."


def test_tool_calls_and_their_results_by_items_and_by_previous_response(client):
    first = checked(client.responses.create(model="agent", input="Weather?", tools=[WEATHER]))
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    by_items = client.responses.create(model="agent", tools=[WEATHER], input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    assert by_items.output_text == "It is 18 C."
    follow = client.responses.create(model="agent", tools=[WEATHER], previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    assert follow.output_text == "It is 18 C." and follow.previous_response_id == first.id
    streamed = list(client.responses.create(model="agent", input="Weather?", tools=[WEATHER], stream=True))
    args = "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    done = next(e for e in streamed if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"}


def test_max_output_tokens_leaves_it_incomplete(client):
    r = checked(client.responses.create(model="loop", input="go", max_output_tokens=3))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == " tick tock tick" and r.usage.output_tokens == 3


def test_stored_responses_are_kept_retrieved_and_deleted(client):
    r = client.responses.create(model="plain", input="hi")
    assert client.responses.retrieve(r.id).output_text == "Hello, world!"
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="plain", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="plain", input="hi", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize("fields, param", [
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].image_url"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input[0].call_id"),
    ({"input": "x", "tools": [{"type": "web search!"}]}, "tools[0].type"),  # a hosted tool's is dropped
    ({"input": "x", "reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "x", "text": [1]}, "text"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 9}, "temperature"),
])
def test_mistakes_are_400s_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="plain", **fields)
    assert e.value.body["param"] == param
