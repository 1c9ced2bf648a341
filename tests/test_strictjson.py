"""The one bounded JSON parser (gateway/base/strictjson.py) and every reader that goes through
it: a JSON text nested thousands deep inside a string (tool calls' arguments in chat, Ollama and
Responses requests), what a model writes as a call, an upstream's answer. Each is a 400 naming
its field (or, from a model or an upstream, no JSON), never a RecursionError."""

from __future__ import annotations

import json

import pytest

from gateway.backends.upstream_wire.failures import MalformedStream, error_from, json_of
from gateway.base import strictjson
from gateway.base.errors import InvalidRequest
from gateway.base.strictjson import MAX_DEPTH, JSONRefused
from gateway.text.toolformats import scan
from gateway.wire import ollama, responses
from gateway.wire import openai as oai
from gateway.wire.tools import openai_calls

DEEP = "[" * 5000 + "]" * 5000  # past Python's own recursion limit
JUST_DEEP = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)  # under it, past the bound
OK = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)


@pytest.mark.parametrize("text", [DEEP, JUST_DEEP, '{"a": ' + DEEP + "}"])
def test_nesting_past_the_bound_is_a_400_naming_the_field(text):
    with pytest.raises(JSONRefused) as e:
        strictjson.loads(text, "input[3].arguments")
    err = e.value
    assert err.status == 400 and err.param == "input[3].arguments" and err.code == "invalid_json"
    assert "nested more than" in err.message and "`input[3].arguments`" in err.message
    assert isinstance(err, ValueError) and isinstance(err, InvalidRequest)


def test_what_is_within_the_bound_parses():
    assert strictjson.loads(OK, "x") == json.loads(OK)
    assert strictjson.loads('{"a": [1, "\\ud83d\\ude00"]}', "x") == {"a": [1, "\U0001F600"]}


@pytest.mark.parametrize("text, code", [
    ('{"a": NaN}', "invalid_json"), ("[Infinity]", "invalid_json"), ("7" * 5000, "invalid_json"), ("{", "invalid_json"),
    ("", "invalid_json"), (b"\xff", "invalid_json"), ('{"a": "\\ud800"}', "invalid_unicode"),
    ('{"\\udfff": 1}', "invalid_unicode"),
])
def test_what_is_not_strict_json_is_a_400_naming_the_field(text, code):
    with pytest.raises(JSONRefused) as e:
        strictjson.loads(text, "messages[1].tool_calls[0].function.arguments")
    assert e.value.code == code and e.value.param == "messages[1].tool_calls[0].function.arguments"


def test_constants_pass_only_where_asked():
    assert strictjson.loads('{"logprob": -Infinity}', constants=True) == {"logprob": float("-inf")}


def test_the_body_names_the_place_inside_it():
    with pytest.raises(JSONRefused) as e:
        strictjson.loads(b'{"messages": [{"content": "a\\ud800"}]}')
    assert e.value.param == "messages[0].content" and "`messages[0].content`" in e.value.message


# --- the wire parsers: a JSON text inside a string ---------------------------------------------

def chat_history(arguments: str) -> dict:
    return {"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}


@pytest.mark.parametrize("arguments", [DEEP, JUST_DEEP, '{"a": "\\ud800"}'])
def test_chat_tool_call_arguments(arguments):
    with pytest.raises(InvalidRequest) as e:
        oai.parse_chat(chat_history(arguments))
    assert e.value.status == 400 and e.value.param == "messages[1].tool_calls[0].function.arguments"
    with pytest.raises(InvalidRequest) as e:
        openai_calls([{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}], "x")
    assert e.value.param == "x[0].function.arguments"


@pytest.mark.parametrize("arguments", [DEEP, JUST_DEEP])
def test_ollama_tool_call_arguments(arguments):
    body = {"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "content": "ok"}]}
    with pytest.raises(InvalidRequest) as e:
        ollama.parse_chat(body)
    assert e.value.status == 400 and e.value.param == "messages[1].tool_calls[0].function.arguments"


@pytest.mark.parametrize("arguments", [DEEP, JUST_DEEP])
def test_responses_function_call_arguments(arguments):
    with pytest.raises(InvalidRequest) as e:
        responses.parse({"model": "m", "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"}]})
    assert e.value.status == 400 and e.value.param == "input[1].arguments"


def test_a_sealed_item_nested_past_the_bound_is_a_400_naming_it():
    """Only this gateway's key signs a seal; one it signed that holds deep JSON is still refused
    as such (a key that leaked, a server of another version)."""
    import base64
    import hashlib
    import hmac

    key = b"k" * 32
    body = base64.urlsafe_b64encode(('{"v": "gguf-gateway/2", "thinking": "x", "n": ' + DEEP + "}").encode())
    body = body.rstrip(b"=").decode()
    mac = base64.urlsafe_b64encode(hmac.new(key, b"encrypted_content\0" + body.encode(), hashlib.sha256).digest())
    sealed = f"{body}.{mac.rstrip(b'=').decode()}"
    with pytest.raises(InvalidRequest) as e:
        responses.unseal(sealed, "input[0].encrypted_content", key)
    assert e.value.param == "input[0].encrypted_content" and "nested" in e.value.message


# --- what a model or an upstream wrote: no JSON, never a RecursionError -------------------------

def test_a_models_call_nested_past_the_bound_is_no_json():
    with pytest.raises(ValueError):
        scan.loads('{"name": "f", "arguments": ' + DEEP + "}")
    assert not scan.is_object('{"a": ' + DEEP + "}")
    assert responses.custom_input('{"input": ' + DEEP + "}") == '{"input": ' + DEEP + "}"


def test_an_upstreams_answer_nested_past_the_bound_is_malformed():
    with pytest.raises(MalformedStream) as e:
        json_of('{"choices": ' + DEEP + "}", "an event")
    assert e.value.status == 502
    assert json_of('{"logprob": -Infinity}', "an event") == {"logprob": float("-inf")}
    err = error_from(400, ('{"error": ' + DEEP + "}").encode())
    assert err.status == 400  # read as plain text
