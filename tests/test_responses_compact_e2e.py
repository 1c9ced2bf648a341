"""`POST /v1/responses/compact` and `POST /v1/responses/input_tokens` on the real `gguf-gateway
serve` process with real llama.cpp inference, driven by the official openai SDK
(`client.responses.compact`, `client.responses.input_tokens.count`): the counts equal what a
response's `usage.input_tokens` says for the same request; a compacted conversation goes on; a
history longer than the model's context is summarised in parts; bad input gets a clear error in
OpenAI's shape and the model keeps serving. The `real` test does the same on Gemma 3 270M, whose
template refuses two user turns in a row."""

from __future__ import annotations

import openai
import pytest
from helpers import ServerProcess, request
from realmodel import gemma_path

from gateway.models import testmodels as tm
from gateway.wire.responses import seal

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HISTORY = [{"role": "user", "content": "My name is Ada and I live in Paris."},
           {"role": "assistant", "content": "Nice to meet you, Ada."},
           {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
           {"type": "function_call_output", "call_id": "c1", "output": "18 C and sunny"},
           {"role": "user", "content": "What should I wear?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("compact")
    tm.plain(d / "plain.gguf", ["Ada", " lives", " in", " Paris", "."])
    tm.plain(d / "bare.gguf", ["Hi"], chat_template="")
    tm.plain(d / "broken.gguf", ["Hi"], chat_template="{{ raise_exception('this template takes no messages') }}")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  responses_store: 16\n"
                   f"models:\n  plain: {d}/plain.gguf\n  bare: {d}/bare.gguf\n"
                   f"  broken: {d}/broken.gguf\n  small:\n    path: {d}/plain.gguf\n    n_ctx: 1024\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def still_serves(client, model="plain"):
    assert client.responses.create(model=model, input="hello?").output_text == "Ada lives in Paris."


def test_input_tokens_are_what_a_response_reads(client):
    for fields in ({"input": "2+2?"}, {"input": HISTORY, "instructions": "Be brief.", "tools": [WEATHER]},
                   {"input": HISTORY[:2], "tools": [WEATHER], "tool_choice": "required"}):
        counted = client.responses.input_tokens.count(model="plain", **fields)
        assert counted.object == "response.input_tokens" and counted.input_tokens > 0
        assert counted.input_tokens == client.responses.create(model="plain", **fields).usage.input_tokens, fields


def test_input_tokens_through_previous_response_id(client):
    first = client.responses.create(model="plain", input="My name is Ada.", instructions="Be brief.")
    fields = {"previous_response_id": first.id, "input": "And my name?", "instructions": "Be brief."}
    counted = client.responses.input_tokens.count(model="plain", **fields).input_tokens
    assert counted == client.responses.create(model="plain", **fields).usage.input_tokens
    assert counted > client.responses.input_tokens.count(model="plain", input="And my name?").input_tokens


def compacted_items(out):
    return out.model_dump(mode="json", exclude_none=True, warnings=False)["output"]  # the user messages: input_text


def test_compact_then_go_on(client):
    out = client.responses.compact(model="plain", input=HISTORY, instructions="Be brief.")
    assert out.object == "response.compaction" and out.id and out.created_at > 0
    kinds = [(item.type, getattr(item, "role", None)) for item in out.output]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
    assert out.output[0].content[0].text == "My name is Ada and I live in Paris."
    sealed = out.output[-1].encrypted_content
    assert isinstance(sealed, str) and "Paris" not in sealed
    assert out.usage.input_tokens > 0 and out.usage.output_tokens == 5
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    # the compaction reads back as its summary, told as such
    items = compacted_items(out)
    told = "My name is Ada and I live in Paris.\n\nWhat should I wear?\n\nSummary of the conversation so far:\n" \
           "Ada lives in Paris.\n\nAnd tomorrow?"
    assert client.responses.input_tokens.count(model="plain", input=[*items, {"role": "user", "content": "And tomorrow?"}]
                                               ).input_tokens == \
        client.responses.input_tokens.count(model="plain", input=told).input_tokens
    after = client.responses.create(model="plain", input=[*items, {"role": "user", "content": "And tomorrow?"}])
    assert after.output_text == "Ada lives in Paris."
    # and through previous_response_id: the stored conversation holds the summary
    again = client.responses.create(model="plain", previous_response_id=after.id, input="Thanks.")
    assert again.status == "completed" and again.usage.input_tokens > after.usage.input_tokens


def test_compact_a_stored_conversation(client):
    first = client.responses.create(model="plain", input="My name is Ada.")
    second = client.responses.create(model="plain", previous_response_id=first.id, input="I live in Paris.")
    out = client.responses.compact(model="plain", previous_response_id=second.id)
    texts = [item.content[0].text for item in out.output if item.type == "message"]
    assert texts == ["My name is Ada.", "I live in Paris."] and out.output[-1].type == "compaction"
    more = client.responses.compact(model="plain", previous_response_id=second.id, input="And my job?")
    assert [item.content[0].text for item in more.output if item.type == "message"][-1] == "And my job?"
    # a compaction of a conversation that holds one: its summary summarised again, every user message kept
    items = compacted_items(out)
    twice = client.responses.compact(model="plain", input=[*items, {"role": "user", "content": "Next."}])
    assert [i.type for i in twice.output] == ["message", "message", "message", "compaction"]
    assert [i.content[0].text for i in twice.output[:-1]] == ["My name is Ada.", "I live in Paris.", "Next."]


def test_a_history_longer_than_the_context_is_summarised_in_parts(client):
    turns = [{"role": "user" if i % 2 == 0 else "assistant",
              "content": f"Turn {i}: " + " ".join(f"word{j}" for j in range(60))} for i in range(16)]
    counted = client.responses.input_tokens.count(model="plain", input=turns).input_tokens
    assert counted > 4 * 1024
    out = client.responses.compact(model="small", input=turns)
    assert out.output[-1].type == "compaction" and len(out.output) == 9
    # several summaries, then the summary of theirs: more prompt than any one context holds
    assert out.usage.input_tokens > 4 * 1024 and out.usage.output_tokens > 5 * 5
    still_serves(client, "small")


def error_of(call):
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    err = caught.value
    return err.status_code, err.body if isinstance(err.body, dict) else {}


def test_bad_input(client, server):
    status, body = error_of(lambda: client.responses.compact(model="plain", input=[]))
    assert status == 400 and body["param"] == "input"
    status, body = error_of(lambda: client.responses.compact(model="plain", input=""))
    assert status == 400 and body["param"] == "input" and "nothing to compact" in body["message"]
    status, body = error_of(lambda: client.responses.compact(model="plain"))
    assert status == 400 and body["param"] == "input"
    status, body = error_of(lambda: client.responses.compact(model="plain", previous_response_id="resp_nope"))
    assert status == 404 and body["param"] == "previous_response_id"
    status, body = error_of(lambda: client.responses.compact(model="nope", input="hi"))
    assert status == 404
    # a compaction another server (or a hand) made, and a reasoning item's seal passed as one
    for forged in ("opaque-from-openai", seal("not a summary")):
        status, body = error_of(lambda forged=forged: client.responses.compact(
            model="plain", input=[{"type": "compaction", "encrypted_content": forged}]))
        assert status == 400 and body["param"] == "input[0].encrypted_content"
    status, body = error_of(lambda: client.responses.input_tokens.count(
        model="plain", input=[{"type": "compaction", "encrypted_content": "x.y"}]))
    assert status == 400 and body["param"] == "input[0].encrypted_content"
    still_serves(client)


def test_items_of_every_kind(client):
    """The items a conversation from OpenAI holds: those the model reads are summarised, the
    hosted tools' records this server does not run are passed over, and an item it cannot
    read at all is a 400 naming it."""
    readable = [*HISTORY,
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Think."}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Wear a jacket."}]},
                {"type": "web_search_call", "id": "ws_1", "status": "completed",
                 "action": {"type": "search", "query": "paris weather"}},
                {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["x"]},
                {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": None},
                {"type": "mcp_list_tools", "id": "ml_1", "server_label": "s", "tools": []},
                {"type": "custom_tool_call", "call_id": "c2", "name": "shell", "input": "ls"},
                {"type": "custom_tool_call_output", "call_id": "c2", "output": "a.txt"},
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": [{"type": "input_text", "text": "Merci."}]}]
    out = client.responses.compact(model="plain", input=readable)
    assert out.output[-1].type == "compaction"
    assert [i.content[0].text for i in out.output[:-1]] == ["My name is Ada and I live in Paris.",
                                                            "What should I wear?", "Merci."]
    for bad in ({"type": "item_reference", "id": "msg_1"}, {"type": "frobnicate"}, "just a string",
                {"role": "wizard", "content": "hi"}):
        status, body = error_of(lambda bad=bad: client.responses.compact(model="plain", input=[*HISTORY, bad]))
        assert status == 400 and body["param"].startswith("input[5]"), body
    still_serves(client)


def test_a_model_without_a_template(client):
    """A GGUF without a template is read with ChatML (``worker/model``), so it compacts; a
    template that refuses every conversation is a clear 400, and the model serves on."""
    out = client.responses.compact(model="bare", input=HISTORY)
    assert out.output[-1].type == "compaction" and out.usage.output_tokens == 1
    status, body = error_of(lambda: client.responses.compact(model="broken", input=HISTORY))
    assert status == 400 and "this template takes no messages" in body["message"], body
    status, body = error_of(lambda: client.responses.input_tokens.count(model="broken", input=HISTORY))
    assert status == 400 and "this template takes no messages" in body["message"], body
    assert client.responses.compact(model="bare", input="hi").output[-1].type == "compaction"
    still_serves(client)


def test_a_history_past_the_body_limit_is_413(server, client):
    huge = [{"role": "user", "content": "x" * 2**20} for _ in range(100)]  # 100 MB
    status, body, _ = request(server.url + "/v1/responses/compact", {"model": "plain", "input": huge})
    assert status == 413 and body["error"]["code"] == "request_too_large" and body["error"]["type"]
    still_serves(client)


@pytest.mark.real
def test_gemma_compacts_and_goes_on(tmp_path):
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n"
                   f"  gemma:\n    path: {gemma_path()}\n    n_ctx: 1024\n")
    with ServerProcess("--config", str(cfg)) as srv, \
            openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0) as client:
        history = [{"role": "user", "content": "My name is Ada. I am a painter and I live in Lyon."},
                   {"role": "assistant", "content": "Nice to meet you, Ada!"},
                   {"role": "user", "content": "I paint mostly rivers and bridges."},
                   {"role": "assistant", "content": "That sounds lovely."}]
        fields = {"input": history, "instructions": "Be brief."}
        counted = client.responses.input_tokens.count(model="gemma", **fields).input_tokens
        assert counted == client.responses.create(model="gemma", max_output_tokens=8, **fields).usage.input_tokens
        out = client.responses.compact(model="gemma", **fields)
        assert [i.type for i in out.output] == ["message", "message", "compaction"] and out.usage.output_tokens > 0
        # two user messages, the summary and the next question in a row: Gemma's template takes them as one turn
        after = client.responses.create(model="gemma", max_output_tokens=24, instructions="Be brief.",
                                        input=[*compacted_items(out), {"role": "user", "content": "What is my name?"}])
        assert after.status in ("completed", "incomplete") and after.output_text
        long = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Note {i}: " + "bridges " * 120}
                for i in range(12)]
        parts = client.responses.compact(model="gemma", input=long)
        assert parts.output[-1].type == "compaction" and parts.usage.input_tokens > 1024


