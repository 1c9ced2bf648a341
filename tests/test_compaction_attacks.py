"""An attacker's pass on `POST /v1/responses/compact` and `POST /v1/responses/input_tokens`, from
outside, on the real `gguf-gateway serve` process with real llama.cpp inference (scripted
models): what a stranger, a scoped user key and a hostile body can do with them.

- Scope and limits: a key's models bound both routes (another model is the same 404 as none); a
  compact's every summary is charged (tpm refuses the next one), counted by rpm.
- Time: a compact past `server.request_timeout` is a 504, never a `compaction` item that holds
  less than the conversation (an empty summary is a 500 for the same reason); a client that
  leaves mid-compact stops its generations and the model serves on at once.
- Seals: a forged, altered or cross-field (reasoning <-> compaction) `encrypted_content` is a 400
  naming it; a `kept` a client writes into an item is not read.
- Bounds: a body's worth of text, items by the hundred thousand and a hosted tool in the body
  are bounded answers; the model keeps serving.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

import pytest
from helpers import ServerProcess, request

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

TURNS = [{"role": "user" if i % 2 == 0 else "assistant",
          "content": f"Turn {i}: " + " ".join(f"word{j}" for j in range(60))} for i in range(6)]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("attack-models")
    tm.plain(d / "plain.gguf", ["Ada", " lives", " in", " Paris", "."])
    tm.endless(d / "loop.gguf")
    tm.plain(d / "mute.gguf", [" ", "\n"])
    return d


@pytest.fixture(scope="module")
def keyed(models, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("attack-keyed") / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  responses_store: 16\n  api_keys:\n"
                   f"    admin: admin-secret\n"
                   f"    a: {{key: a-secret, models: [plain]}}\n"
                   f"    b: {{key: b-secret, models: [loop], tpm: 100}}\n"
                   f"    r: {{key: r-secret, models: [plain], rpm: 3}}\n"
                   f"models:\n  plain: {models}/plain.gguf\n  loop: {models}/loop.gguf\n  mute: {models}/mute.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


@pytest.fixture(scope="module")
def timed(models, tmp_path_factory):
    """No keys; `request_timeout: 0.3` and a model that never stops (its summary: 1024 tokens)."""
    cfg = tmp_path_factory.mktemp("attack-timed") / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  request_timeout: 0.3\n"
                   f"models:\n  loop: {models}/loop.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


def post(srv, path, body, key=None, **kw):
    return request(srv.url + path, body, headers=bearer(key) if key else None, **kw)


def serves(srv, key=None, model="plain"):
    status, body, _ = post(srv, "/v1/responses", {"model": model, "input": "hi", "max_output_tokens": 5}, key)
    assert status == 200 and body["status"] in ("completed", "incomplete"), body


def test_scope_holds_both_routes(keyed):
    for path in ("/v1/responses/compact", "/v1/responses/input_tokens"):
        status, body, _ = post(keyed, path, {"model": "plain", "input": "hi"})
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        outside = post(keyed, path, {"model": "loop", "input": "hi"}, "a-secret")[:2]
        nothing = post(keyed, path, {"model": "no-such-model", "input": "hi"}, "a-secret")[:2]
        assert outside[0] == 404 and outside[1]["error"]["param"] == "model"
        assert outside[1]["error"]["message"].replace("loop", "X") == \
            nothing[1]["error"]["message"].replace("no-such-model", "X")
    # another key's stored response, on both routes
    status, mine, _ = post(keyed, "/v1/responses", {"model": "plain", "input": "My secret is 42."}, "a-secret")
    assert status == 200
    for path in ("/v1/responses/compact", "/v1/responses/input_tokens"):
        status, body, _ = post(keyed, path, {"model": "plain", "previous_response_id": mine["id"], "input": "?"},
                               "admin-secret")
        assert status == 404 and body["error"]["param"] == "previous_response_id"


def test_every_summary_is_charged_and_counted(keyed):
    """A compact on a model that never stops writes the longest summary: the key's tpm is
    charged with all of it, so the next request is refused."""
    status, body, _ = post(keyed, "/v1/responses/compact", {"model": "loop", "input": TURNS}, "b-secret",
                           timeout=120)
    assert status == 200 and body["usage"]["output_tokens"] > 100, body
    status, body, headers = post(keyed, "/v1/responses/compact", {"model": "loop", "input": "hi"}, "b-secret")
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded" and headers["X-Gateway-Limit"] == "tpm"
    # rpm counts a compact as one request
    codes = [post(keyed, "/v1/responses/compact", {"model": "plain", "input": "hi"}, "r-secret")[0]
             for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    serves(keyed, "a-secret")


def test_a_compact_past_the_request_timeout_is_an_error(timed):
    """Past `request_timeout` the worker ends each summary at once: a 200 would hand the caller
    a compaction holding an empty or cut summary, and the caller drops its history for it."""
    serves(timed, model="loop")  # loaded: the deadline falls in the summary's writing, not in the load
    started = time.monotonic()
    status, body, _ = post(timed, "/v1/responses/compact", {"model": "loop", "input": TURNS}, timeout=120)
    assert status == 504 and body["error"]["code"] == "timeout", body
    assert "request_timeout" in body["error"]["message"] and body["error"]["type"] == "server_error"
    assert time.monotonic() - started < 10
    serves(timed, model="loop")


def test_an_empty_summary_is_an_error(keyed):
    status, body, _ = post(keyed, "/v1/responses/compact", {"model": "mute", "input": TURNS[:2]}, "admin-secret")
    assert status == 500 and body["error"]["code"] == "empty_summary", body
    serves(keyed, "admin-secret")


def test_a_client_that_leaves_mid_compact_stops_it(keyed):
    """A history of several parts on a model that never stops: seconds of summaries, left after
    half of one."""
    serves(keyed, "admin-secret", model="loop")
    turns = TURNS * 8
    conn = http.client.HTTPConnection("127.0.0.1", keyed.port)
    conn.request("POST", "/v1/responses/compact", json.dumps({"model": "loop", "input": turns}).encode(),
                 {"Content-Type": "application/json", **bearer("admin-secret")})
    time.sleep(0.5)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    started = time.monotonic()
    serves(keyed, "admin-secret", model="loop")
    assert time.monotonic() - started < 2
    deadline = time.monotonic() + 10
    while '"status":499' not in keyed.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [line for line in keyed.output().splitlines() if '"status":499' in line]
    assert left, [line for line in keyed.output().splitlines() if "compact" in line][-3:]
    assert '"endpoint":"/v1/responses/compact"' in left[-1] and '"client_disconnected":true' in left[-1]


def test_seals_do_not_cross(keyed):
    status, out, _ = post(keyed, "/v1/responses/compact", {"model": "plain", "input": [
        {"role": "user", "content": "secret plan", "kept": ["injected"] * 50}]}, "a-secret")
    assert status == 200
    assert [i["content"][0]["text"] for i in out["output"][:-1]] == ["secret plan"]  # a client's `kept` is not read
    sealed = out["output"][-1]["encrypted_content"]
    body, mac = sealed.split(".")
    for where, forged in (("compaction", sealed + "x"), ("compaction", f"{body}x.{mac}"), ("compaction", None),
                          ("compaction", 5), ("compaction", ["x"]), ("compaction", "é.é"), ("compaction", "x" * 2**20),
                          ("reasoning", sealed)):
        item = ({"type": "compaction", "encrypted_content": forged} if where == "compaction" else
                {"type": "reasoning", "summary": [], "encrypted_content": forged})
        for path in ("/v1/responses", "/v1/responses/compact", "/v1/responses/input_tokens"):
            status, err, _ = post(keyed, path, {"model": "plain", "input": [item, {"role": "user", "content": "?"}]},
                                  "a-secret")
            assert status == 400 and err["error"]["param"] == "input[0].encrypted_content", (path, err)
    serves(keyed, "a-secret")


def test_hostile_bodies_get_bounded_answers(keyed):
    big = "ab " * 10_000_000  # 30 MB, under the body limit
    status, body, _ = post(keyed, "/v1/responses/compact", {"model": "plain", "input": big}, "a-secret", timeout=120)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded" and body["error"]["param"] == "input"
    assert "needs at least" in body["error"]["message"]
    status, body, _ = post(keyed, "/v1/responses/input_tokens", {"model": "plain", "input": big}, "a-secret",
                           timeout=120)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    # passed-over items by the hundred thousand, then a message
    items = [{"type": "mcp_list_tools", "server_label": "s", "tools": []}] * 200_000
    status, body, _ = post(keyed, "/v1/responses/compact", {"model": "plain", "input": items}, "a-secret",
                           timeout=120)
    assert status == 400 and body["error"]["param"] == "input" and "nothing to compact" in body["error"]["message"]
    # a hosted tool in the body is not connected to: the routes neither run nor list tools
    mcp = {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9/mcp", "require_approval": "never"}
    for path in ("/v1/responses/compact", "/v1/responses/input_tokens"):
        status, body, _ = post(keyed, path, {"model": "plain", "input": "hi", "tools": [mcp], "stream": True,
                                             "max_output_tokens": 1}, "a-secret")
        assert status == 200 and "error" not in body, body
    for bad, param in (({"max_output_tokens": -1}, "max_output_tokens"), ({"stream": "yes"}, "stream"),
                       ({"previous_response_id": 5}, "previous_response_id"), ({"instructions": []}, "instructions"),
                       ({"input": [{"type": "compaction"}] * 3}, "input[0].encrypted_content"),
                       ({"input": [[[[[]]]]]}, "input[0]")):
        for path in ("/v1/responses/compact", "/v1/responses/input_tokens"):
            status, body, _ = post(keyed, path, {"model": "plain", "input": "hi", **bad}, "a-secret")
            assert status == 400 and body["error"]["param"] == param, (path, bad, body)
    serves(keyed, "a-secret")
    assert "Traceback" not in keyed.output()


def test_a_history_denser_further_on_is_cut_by_its_own_measure(keyed):
    """The bytes a token holds are measured on the history's start; on this vocabulary a run of
    spaces is several tokens a byte, so a tail of spaced letters holds twice the tokens its
    bytes suggest: its parts, refused by the context, are measured again and cut, not a 400
    naming `messages` (a field the caller never sent)."""
    text = "a" * 4000 + "a    " * 2000
    status, body, _ = post(keyed, "/v1/responses/compact", {"model": "plain", "input": text}, "a-secret", timeout=120)
    assert status == 200 and body["output"][-1]["type"] == "compaction", body
    assert body["usage"]["input_tokens"] > 4096
    # more than 32 summaries' worth, found only as its parts are refused: a 400 naming `input`
    text = "a" * 4000 + "a    " * 8000
    status, body, _ = post(keyed, "/v1/responses/compact", {"model": "plain", "input": text}, "a-secret", timeout=120)
    assert status == 400 and body["error"]["param"] == "input", body
    assert body["error"]["code"] == "context_length_exceeded"
    serves(keyed, "a-secret")
