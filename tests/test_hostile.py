"""Hostile input against the real server process: each input that once killed a worker, grew
the gateway, froze a model or held a connection forever, with the requests around it
unaffected. (Access, limits and faults of a friendlier kind: test_hardening.py.)"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib

import pytest
from helpers import ServerProcess, request

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}{% if n is defined %}{{ n + 1 }}{% endif %}\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    return d


def config(d, server: str = "") -> str:
    path = d / f"models-{abs(hash(server))}.yaml"
    path.write_text(
        "server:\n  discover_default_stores: false\n  max_loaded_models: 0\n  write_timeout: 1\n"
        "  header_timeout: 1\n  keepalive_timeout: 2\n  body_timeout: 2\n  max_body_bytes: 4000000\n" + server +
        f"models:\n  plain:\n    path: {d}/plain.gguf\n    n_ctx: 1024\n"
        f"  loop:\n    path: {d}/loop.gguf\n    n_ctx: 16384\n    parallel: 2\n"
        f"  tmpl:\n    path: {d}/plain.gguf\n    chat_template: {json.dumps(TEMPLATE)}\n")
    return str(path)


@pytest.fixture
def sockets():
    """Raw sockets a test opens, closed however it ends (a leaked one fails a later test)."""
    opened: list[socket.socket] = []

    def connect(port: int, first: bytes = b"", rcvbuf: int | None = None) -> socket.socket:
        s = socket.socket()
        opened.append(s)
        if rcvbuf:  # a reader that stalls: a small window, and small segments (on loopback the
            # server's send buffer otherwise grows to megabytes before any write blocks)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        s.connect(("127.0.0.1", port))
        if first:
            s.sendall(first)
        return s

    yield connect
    for s in opened:
        s.close()


@pytest.fixture(scope="module")
def server(files):
    with ServerProcess("--config", config(files)) as srv:
        yield srv
        code, log = srv.stop()
        assert code == 0
        assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]


def health(srv) -> dict:
    return srv.get("/health")[1]


def metric(srv, name: str, **labels) -> float:
    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+]+)"
    m = re.search(pattern, text)
    return float(m.group(1)) if m else 0.0


class Neighbour:
    """A streamed answer of ``n`` tokens on a model, read in a thread while the hostile
    requests run: it must end as if they had not."""

    def __init__(self, srv, model: str = "loop", n: int = 400):
        self.n, self.events, self.error = n, [], None
        body = {"model": model, "prompt": "go\n", "max_tokens": n, "stream": True, "temperature": 0}
        self.thread = threading.Thread(target=self._run, args=(srv.url + "/v1/completions", body), daemon=True)
        self.thread.start()

    def _run(self, url, body):
        try:
            req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                for line in r:
                    if line.startswith(b"data: {"):
                        self.events.append(json.loads(line[6:]))
        except Exception as e:  # noqa: BLE001 (reported by check)
            self.error = e

    def check(self):
        self.thread.join(120)
        assert self.error is None, self.error
        text = "".join(e["choices"][0]["text"] for e in self.events)
        assert self.events[-1]["choices"][0]["finish_reason"] == "length"
        assert text == "".join([" tick", " tock"] * self.n)[: len(text)] and text.count(" t") == self.n


# --- one request must not kill a model's worker ------------------------------------------------

FINISHING_GRAMMARS = [
    {"grammar": 'root ::= "a"', "ignore_eos": True},
    {"grammar": "root ::= [\\x00]"},
    # JSON's grammar allows whitespace without end after the object: sampled, it may run to max_tokens
    {"response_format": {"type": "json_object"}, "ignore_eos": True, "max_tokens": 400},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"enum": ["a"]}}},
     "ignore_eos": True},
    {"grammar": 'root ::= "a"', "ignore_eos": True, "temperature": 0.9, "seed": 3},
]


@pytest.mark.parametrize("extra", FINISHING_GRAMMARS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_grammar_that_is_complete_or_unsatisfiable_ends_the_answer(server, path, extra):
    neighbour = Neighbour(server)
    body = {"model": "loop", **extra, **({"messages": HI} if "chat" in path else {"prompt": "go\n"})}
    status, out, _ = request(server.url + path, body)
    assert status == 200, out
    choice = out["choices"][0]
    endings = {"stop", "length"} if extra.get("response_format", {}).get("type") == "json_object" else {"stop"}
    assert choice["finish_reason"] in endings, out
    text = choice["message"]["content"] if "chat" in path else choice["text"]
    assert text in ("", "a", '"a"') or text.startswith("{"), text
    req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = r.read().decode()
    assert any(f'"finish_reason":"{e}"' in lines for e in endings) and lines.rstrip().endswith("data: [DONE]")
    neighbour.check()
    assert health(server)["worker_failures"] == 0


@pytest.mark.parametrize("grammar, problem", [
    ("root ::= " + "(" * 20000 + '"a"' + ")" * 20000, "nests groups"),
    ("root ::= " + " | ".join(f'"w{i}"' for i in range(40000)), "at most"),
    ('root ::= ("a"', "does not parse"),
])
def test_grammars_llama_cpp_cannot_take_are_a_400(server, grammar, problem):
    status, out, _ = request(server.url + "/v1/chat/completions", {"model": "plain", "messages": HI, "grammar": grammar})
    assert status == 400 and out["error"]["param"] == "grammar" and problem in out["error"]["message"], out
    assert health(server)["worker_failures"] == 0


# --- nothing a request sends is kept -------------------------------------------------------------

def rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_unique_unknown_fields_do_not_grow_the_gateway(server):
    def send(seed: int):
        body = {f"k{seed}_{i}": 1 for i in range(100_000)}
        body.update(model="no-such-model", messages=HI)
        status, out, _ = request(server.url + "/v1/chat/completions", body)
        assert status == 404, out
        status, out, _ = request(server.url + "/v1/completions", {**body, "model": "plain", "prompt": "x",
                                                                 "max_tokens": 1})
        assert status == 200, out

    send(0)  # the allocator's own growth to hold one such body
    before = rss(server.proc.pid)
    for seed in range(1, 9):
        send(seed)
    grown = rss(server.proc.pid) - before
    assert grown < 48 * 2**20, f"gateway RSS grew {grown / 2**20:.0f} MiB over 1.6 million unique field names"


# --- a huge prompt does not freeze a model -------------------------------------------------------

def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(server):
    neighbour = Neighbour(server)
    for path, body, param in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 400_000}]}, "messages"),
        ("/v1/completions", {"prompt": "y" * 400_000}, "prompt"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "z" * 400_000}], "max_tokens": 5}, None),
        ("/tokenize", {"content": "x" * 400_000}, "content"),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x" * 400_000}]}, None),
    ]:
        status, out, _ = request(server.url + path, {"model": "plain", **body})
        assert status == 400, (path, out)
        err = out["error"]
        assert "bytes" in err["message"] and "at least" in err["message"], err  # refused by size, untokenized
        if param:
            assert err["param"] == param and err["code"] == "context_length_exceeded"
    neighbour.check()


def test_a_long_prompt_being_tokenized_does_not_hold_up_a_short_one(server):
    # fits by size (n_ctx 16384, at most 12 bytes a token) so it is tokenized; it is still too long
    done: dict[str, float] = {}

    def long():
        status, out, _ = request(server.url + "/v1/completions", {"model": "loop", "prompt": "x" * 190_000})
        assert status == 400 and "190001 in the prompt" in out["error"]["message"], out
        done["long"] = time.monotonic()

    t = threading.Thread(target=long)
    t.start()
    time.sleep(0.2)
    status, out, _ = request(server.url + "/v1/completions", {"model": "loop", "prompt": "go\n", "max_tokens": 3})
    done["short"] = time.monotonic()
    assert status == 200 and out["choices"][0]["text"] == " tick tock tick"
    t.join(60)
    assert done["short"] < done["long"]


# --- a client that stops reading ------------------------------------------------------------------

def test_a_stalled_reader_is_dropped_after_write_timeout(server, sockets):
    before = metric(server, "gguf_gateway_client_disconnects_total", model="loop", endpoint="/v1/completions")
    body = json.dumps({"model": "loop", "prompt": "go\n", "max_tokens": 16000, "stream": True}).encode()
    for _ in range(3):  # never read
        sockets(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json"
                             b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body), rcvbuf=4096)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and health(server)["in_flight"] < 3:
        time.sleep(0.05)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and health(server)["in_flight"]:
        time.sleep(0.2)
    assert health(server)["in_flight"] == 0
    status, out, _ = request(server.url + "/models/unload", {"model": "loop"})
    assert status == 200, out  # nothing holds it
    after = metric(server, "gguf_gateway_client_disconnects_total", model="loop", endpoint="/v1/completions")
    assert after - before == 3


# --- connections ----------------------------------------------------------------------------------

def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing ``sock``, or None if it is still open after ``seconds``."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        return got


def test_idle_slow_and_endless_connections_are_closed(server, sockets):
    def connect(first: bytes = b"") -> socket.socket:
        return sockets(server.port, first)

    idle = connect()
    partial = connect(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    drip = connect(b"GET /health HTTP/1.1\r\n")
    endless = connect(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                      b"Content-Type: application/json\r\n\r\n5\r\n{\"a\":\r\n")
    kept = connect(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    try:
        for _ in range(8):  # a header line every half second: never a whole request
            time.sleep(0.5)
            drip.sendall(b"X-Slow: 1\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed on it, as it should be
    else:
        pytest.fail("a connection sending a header line every half second was never closed")
    for s in (idle, partial, drip):
        assert closed_within(s, 5) == b""
    answer = closed_within(endless, 5)
    assert answer is not None and answer.startswith(b"HTTP/1.1 408") and b'"code": "request_timeout"' in answer
    answer = closed_within(kept, 5)  # answered, then closed once idle for keepalive_timeout
    assert answer is not None and answer.startswith(b"HTTP/1.1 200")
    assert metric(server, "gguf_gateway_connections_closed_total", reason="header_timeout") >= 3
    assert metric(server, "gguf_gateway_connections_closed_total", reason="keepalive_timeout") >= 1


def test_connections_past_the_limit_are_refused_and_the_rest_keep_working(files, sockets):
    with ServerProcess("--config", config(files, "  max_connections: 20\n  header_timeout: 30\n")) as srv:
        held = [sockets(srv.port) for _ in range(20)]
        time.sleep(0.3)
        answer = closed_within(sockets(srv.port), 5)
        assert answer is not None and answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
        for s in held[:5]:
            s.close()
        time.sleep(0.3)
        status, out, _ = request(srv.url + "/v1/chat/completions", {"model": "plain", "messages": HI})
        assert status == 200 and out["choices"][0]["message"]["content"] == "Hello, world!"
        code, log = srv.stop()
    assert log.count("refused") == 1 and "Traceback" not in log


def test_malformed_http_is_one_line_in_the_log_and_never_the_header(files, sockets):
    secret = "sk-" + "S3CRET" * 10_000
    with ServerProcess("--config", config(files)) as srv:
        for raw in [
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET /health HTTP/1.1\r\nAuthorization: Bearer " + secret.encode() + b"\r\nHost: localhost\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            b"GET /health HTTP/9.9\r\n\r\n",
            b"GET /health HTTP/1.1\r\n\r\n",  # no Host
        ]:
            answer = closed_within(sockets(srv.port, raw), 10)
            assert answer is not None and re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
        assert srv.get("/health")[0] == 200
        code, log = srv.stop()
    assert "Traceback" not in log and "S3CRET" not in log, log[-2000:]
    assert "malformed HTTP request" in log


# --- request bodies --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/embeddings"])
@pytest.mark.parametrize("raw, code", [
    (b'{"model": "plain", "messages": [{"role": "user", "content": "\\ud800"}], "prompt": "\\udfff", '
     b'"input": "\\ud800x", "max_tokens": 3}', "invalid_unicode"),
    (b'{"model": "plain", "stop": ["\\ud800"], "stop_sequences": ["\\ud800"], "messages": [], "max_tokens": 3}',
     "invalid_unicode"),
    (b'{"\\ud800": 1}', "invalid_unicode"),
    (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json"),
    (b'{"model": "plain", "max_tokens": ' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"model": "plain", "temperature": NaN}', "invalid_json"),
])
def test_bodies_python_reads_but_nothing_can_use_are_a_400(server, path, raw, code):
    status, out, _ = request(server.url + path, raw=raw)
    assert status == 400, out
    if path == "/v1/messages":
        assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
    else:
        assert out["error"]["code"] == code, out


@pytest.mark.parametrize("field", ["repeat_penalty", "temperature", "top_k", "max_tokens", "seed", "top_p",
                                   "presence_penalty", "min_p"])
@pytest.mark.parametrize("value", [10 ** 400, 2 ** 1024, -(10 ** 400), 1e308])
def test_numbers_beyond_what_llama_cpp_takes_are_a_400(server, field, value):
    for path, body in [("/v1/chat/completions", {"messages": HI}), ("/v1/completions", {"prompt": "x"})]:
        status, out, _ = request(server.url + path, {"model": "plain", field: value, **body})
        assert status == 400 and out["error"]["param"] == field, (path, field, out)
    assert health(server)["worker_failures"] == 0


def test_content_encodings(server):
    body = json.dumps({"model": "plain", "messages": HI}).encode()
    url = server.url + "/v1/chat/completions"
    for encoding, data in [("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))]:
        status, out, _ = request(url, raw=data, headers={"Content-Encoding": encoding})
        assert status == 200 and out["choices"][0]["message"]["content"] == "Hello, world!"
        status, out, _ = request(url, raw=body, headers={"Content-Encoding": encoding})  # not compressed
        assert status == 400 and out["error"]["code"] == "invalid_body", out
    for encoding in ("br", "zstd", "compress"):
        status, out, _ = request(url, raw=body, headers={"Content-Encoding": encoding})
        assert status == 415 and out["error"]["code"] == "unsupported_content_encoding", out
        status, out, _ = request(server.url + "/v1/messages", raw=body, headers={"Content-Encoding": encoding})
        assert status == 415 and out["type"] == "error", out
    bomb = gzip.compress(b'{"model": "plain", "pad": "' + b" " * 20_000_000 + b'"}')  # 20 MB from ~20 KB
    status, out, _ = request(url, raw=bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and out["error"]["code"] == "request_too_large", out


@pytest.mark.parametrize("kwargs, param", [
    ({"self": 1}, "chat_template_kwargs.self"), ({"tools": 5}, "chat_template_kwargs.tools"),
    ({"namespace": 1}, "chat_template_kwargs.namespace"), ({"messages": []}, "chat_template_kwargs.messages"),
    ({"n": "text"}, "chat_template_kwargs"),  # the template does arithmetic on it
])
def test_template_variables_that_collide_or_break_the_template_are_a_400(server, kwargs, param):
    status, out, _ = request(server.url + "/v1/chat/completions",
                             {"model": "tmpl", "messages": HI, "chat_template_kwargs": kwargs})
    assert status == 400 and out["error"]["param"] == param, out
    status, out, _ = request(server.url + "/v1/chat/completions",
                             {"model": "tmpl", "messages": HI, "chat_template_kwargs": {"n": 1}})
    assert status == 200


def test_stop_strings_are_bounded_and_matched_in_linear_time(server):
    huge = ["x" * 300_000, "y" * 270_000]
    for path, body in [("/v1/chat/completions", {"messages": HI, "stop": huge}),
                       ("/v1/completions", {"prompt": "go\n", "stop": huge}),
                       ("/v1/messages", {"messages": HI, "max_tokens": 5, "stop_sequences": huge})]:
        status, out, _ = request(server.url + path, {"model": "loop", **body})
        assert status == 400, out
        if path != "/v1/messages":
            assert out["error"]["param"] == "stop" and "4096" in out["error"]["message"]
    # the most the bound allows, every string nearly matching the answer all along
    stops = [(" tick tock" * 26)[:255] + "!" for _ in range(16)]
    status, out, _ = request(server.url + "/v1/completions",
                             {"model": "loop", "prompt": "go\n", "max_tokens": 4000, "stop": stops})
    assert status == 200 and out["choices"][0]["finish_reason"] == "length"
    assert out["choices"][0]["text"] == "".join([" tick", " tock"] * 2000)


# --- the model's lifecycle --------------------------------------------------------------------------

def test_unloading_a_model_while_it_loads_answers_its_waiters_503(server):
    """The unload has to land while the load runs, which takes a tenth of a second or so (a
    spare worker is ready): where the load wins the race, the waiters are answered and the
    round is tried again."""
    for _ in range(20):
        results = []

        def wait_for_it(results=results):
            results.append(request(server.url + "/v1/chat/completions", {"model": "plain", "messages": HI}))

        request(server.url + "/models/unload", {"model": "plain"})
        waiters = [threading.Thread(target=wait_for_it) for _ in range(3)]
        for t in waiters:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = {m["id"]: m["state"] for m in server.get("/models")[1]["data"]}
            if states["plain"] != "unloaded":
                break
            time.sleep(0.001)
        status, out, _ = request(server.url + "/models/unload", {"model": "plain"})
        for t in waiters:
            t.join(60)
        codes = sorted(r[0] for r in results)
        if codes == [200] * 3:  # loaded (and answered) before the unload came
            assert status in (200, 409), out
            continue
        assert status == 200, out
        assert codes == [503] * 3, results
        for _status, out, headers in results:
            assert out["error"]["code"] == "model_unloaded" and headers["Retry-After"] == "1"
        break
    else:
        pytest.fail("the load was over before the unload in every round")
    status, out, _ = request(server.url + "/v1/chat/completions", {"model": "plain", "messages": HI})
    assert status == 200


# --- tools -----------------------------------------------------------------------------------------

def _deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "x" * 100_000}}]},
     "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": 10 ** 400}, "tool_choice"),
    ("/v1/chat/completions", {"tools": [TOOL] * 1000}, "tools"),
    ("/v1/chat/completions", {"tools": [TOOL], "parallel_tool_calls": [[[]]]}, "parallel_tool_calls"),
    ("/v1/chat/completions", {"messages": [*HI, {"role": "tool", "tool_call_id": 10 ** 400, "content": "r"}]},
     "messages[1].tool_call_id"),
    ("/v1/messages", {"tools": [{"name": "f", "input_schema": "\u00e9" * 10_000}]}, "tools.0.input_schema"),
    ("/v1/messages", {"tools": [{"name": "f", "input_schema": {"type": "object"}}],
                      "tool_choice": {"type": "tool", "name": ["f"]}}, "tool_choice.name"),
    ("/v1/messages", {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": {}}]}]},
     "messages.0.content.0.tool_use_id"),
])
def test_hostile_tool_fields_are_a_400_naming_the_param(server, path, extra, param):
    body = {"model": "plain", "messages": HI, "max_tokens": 3, **extra}
    status, out, _ = request(server.url + path, body)
    assert status == 400, out
    if path == "/v1/messages":  # Anthropic's shape names the param at the head of the message
        assert out["type"] == "error" and out["error"]["message"].startswith(param), out
    else:
        assert out["error"]["param"] == param, out


def test_a_deeply_nested_tool_schema_is_served_or_refused_never_a_500(server):
    for depth in (40, 95):  # the body reader takes JSON up to 100 deep
        tools = [{"type": "function", "function": {"name": "f", "parameters": _deep_schema(depth)}}]
        status, out, _ = request(server.url + "/v1/chat/completions",
                                 {"model": "plain", "messages": HI, "max_tokens": 3, "tools": tools})
        assert status in (200, 400), out
    assert health(server)["worker_failures"] == 0
