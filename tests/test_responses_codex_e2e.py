"""The Responses API as Codex CLI uses it, on the real `gguf-gateway serve` process through the
official openai SDK: namespace and custom tools called and named back, hosted tools dropped (and
said so), the reasoning summary streamed, sealed reasoning carried into a stateless next turn."""

from __future__ import annotations

import json

import openai
import pytest
from agents import call_model
from helpers import ServerProcess
from openapi import validate, validate_event

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

DOCS = {"type": "namespace", "name": "mcp__docs__", "description": "The docs server", "tools": [
    {"type": "function", "name": "search", "description": "Search the docs",
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files",
         "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}}
HOSTED = [{"type": "web_search", "external_web_access": False}, {"type": "image_generation", "output_format": "png"}]
PATCH_TEXT = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("codex")
    call_model(d / "docs.gguf", "mcp__docs__search", [' {"q":', ' "setup"}'], ["Found", " it", "."])
    call_model(d / "patch.gguf", "apply_patch", [" " + json.dumps({"input": PATCH_TEXT})], ["Patched", "."])
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {d}/events.jsonl\nmodels:\n"
                   f"  docs: {d}/docs.gguf\n  patch: {d}/patch.gguf\n  thinker: {d}/thinker.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        srv.events = d / "events.jsonl"
        yield srv


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def codex_fields(**more):
    """What Codex 0.169 sends with every turn, besides its input and tools."""
    return {"instructions": "You are Codex, a coding agent.", "store": False, "parallel_tool_calls": False,
            "tool_choice": "auto", "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "medium", "summary": "auto"}, "prompt_cache_key": "0199a-session",
            "extra_body": {"client_metadata": {"x-codex-installation-id": "abc"}}, "text": {"verbosity": "low"},
            **more}


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


DEVELOPER = {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions instructions>Sandbox: none.</permissions>"}]}


def test_a_namespaced_call_is_named_back_and_hosted_tools_are_dropped(client, server):
    raw = client.responses.with_raw_response.create(model="docs", input=[DEVELOPER, user("How to set up?")],
                                                    tools=[DOCS, *HOSTED], **codex_fields())
    assert raw.headers["x-gateway-dropped-tools"] == "web_search,image_generation"
    r = raw.parse()
    validate(r.model_dump(mode="json", exclude_unset=True), "Response")
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert (call.name, call.namespace, json.loads(call.arguments)) == ("search", "mcp__docs__", {"q": "setup"})
    # the next turn, stateless, as Codex sends it: the call with its namespace, and its output
    follow = client.responses.create(model="docs", tools=[DOCS, *HOSTED], **codex_fields(), input=[
        DEVELOPER, user("How to set up?"),
        {"type": "function_call", "call_id": call.call_id, "name": "search", "namespace": "mcp__docs__",
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Run make."}])
    assert follow.output_text == "Found it."
    events = [json.loads(line) for line in server.events.read_text().splitlines()]
    assert [e["dropped_tools"] for e in events if e["endpoint"].endswith("/v1/responses")][-2:] == [
        ["web_search", "image_generation"]] * 2


def test_a_custom_tool_call_streams_its_free_text(client):
    with client.responses.with_streaming_response.create(model="patch", input=[user("Add a.txt")], stream=True,
                                                         tools=[PATCH, *HOSTED], **codex_fields()) as raw:
        assert raw.headers["x-gateway-dropped-tools"] == "web_search,image_generation"
        events = list(raw.parse())
    for e in events:
        validate_event(e.model_dump(mode="json", exclude_unset=True))
    done = next(e for e in events if e.type == "response.custom_tool_call_input.done")
    assert done.input == PATCH_TEXT
    (call,) = events[-1].response.output
    assert (call.type, call.name, call.input) == ("custom_tool_call", "apply_patch", PATCH_TEXT)
    follow = client.responses.create(model="patch", tools=[PATCH, *HOSTED], **codex_fields(), input=[
        user("Add a.txt"), {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch",
                            "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success."}])
    assert follow.output_text == "Patched."


def test_the_summary_streams_and_sealed_thinking_returns(client):
    events = list(client.responses.create(model="thinker", input=[DEVELOPER, user("2+2?")], stream=True,
                                          **codex_fields()))
    for e in events:
        validate_event(e.model_dump(mode="json", exclude_unset=True))
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert summary == "Two and two."
    reasoning = next(e.item for e in events if e.type == "response.output_item.done" and e.item.type == "reasoning")
    assert reasoning.summary[0].text == "Two and two." and reasoning.encrypted_content
    item = reasoning.model_dump(mode="json", exclude_none=True)
    item.pop("content", None)  # Codex sends it back without the raw content
    follow = client.responses.create(model="thinker", **codex_fields(), input=[
        DEVELOPER, user("2+2?"), item,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 4."}]},
        user("And 3+3?")])
    assert follow.status == "completed"
    item["encrypted_content"] = "tampered"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="thinker", **codex_fields(), input=[user("2+2?"), item, user("And?")])
    assert e.value.body["param"] == "input[1].encrypted_content"
