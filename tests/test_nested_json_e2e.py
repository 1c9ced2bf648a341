"""JSON nested thousands deep inside a string, against the real server process: a request's body
is bounded (gateway/api/body.py), and so is every JSON text a caller sends inside one
(base/strictjson): tool calls' arguments in chat and Ollama histories, a Responses
``function_call``'s, a reasoning item's ``encrypted_content``. Each is a 400 in the route's wire
shape naming the field (it was a 500: Python's parser recursed past its limit), and the
gateway answers on."""

from __future__ import annotations

import base64
import json

import pytest
from helpers import ServerProcess, request

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("nested")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\nmodels:\n  plain: {d}/plain.gguf\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d), "XDG_CACHE_HOME": str(d / "cache")}) as srv:
        yield srv


def calls(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


def responses_input(item: dict) -> list[dict]:
    return [{"role": "user", "content": "hi"}, item, {"type": "function_call_output", "call_id": "c1", "output": "ok"}]


CASES = [
    ("/v1/chat/completions", {"model": "plain", "messages": calls(DEEP)}, "messages[1].tool_calls[0].function.arguments"),
    ("/apply-template", {"model": "plain", "messages": calls(DEEP)}, "messages[1].tool_calls[0].function.arguments"),
    ("/v1/responses", {"model": "plain", "input": responses_input(
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": DEEP})}, "input[1].arguments"),
    ("/v1/responses", {"model": "plain", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": base64.b64encode(
            json.dumps({"v": "gguf-gateway/1", "thinking": "x"})[:-1].encode() + b', "n": ' + DEEP.encode()
            + b"}").decode()}]}, "input[1].encrypted_content"),
]


@pytest.mark.parametrize("path, body, param", CASES)
def test_json_nested_in_a_string_is_a_400_naming_its_field(server, path, body, param):
    status, answer, _ = request(server.url + path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["type"] == "invalid_request_error"


def test_ollamas_tool_call_arguments(server):
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": DEEP}}]},
                {"role": "tool", "content": "ok"}]
    status, answer, _ = request(server.url + "/api/chat", {"model": "plain", "messages": messages, "stream": False})
    assert status == 400 and set(answer) == {"error"}  # Ollama's shape: the message alone
    assert "messages[1].tool_calls[0].function.arguments" in answer["error"] and "nested" in answer["error"]


def test_the_gateway_answers_on_and_logs_no_traceback(server):
    status, answer, _ = request(server.url + "/v1/chat/completions",
                                {"model": "plain", "messages": calls('{"city": "Paris"}'), "max_tokens": 2})
    assert status == 200, answer
    assert "Traceback" not in server.output() and "RecursionError" not in server.output()
