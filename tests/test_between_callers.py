"""Between callers, against the real server process: one API key cannot read, continue or
delete another's stored responses, learn from the prompt cache what another sent (with
``server.isolate_cache_by_key``), or see another's requests on the page's live stream; a web
page on another site cannot make a browser act on the gateway (CSRF); /health tells no details
without a key; an unload whose caller leaves still stops the worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ALICE, BOB = "alice-secret-key", "bob-secret-key"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("callers")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    return d


def config(d, server: str = "", name: str = "models.yaml") -> str:
    path = d / name
    path.write_text("server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\n" + server +
                    f"models:\n  plain:\n    path: {d}/plain.gguf\n    n_ctx: 1024\n    parallel: 1\n")
    return str(path)


def call(srv: ServerProcess, method: str, path: str, body: bytes | dict | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    hdrs = {"Content-Type": "application/json"} if isinstance(body, dict) else {}
    req = urllib.request.Request(srv.url + path, data=data, method=method, headers={**hdrs, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def key(k: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {k}"}


@pytest.fixture(scope="module")
def keyed(files):
    """Two keys, each prompt cache scoped to its key."""
    with ServerProcess("--config", config(files, f"  api_keys: {{alice: {ALICE}, bob: {BOB}}}\n"
                                                 "  isolate_cache_by_key: true\n", "keyed.yaml")) as srv:
        yield srv


def test_a_stored_response_is_its_keys_alone(keyed):
    status, made = call(keyed, "POST", "/v1/responses", {"model": "plain", "input": "hi", "store": True},
                        key(ALICE))
    assert status == 200
    rid = made["id"]
    assert call(keyed, "GET", f"/v1/responses/{rid}", headers=key(ALICE))[0] == 200
    status, body = call(keyed, "GET", f"/v1/responses/{rid}", headers=key(BOB))
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = call(keyed, "POST", "/v1/responses",
                        {"model": "plain", "input": "and?", "previous_response_id": rid}, key(BOB))
    assert status == 404 and body["error"]["param"] == "previous_response_id"
    assert call(keyed, "DELETE", f"/v1/responses/{rid}", headers=key(BOB))[0] == 404
    # still there for its own key, which may continue and delete it
    status, _ = call(keyed, "POST", "/v1/responses",
                     {"model": "plain", "input": "and?", "previous_response_id": rid}, key(ALICE))
    assert status == 200
    assert call(keyed, "DELETE", f"/v1/responses/{rid}", headers=key(ALICE))[0] == 200


def cached(srv: ServerProcess, k: str, text: str) -> int:
    status, body = call(srv, "POST", "/v1/chat/completions",
                        {"model": "plain", "messages": [{"role": "user", "content": text}], "max_tokens": 2}, key(k))
    assert status == 200, body
    return body["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_the_prompt_cache_does_not_tell_one_key_what_another_sent(keyed, files):
    prompt = "a long and private prompt " * 8
    cached(keyed, ALICE, prompt)
    assert cached(keyed, ALICE, prompt) > 10  # the key's own cache is reused
    cached(keyed, ALICE, prompt)
    assert cached(keyed, BOB, prompt) == 0  # another key's is not
    assert cached(keyed, BOB, prompt) > 10
    # off (the default, one user's keys): the cache is shared, as it was
    with ServerProcess("--config", config(files, f"  api_keys: {{alice: {ALICE}, bob: {BOB}}}\n", "shared.yaml")) \
            as shared:
        cached(shared, ALICE, prompt)
        assert cached(shared, BOB, prompt) > 10


def test_health_tells_details_only_to_a_key_and_live_shows_a_key_its_own_requests(keyed):
    status, body = keyed.get("/health")
    assert status == 200 and body["status"] == "ok" and set(body) == {"status", "version"}
    status, body = keyed.get("/health", headers=key(BOB))
    assert status == 200 and "workers" in body and "upstreams" in body
    assert call(keyed, "POST", "/v1/completions", {"model": "plain", "prompt": "alice was here", "max_tokens": 2},
                key(ALICE))[0] == 200
    assert call(keyed, "POST", "/v1/completions", {"model": "plain", "prompt": "bob was here", "max_tokens": 2},
                key(BOB))[0] == 200

    def recent(k: str) -> list[dict]:
        req = urllib.request.Request(keyed.url + "/dashboard/live", headers=key(k))
        with urllib.request.urlopen(req, timeout=10) as r:
            for line in r:
                if line.startswith(b"data: "):
                    return json.loads(line[6:])["recent"]
        raise AssertionError("no snapshot")

    assert recent(ALICE) and {e["principal"] for e in recent(ALICE)} == {"alice"}
    assert {e["principal"] for e in recent(BOB)} == {"bob"}


@pytest.fixture(scope="module")
def open_server(files):
    """No keys (the default on a workstation): what a web page could reach."""
    with ServerProcess("--config", config(files, "  cors_origins: ['http://localhost:3000']\n", "open.yaml")) as srv:
        yield srv


CHAT = json.dumps({"model": "plain", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


@pytest.mark.parametrize("path, body", [
    ("/models/load", b'{"model": "plain"}'), ("/models/unload", b'{"model": "plain"}'),
    ("/v1/chat/completions", CHAT), ("/v1/responses", b'{"model": "plain", "input": "hi"}'),
    ("/api/chat", b'{"model": "plain", "messages": [{"role": "user", "content": "hi"}]}'),
])
def test_a_page_on_another_site_cannot_act_through_a_browser(open_server, path, body):
    # the bodies browsers post without asking first: text/plain, a form
    status, err = call(open_server, "POST", path, body, {"Content-Type": "text/plain"})
    assert status == 415, err
    status, err = call(open_server, "POST", path, body, {"Content-Type": "text/plain;charset=UTF-8",
                                                         "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert status == 403, err
    # a page on another port of this host is another origin
    status, err = call(open_server, "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded",
                                                         "Origin": "http://127.0.0.1:9", "Sec-Fetch-Site": "same-site"})
    assert status == 403, err
    status, err = call(open_server, "POST", path, body, {"Content-Type": "application/json", "Origin": "null"})
    assert status == 403, err
    # no Origin, but a browser's fetch metadata says it came from another site
    assert call(open_server, "POST", path, body, {"Content-Type": "application/json",
                                                  "Sec-Fetch-Site": "cross-site"})[0] == 403


def test_programs_and_allowed_pages_still_work(open_server):
    ok = {"Content-Type": "application/json"}
    assert call(open_server, "POST", "/v1/chat/completions", CHAT, ok)[0] == 200
    assert call(open_server, "POST", "/v1/chat/completions", CHAT)[0] == 200  # no type at all
    # curl -d (the form type, no browser headers): Ollama's own examples post so
    assert call(open_server, "POST", "/v1/chat/completions", CHAT,
                {"Content-Type": "application/x-www-form-urlencoded"})[0] == 200
    # the gateway's own page (same origin), and an origin server.cors_origins names
    own = f"http://127.0.0.1:{open_server.port}"
    assert call(open_server, "POST", "/v1/chat/completions", CHAT,
                {**ok, "Origin": own, "Sec-Fetch-Site": "same-origin"})[0] == 200
    assert call(open_server, "POST", "/v1/chat/completions", CHAT,
                {**ok, "Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"})[0] == 200
    # reading stays open: a cross-site page cannot see the answer without CORS anyway
    assert open_server.get("/v1/models", headers={"Origin": "http://evil.example"})[0] == 200
    status, body = open_server.get("/health")
    assert status == 200 and "workers" in body  # no keys: the details are the user's own


def worker_pid(srv: ServerProcess) -> int:
    status, body = srv.get("/health")
    return body["workers"]["plain"]


def test_an_unload_whose_caller_leaves_still_stops_the_worker(open_server):
    assert call(open_server, "POST", "/models/load", {"model": "plain"})[0] == 200
    pid = worker_pid(open_server)
    os.kill(pid, signal.SIGSTOP)  # a worker that will not exit when asked: the stop must kill it
    try:
        s = socket.create_connection(("127.0.0.1", open_server.port))
        body = b'{"model": "plain"}'
        s.sendall(b"POST /models/unload HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)  # the stop is under way, waiting for the worker
        s.close()  # the caller leaves: its handler is cancelled
        deadline = time.monotonic() + 20  # the stop's own timeout, then the kill
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ", 1)[1].startswith("Z"):
                        break  # killed, not yet reaped
            except (ProcessLookupError, FileNotFoundError):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"worker {pid} still runs after its unload's caller left")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    status, body = open_server.get("/models")
    assert status == 200 and next(m for m in body["data"] if m["id"] == "plain")["state"] == "unloaded"
    # and it loads and answers again
    assert call(open_server, "POST", "/v1/chat/completions", CHAT, {"Content-Type": "application/json"})[0] == 200
