"""Metrics, inference events, systemd notification, graceful drain and the operator commands."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
from helpers import REPO, ServerProcess, run_cli
from prometheus_client.parser import text_string_to_metric_families
from workerevents import under_way

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ops")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.thinking(d / "thinker.gguf", "Two and two.", "It is 4.")
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    return d


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scrape: dict, name: str, **labels) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client, headers=None) -> dict:
    r = await client.get("/metrics", headers=headers or {})
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
    return samples(await r.text())


async def test_metrics_move_with_real_requests(aiohttp_client, files, write_config):
    client = await aiohttp_client(create_app(load_config(write_config(
        f"models:\n  plain: {files}/plain.gguf\n  thinker: {files}/thinker.gguf\n"))))
    before = await scrape(client)
    assert value(before, "gguf_gateway_model_state", model="plain", state="unloaded") == 1
    assert any(k[0] == "gguf_gateway_build_info" for k in before)
    r = await client.post("/v1/chat/completions", json={"model": "plain", "messages": HI})
    assert r.status == 200
    r = await client.post("/v1/chat/completions", json={"model": "thinker", "messages": HI, "stream": True})
    await r.read()
    r = await client.post("/v1/chat/completions", json={"model": "../../etc/passwd", "messages": HI})
    assert r.status == 404
    after = await scrape(client)
    ep = "/v1/chat/completions"
    assert value(after, "gguf_gateway_requests_total", model="plain", endpoint=ep, status="200") == 1
    assert value(after, "gguf_gateway_requests_total", model="thinker", endpoint=ep, status="200") == 1
    assert value(after, "gguf_gateway_requests_total", model="-", endpoint=ep, status="404") == 1
    assert not any("passwd" in str(k) for k in after)  # label values never carry raw client input
    assert value(after, "gguf_gateway_rejected_requests_total", reason="model_not_found") == 1
    assert value(after, "gguf_gateway_completion_tokens_total", model="plain") == 4
    assert value(after, "gguf_gateway_reasoning_tokens_total", model="thinker") == 4
    assert value(after, "gguf_gateway_prompt_tokens_total", model="plain") > 0
    assert value(after, "gguf_gateway_time_to_first_token_seconds_count", model="plain") == 1
    assert value(after, "gguf_gateway_inter_token_latency_seconds_count", model="plain") == 3
    assert value(after, "gguf_gateway_request_duration_seconds_count", model="thinker", endpoint=ep) == 1
    assert value(after, "gguf_gateway_model_load_duration_seconds_count", model="plain") == 1
    assert value(after, "gguf_gateway_model_state", model="plain", state="ready") == 1
    assert value(after, "gguf_gateway_requests_in_flight", model="plain") == 0
    bucket = value(after, "gguf_gateway_time_to_first_token_seconds_bucket", model="plain", le="640.0")
    assert bucket == 1


async def test_metrics_need_a_key_unless_public(aiohttp_client, files, write_config):
    locked = await aiohttp_client(create_app(load_config(write_config("server:\n  api_keys: [k]\n"))))
    assert (await locked.get("/metrics")).status == 401
    assert (await locked.get("/metrics", headers={"Authorization": "Bearer k"})).status == 200
    public = await aiohttp_client(create_app(load_config(write_config(
        "server:\n  api_keys: [k]\n  metrics_public: true\n", name="public.yaml"))))
    assert (await public.get("/metrics")).status == 200
    assert (await public.get("/v1/models")).status == 401


async def test_worker_restarts_and_load_failures_are_counted(aiohttp_client, files, write_config, tmp_path):
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    client = await aiohttp_client(create_app(load_config(write_config(
        f"models:\n  loop: {files}/loop.gguf\n  bad: {tmp_path}/bad.gguf\n"))))
    assert (await client.post("/v1/chat/completions", json={"model": "bad", "messages": HI})).status == 503
    r = await client.post("/v1/chat/completions", json={"model": "loop", "messages": HI, "stream": True})
    await under_way(r)
    from gateway.app import REGISTRY

    os.kill(client.app[REGISTRY].loaded()["loop"].proc.pid, signal.SIGKILL)
    await r.read()
    after = await scrape(client)
    assert value(after, "gguf_gateway_model_load_failures_total", model="bad") == 1
    assert value(after, "gguf_gateway_worker_restarts_total", model="loop") == 1
    assert value(after, "gguf_gateway_model_state", model="bad", state="failed") == 1


async def test_one_event_per_request_with_the_request_id(aiohttp_client, files, write_config, tmp_path):
    events = tmp_path / "events" / "inference.jsonl"
    client = await aiohttp_client(create_app(load_config(write_config(
        f"server:\n  events_path: {events}\nmodels:\n  thinker: {files}/thinker.gguf\n"))))
    r = await client.post("/v1/chat/completions", json={"model": "thinker", "messages": HI})
    body = await r.json()
    rid = r.headers["X-Request-Id"]
    assert body["id"] == f"chatcmpl-{rid}"
    r = await client.post("/v1/messages", json={"model": "thinker", "max_tokens": 5, "messages": HI},
                          headers={"X-Request-Id": "trace-42"})
    assert r.headers["X-Request-Id"] == "trace-42" and (await r.json())["id"] == "msg_trace-42"
    await client.post("/v1/chat/completions", json={"model": "nope", "messages": HI})
    await client.get("/health")  # not an inference request: no event
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert len(lines) == 3
    first, second, third = lines
    assert first["request_id"] == rid and first["model"] == "thinker" and first["status"] == 200
    assert (first["prompt_tokens"] > 0, first["completion_tokens"], first["reasoning_tokens"]) == (True, 8, 4)
    assert first["finish_reason"] == "stop" and first["endpoint"] == "/v1/chat/completions"
    assert 0 < first["time_to_first_token_s"] <= first["duration_s"] and first["principal"] == "anonymous"
    assert second["request_id"] == "trace-42" and second["endpoint"] == "/v1/messages"
    assert second["finish_reason"] == "length" and second["completion_tokens"] == 5
    assert third["status"] == 404 and third["model"] == "-" and third["time_to_first_token_s"] is None


async def test_events_name_the_principal(aiohttp_client, files, write_config, tmp_path):
    events = tmp_path / "e.jsonl"
    client = await aiohttp_client(create_app(load_config(write_config(
        f"server:\n  events_path: {events}\n  api_keys: [first, second]\nmodels:\n  plain: {files}/plain.gguf\n"))))
    await client.post("/v1/chat/completions", json={"model": "plain", "messages": HI},
                      headers={"Authorization": "Bearer second"})
    assert json.loads(events.read_text())["principal"] == "key2"


# --- the real process: systemd notification, drain, operator commands -------------------------

def test_sd_notify_ready_watchdog_stopping_in_order(tmp_path, files, write_config):
    sock_path = str(tmp_path / "notify.sock")
    received: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(sock_path)
        sock.settimeout(0.2)
        stop = threading.Event()

        def listen():
            while not stop.is_set():
                try:
                    received.append(sock.recv(4096).decode())
                except (TimeoutError, OSError):
                    pass

        t = threading.Thread(target=listen, daemon=True)
        t.start()
        cfg = write_config(f"models:\n  plain: {files}/plain.gguf\n")
        server = ServerProcess("--config", str(cfg), env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "100000"})
        with server:
            deadline = time.monotonic() + 10
            while received.count("WATCHDOG=1") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            code, err = server.stop(signal.SIGTERM)
        time.sleep(0.3)
        stop.set()
        t.join()
    assert code == 0, err
    assert received[0] == "READY=1"
    assert received.count("WATCHDOG=1") >= 2
    assert received[-1] == "STOPPING=1"
    assert received.index("STOPPING=1") > max(i for i, m in enumerate(received) if m == "READY=1")


def stream_through_sigterm(config_path, path: str, body: dict) -> tuple[list[str], int, str]:
    """Start a stream on a real server, SIGTERM the server after its first chunk, read the rest.
    Returns every non-empty SSE line, the server's exit code and its log."""
    import urllib.request

    server = ServerProcess("--config", str(config_path))
    with server:
        req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode())
        with urllib.request.urlopen(req) as resp:
            # a load that takes over a second (a loaded machine) opens the stream with progress comments
            first = next(line for line in resp if line.strip() and not line.startswith(b":"))
            assert first.startswith(b"data: ")
            server.proc.send_signal(signal.SIGTERM)
            lines = [first.decode().strip()] + [line.decode().strip() for line in resp
                                                if line.strip() and not line.startswith(b":")]
        code, log = server.stop()
    return lines, code, log


