"""Generated JSON bodies at every endpoint of a real server: never a 500, every error in its wire
shape, no worker lost, and the gateway's memory bounded after the run.

Besides ordinary JSON the strategies draw the shapes that once got through: lone surrogates,
numbers past any C type, nesting past the reader's depth, huge strings and maps, names the chat
template reserves, and grammars that finish early or cannot start."""

import json
import os
import urllib.error
import urllib.request

import pytest
from helpers import ServerProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi import validate

from gateway.models import testmodels as tm
from gateway.text import chat_template

# Hypothesis warns when it builds the repr of a strategy holding the large hostile values (it does
# so while rejecting a draw, not on a failure); that warning is about its own cost, not a finding.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Generating overly large repr")]

ENDPOINTS = {
    "/v1/chat/completions": ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                             "stop", "stream", "stream_options", "seed", "n", "logprobs", "top_logprobs",
                             "response_format", "grammar", "reasoning_format", "chat_template_kwargs", "top_k",
                             "ignore_eos", "presence_penalty", "user", "tools", "tool_choice",
                             "parallel_tool_calls"],
    "/v1/completions": ["model", "prompt", "max_tokens", "echo", "logprobs", "stream", "stop", "suffix", "best_of",
                        "temperature", "grammar", "ignore_eos"],
    "/v1/embeddings": ["model", "input", "encoding_format", "dimensions"],
    "/v1/messages": ["model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                     "top_k", "thinking", "metadata", "tools", "tool_choice"],
    "/v1/messages/count_tokens": ["model", "messages", "system", "tools"],
    "/tokenize": ["model", "content", "add_special", "with_pieces"],
    "/detokenize": ["model", "tokens"],
    "/apply-template": ["model", "messages", "chat_template_kwargs", "max_tokens", "tools"],
    "/models/load": ["model"],
    "/models/unload": ["model"],
    "/v1/responses": ["model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools",
                      "tool_choice", "parallel_tool_calls", "reasoning", "text", "stream", "store",
                      "previous_response_id", "metadata"],
    "/v1/rerank": ["model", "query", "documents", "top_n", "return_documents"],
    "/api/chat": ["model", "messages", "tools", "format", "options", "think", "keep_alive", "stream"],
    "/api/generate": ["model", "prompt", "system", "raw", "format", "options", "think", "keep_alive", "stream",
                      "images", "suffix", "template", "context"],
    "/api/embed": ["model", "input", "keep_alive"],
    "/api/embeddings": ["model", "prompt", "keep_alive"],
    "/api/show": ["model", "name"],
}

def nested(depth: int):
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


hostile = st.one_of(
    st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00\ud800"]),  # lone surrogates (a pair is fine)
    st.sampled_from([10 ** 400, -(2 ** 1024), 2 ** 63, 2 ** 31, 1e308, -1e38]),  # past any C type
    st.integers(90, 400).map(nested),  # near and past the reader's depth
    st.integers(10_000, 200_000).map(lambda n: "x" * n),  # longer than any context here
    st.integers(1_000, 40_000).map(lambda n: {f"k{i}": i for i in range(n)}),  # many unique keys
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, width=32),
                    st.text(max_size=12), st.sampled_from(["plain", "emb", "user", "assistant", "text", "json_object"]),
                    hostile)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
grammars = st.sampled_from(['root ::= "a"', "root ::= [\\x00]", 'root ::= ""', "root ::= (", 'root ::= "a" root',
                            "root ::= " + "(" * 300 + '"a"' + ")" * 300])
template_kwargs = st.dictionaries(st.sampled_from(sorted(chat_template.RESERVED) + ["enable_thinking", "x"]),
                                  json_values, max_size=3)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                                 "content": st.one_of(st.text(max_size=20), json_values)})


HI = [{"role": "user", "content": "hi"}]
VALID = {  # a request each endpoint answers 200, for one field at a time to be spoiled
    "/v1/chat/completions": {"model": "plain", "messages": HI, "max_tokens": 3},
    "/v1/completions": {"model": "plain", "prompt": "hi", "max_tokens": 3},
    "/v1/embeddings": {"model": "emb", "input": "hi"},
    "/v1/messages": {"model": "plain", "messages": HI, "max_tokens": 3},
    "/v1/messages/count_tokens": {"model": "plain", "messages": HI},
    "/tokenize": {"model": "plain", "content": "hi"},
    "/detokenize": {"model": "plain", "tokens": [1, 2]},
    "/apply-template": {"model": "plain", "messages": HI},
    "/models/load": {"model": "plain"},
    "/models/unload": {"model": "emb"},
    "/v1/responses": {"model": "plain", "input": "hi", "max_output_tokens": 3},
    "/v1/rerank": {"model": "rr", "query": "q", "documents": ["a", "b."]},
    "/api/chat": {"model": "plain", "messages": HI, "stream": False, "options": {"num_predict": 3}},
    "/api/generate": {"model": "plain", "prompt": "hi", "stream": False, "options": {"num_predict": 3}},
    "/api/embed": {"model": "emb", "input": "hi"},
    "/api/embeddings": {"model": "emb", "prompt": "hi"},
    "/api/show": {"model": "plain"},
}