def test_keys_hold_compact_as_any_request(tmp_path):
    """Under keys: no key is a 401; a stored conversation is its key's alone (another key's
    ``previous_response_id`` is a 404, on both routes); the compaction then goes on under the key."""
    tm.plain(tmp_path / "plain.gguf", ["Ada", " lives", " in", " Paris", "."])
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys: [first-secret, second-secret]\n"
                   f"models:\n  plain: {tmp_path}/plain.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        status, _, _ = request(srv.url + "/v1/responses/compact", {"model": "plain", "input": "hi"})
        assert status == 401
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="first-secret", max_retries=0) as first, \
                openai.OpenAI(base_url=srv.url + "/v1", api_key="second-secret", max_retries=0) as second:
            mine = first.responses.create(model="plain", input="My name is Ada.")
            for call in (lambda: second.responses.compact(model="plain", previous_response_id=mine.id),
                         lambda: second.responses.input_tokens.count(model="plain", previous_response_id=mine.id,
                                                                     input="And?")):
                status, body = error_of(call)
                assert status == 404 and body["param"] == "previous_response_id"
            out = first.responses.compact(model="plain", previous_response_id=mine.id)
            assert first.responses.create(model="plain", input=[*compacted_items(out), {"role": "user",
                                                                                        "content": "And?"}]).output_text