@pytest.mark.slow
def test_sigterm_lets_a_stream_finish_within_the_drain_time(files, write_config):
    """A short answer against a long drain: what is checked is that the drain waits for the
    stream, not how fast a machine streams (the answer takes a few seconds at most even on a
    slow CPU, far inside the drain). The log proves the signal came while it streamed."""
    cfg = write_config(f"server:\n  drain_seconds: 300\nmodels:\n  loop:\n    path: {files}/loop.gguf\n"
                       f"    n_ctx: 4096\n")
    lines, code, log = stream_through_sigterm(cfg, "/v1/completions",
                                              {"model": "loop", "prompt": "go\n", "max_tokens": 3000})
    assert "waiting up to 300 s for 1 request(s) in flight" in log
    assert lines[-1] == "data: [DONE]"
    assert '"finish_reason":"length"' in lines[-2]
    text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])
    assert text.count("tick") == 1500  # every token arrived
    assert code == 0 and "Traceback" not in log and "drain time over" not in log


@pytest.mark.slow
def test_a_stream_longer_than_the_drain_time_gets_a_final_error_event(files, write_config):
    cfg = write_config(f"server:\n  drain_seconds: 0.3\nmodels:\n  loop:\n    path: {files}/loop.gguf\n"
                       f"    n_ctx: 65536\n")
    lines, code, _ = stream_through_sigterm(cfg, "/v1/chat/completions", {"model": "loop", "messages": HI})
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["error"]["code"] == "shutting_down"
    assert json.loads(lines[-3][6:])["choices"][0]["finish_reason"] == "error"
    assert code == 0