def spoiled(path: str):
    """A valid request with one field (or the first message's content) replaced: hostile values
    reach the code behind validation far more often than in a body drawn whole."""
    def build(key: str, value: object) -> dict:
        body = json.loads(json.dumps(VALID[path]))
        if key == "messages[0].content":
            body["messages"][0]["content"] = value
        else:
            body[key] = value
        return body

    keys = ENDPOINTS[path] + (["messages[0].content"] * 4 if "messages" in VALID[path] else [])
    return st.builds(build, st.sampled_from(keys), st.one_of(hostile, grammars, template_kwargs, json_values))


def bodies(path: str):
    keys = ENDPOINTS[path]
    field_values = {k: json_values for k in keys}
    field_values["model"] = st.one_of(st.sampled_from(["plain", "emb", "rr", "PLAIN", "missing"]), json_values)
    field_values["messages"] = st.one_of(st.lists(message, max_size=3), json_values)
    for key, special in (("grammar", grammars), ("chat_template_kwargs", template_kwargs),
                         ("ignore_eos", st.booleans())):
        if key in field_values:
            field_values[key] = st.one_of(special, json_values)
    structured = st.fixed_dictionaries({}, optional=field_values)
    return st.one_of(structured, json_values, spoiled(path), spoiled(path))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    tm.thinking(d / "plain.gguf", "Hmm.", "Hello!")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_loaded_models: 0\nmodels:\n"
                   f"  plain:\n    path: {d}/plain.gguf\n    n_ctx: 512\n"
                   f"  emb:\n    path: {d}/plain.gguf\n    n_ctx: 512\n    embeddings: true\n"
                   f"  rr: {tm.reranker(d / 'rr.gguf', {'.': 0.7})}\n")
    with ServerProcess("--config", str(cfg)) as srv:
        for path in ENDPOINTS:  # every route once, both models loaded: the baseline for memory
            post(srv.url + path, json.dumps({"model": "plain", "messages": [{"role": "user", "content": "hi"}],
                                             "prompt": "hi", "input": "hi", "content": "hi", "tokens": [1],
                                             "max_tokens": 2}).encode())
        post(srv.url + "/v1/embeddings", b'{"model": "emb", "input": "hi"}')
        before = rss(srv.proc.pid)
        yield srv
        grown = rss(srv.proc.pid) - before
        health = srv.get("/health")[1]
        code, err = srv.stop()
        assert code == 0
        assert "Traceback" not in err and "unhandled error" not in err, err[-3000:]
        assert health["worker_failures"] == 0, health
        assert grown < 128 * 2**20, f"the gateway's RSS grew {grown / 2**20:.0f} MiB over the fuzz run"


def rss(pid: int) -> int:
    """Resident bytes of the gateway process (Linux; 0 elsewhere, which bounds nothing)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def post(url: str, raw: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=raw, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("path", list(ENDPOINTS))
def test_fuzzed_bodies_never_500(server, path):
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(bodies(path))
    def check(body):
        status, raw = post(server.url + path, json.dumps(body).encode())
        assert status != 500 and status < 600, (status, raw[:500])
        if status >= 400:
            err = json.loads(raw)
            if path.startswith("/v1/messages"):
                assert err["type"] == "error" and set(err["error"]) == {"type", "message"}
                assert isinstance(err["error"]["message"], str)
            elif path.startswith("/api/"):  # Ollama's shape: the message alone
                assert set(err) == {"error"} and isinstance(err["error"], str)
            else:
                validate(err, "ErrorResponse")

    check()


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b"\xff\xfe\x00", b'{"model": "plain"' + b" " * 10,
                                 b'"just a string"', b"1e999", b'{"a":' * 200 + b"1" + b"}" * 200])
def test_raw_garbage_never_500(server, raw):
    for path in ENDPOINTS:
        status, body = post(server.url + path, raw)
        assert status == 400, (path, raw, status, body[:300])
