"""Generated JSON bodies at every endpoint of a real server: never a 500, every error in its wire shape."""

import json
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import testmodels as tm
from helpers import ServerProcess
from openapi import validate

pytestmark = pytest.mark.slow

ENDPOINTS = {
    "/v1/chat/completions": ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                             "stop", "stream", "stream_options", "seed", "n", "logprobs", "top_logprobs",
                             "response_format", "grammar", "reasoning_format", "chat_template_kwargs", "top_k",
                             "ignore_eos", "presence_penalty", "user"],
    "/v1/completions": ["model", "prompt", "max_tokens", "echo", "logprobs", "stream", "stop", "suffix", "best_of",
                        "temperature", "grammar", "ignore_eos"],
    "/v1/embeddings": ["model", "input", "encoding_format", "dimensions"],
    "/v1/messages": ["model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
                     "top_k", "thinking", "metadata", "tools"],
    "/v1/messages/count_tokens": ["model", "messages", "system"],
    "/tokenize": ["model", "content", "add_special", "with_pieces"],
    "/detokenize": ["model", "tokens"],
    "/models/load": ["model"],
    "/models/unload": ["model"],
}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False, width=32),
                    st.text(max_size=12), st.sampled_from(["plain", "emb", "user", "assistant", "text", "json_object"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "x"]),
                                 "content": st.one_of(st.text(max_size=20), json_values)})


def bodies(keys):
    field_values = {k: json_values for k in keys}
    field_values["model"] = st.one_of(st.sampled_from(["plain", "emb", "PLAIN", "missing"]), json_values)
    field_values["messages"] = st.one_of(st.lists(message, max_size=3), json_values)
    structured = st.fixed_dictionaries({}, optional=field_values)
    return st.one_of(structured, json_values)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    tm.thinking(d / "plain.gguf", "Hmm.", "Hello!")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_loaded_models: 0\nmodels:\n"
                   f"  plain:\n    path: {d}/plain.gguf\n    n_ctx: 512\n"
                   f"  emb:\n    path: {d}/plain.gguf\n    n_ctx: 512\n    embeddings: true\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv
        code, err = srv.stop()
        assert code == 0
        assert "Traceback" not in err and "unhandled error" not in err, err[-3000:]


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
    @given(bodies(ENDPOINTS[path]))
    def check(body):
        status, raw = post(server.url + path, json.dumps(body).encode())
        assert status != 500 and status < 600, (status, raw[:500])
        if status >= 400:
            err = json.loads(raw)
            if path.startswith("/v1/messages"):
                assert err["type"] == "error" and set(err["error"]) == {"type", "message"}
                assert isinstance(err["error"]["message"], str)
            else:
                validate(err, "ErrorResponse")

    check()


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b"\xff\xfe\x00", b'{"model": "plain"' + b" " * 10,
                                 b'"just a string"', b"1e999", b'{"a":' * 200 + b"1" + b"}" * 200])
def test_raw_garbage_never_500(server, raw):
    for path in ENDPOINTS:
        status, body = post(server.url + path, raw)
        assert status == 400, (path, raw, status, body[:300])