@pytest.mark.slow
def test_status_and_chat_commands(files, write_config):
    cfg = write_config(f"server:\n  api_keys: [k]\nmodels:\n  thinker: {files}/thinker.gguf\n"
                       f"  plain: {files}/plain.gguf\n")
    with ServerProcess("--config", str(cfg)) as server:
        url = ["--url", server.url]
        r = run_cli("chat", "thinker", *url, "--api-key", "k", "--color", "always", "--system", "be brief",
                    input_text="what is 2+2?\nand again?\n")
        assert r.returncode == 0, r.stderr
        assert r.stdout.count("\x1b[2mTwo and two.\x1b[0m\n\nIt is 4.\n") == 2  # two turns, thinking dimmed
        r = run_cli("status", *url, "--config", str(cfg))  # the key comes from the config
        assert r.returncode == 0, r.stderr
        assert re.search(r"^thinker\s+ready\s+0\s+\d+", r.stdout, re.M) and re.search(r"^plain\s+unloaded", r.stdout, re.M)
        r = run_cli("status", *url)
        assert r.returncode == 1 and "401" in r.stderr
    r = run_cli("status", "--url", server.url)
    assert r.returncode == 1 and f"cannot reach gguf-gateway at {server.url}" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_json_logs(files, write_config):
    cfg = write_config(f"models:\n  plain: {files}/plain.gguf\n")
    server = ServerProcess("--config", str(cfg), "--log-format", "json")
    with server:
        server.get("/v1/models")
        code, err = server.stop()
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any("listening on" in r["message"] for r in records)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)


# --- the systemd unit --------------------------------------------------------------------------

UNIT = REPO / "deploy" / "gguf-gateway.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_unit_verifies_and_rates_ok(tmp_path):
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "gguf-gateway"
    unit = tmp_path / "gguf-gateway.service"  # ExecStart pointed at this checkout's install
    unit.write_text(UNIT.read_text().replace("/opt/gguf-gateway/venv/bin/gguf-gateway", str(exe)))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True)
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout).group(1))
    assert score <= 2.0, r.stdout[-2000:]


def test_rejection_reasons_are_a_bounded_set_of_series():
    """An upstream's error code becomes a reason: a server minting a new code per answer must not
    grow the metrics without end."""
    from gateway.server.metrics import MAX_REASONS, Metrics

    m = Metrics()
    for i in range(MAX_REASONS + 50):
        m.rejection(f"code_{i}")
    m.rejection("code_0")
    text = m.scrape().decode()
    series = re.findall(r'^gguf_gateway_rejected_requests_total\{reason="([^"]+)"\} (\S+)', text, re.M)
    counts = dict(series)
    assert len(counts) == MAX_REASONS + 1 and counts["other"] == "50.0" and counts["code_0"] == "2.0"
