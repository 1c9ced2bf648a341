"""Hostile model files in a models folder (issue 50), against the real ``gguf-gateway`` process
and its command line: a tensor of layer 150,000,000, a header of 40,000,000 layers, a template
of tens of KiB of unclosed ``{{``, and one past the bound on templates, beside a good scripted
model. Before issue 50 the first made ``gguf-gateway models`` take 26 s and 2.6 GiB, the second
stalled ``/health`` 17 s with the gateway at 2.5 GiB, the third stalled it 28 s.

Each is refused with its reason (in the listing, or at its load), the good model answers, and
the gateway stays responsive and small while the routes that read headers are hit: ``/health``
answers within ``HEALTH_SECONDS`` throughout, and the gateway's own peak resident memory
(VmHWM, its workers apart) stays under ``PEAK_RSS``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers import ServerProcess, request, run_cli
from hostile_upstream import peak_rss
from hostilegguf import deep_layer_index, huge_block_count, unclosed_template

from gateway.models import testmodels as tm
from gateway.models.ggufmeta import MAX_TEMPLATE_BYTES

HEALTH_SECONDS = 1.0  # the slowest /health while the rest is hit (it took 17 s and 28 s before)
PEAK_RSS = 256 * 2**20  # the gateway process's peak (it reached 2.5 GiB before; about 70 MiB now)
CLI_SECONDS = 30.0  # a command's whole run, its start included (26 s for one file before)
HI = [{"role": "user", "content": "hi"}]

# the reasons each hostile file is refused with, in the listing (``error``) and at its load
REFUSED = {
    "deep": "tensor 'blk.150000000.attn_q.weight' is in layer 150,000,000: more layers than any real model has",
    "huge": "llama.block_count is 40,000,000: more than any real model has",
    "long": f"tokenizer.chat_template's length in bytes is {MAX_TEMPLATE_BYTES + 1:,}",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-models")
    deep_layer_index(d / "deep.gguf")
    huge_block_count(d / "huge.gguf")
    unclosed_template(d / "tmpl.gguf")  # read (its size is a template's), scanned in linear time
    unclosed_template(d / "long.gguf", size=MAX_TEMPLATE_BYTES + 1)
    tm.plain(d / "good.gguf", ["Hello", ",", " world", "!"])
    return d


def config(folder, tmp_path) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(f"server:\n  discover_default_stores: false\n  models_dirs: [{folder}]\n")
    return str(path)


class Heartbeat:
    """``/health`` asked every 20 ms in a thread: the slowest answer it got."""

    def __init__(self, url: str):
        self.url, self.slowest, self.failures = url + "/health", 0.0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=60) as r:
                    r.read()
            except (OSError, urllib.error.URLError) as e:
                self.failures.append(repr(e))
            self.slowest = max(self.slowest, time.monotonic() - start)
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(70)


def first_live_snapshot(url: str) -> dict:
    with urllib.request.urlopen(url + "/dashboard/live", timeout=30) as r:
        for line in r:
            if line.startswith(b"data: "):
                return json.loads(line[6:])
    raise AssertionError("the live stream sent no snapshot")


@pytest.mark.slow
def test_the_gateway_refuses_hostile_files_and_stays_responsive_and_small(folder, tmp_path):
    with ServerProcess("--config", config(folder, tmp_path)) as srv:
        beat = Heartbeat(srv.url)
        try:
            for _ in range(3):  # every route that reads the headers, again and again
                status, listing = srv.get("/models")
                assert status == 200
                with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
                    assert r.status == 200
                snapshot = first_live_snapshot(srv.url)
                assert {m["id"] for m in snapshot["models"]} == {"deep", "huge", "tmpl", "long", "good"}
                for name in ("deep", "huge", "tmpl", "long", "good"):
                    status, shown, _ = request(srv.url + "/api/show", {"model": name})
                    assert status == 200, shown
                assert srv.get("/api/tags")[0] == 200 and srv.get("/v1/models")[0] == 200
            rows = {m["id"]: m for m in listing["data"]}
            for name, reason in REFUSED.items():
                assert reason in (rows[name]["error"] or ""), rows[name]
                assert rows[name]["memory_estimate"] is None
            assert rows["good"]["error"] is None and rows["good"]["memory_estimate"]["total"] > 0
            assert rows["tmpl"]["error"] is None  # its header is a model's: llama.cpp refuses its load below
            _, shown, _ = request(srv.url + "/api/show", {"model": "tmpl"})
            assert shown["template"].startswith("{{ tools {{ tools") and "tools" not in shown["capabilities"]

            for name, reason in REFUSED.items():  # a load says why, at once, without a worker
                status, body, _ = request(srv.url + "/v1/chat/completions", {"model": name, "messages": HI})
                assert status == 503 and body["error"]["code"] == "model_load_failed", body
                assert reason in body["error"]["message"]
            status, body, _ = request(srv.url + "/v1/chat/completions", {"model": "tmpl", "messages": HI})
            assert status == 503 and body["error"]["code"] == "model_load_failed", body
            status, body, _ = request(srv.url + "/v1/chat/completions", {"model": "good", "messages": HI})
            assert status == 200 and body["choices"][0]["message"]["content"] == "Hello, world!", body
        finally:
            beat.stop()
        assert not beat.failures, beat.failures[:3]
        assert beat.slowest < HEALTH_SECONDS, f"/health took {beat.slowest:.2f} s"
        peak = peak_rss(srv.proc.pid)
        assert peak < PEAK_RSS, f"the gateway peaked at {peak / 2**20:.0f} MiB"
        code, log = srv.stop()
    assert code == 0 and "Traceback" not in log, log[-3000:]


def test_gguf_gateway_models_lists_each_hostile_file_with_its_reason(folder, tmp_path):
    start = time.monotonic()
    r = run_cli("models", "--config", config(folder, tmp_path), "--json", timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - start < CLI_SECONDS
    rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    for name, reason in REFUSED.items():
        assert reason in rows[name]["error"] and rows[name]["memory_estimate"] is None
    assert rows["good"]["error"] is None and rows["good"]["memory_estimate"]["total"] > 0
    assert rows["tmpl"]["error"] is None and rows["tmpl"]["tool_format"] == "plain"


def test_check_config_names_each_hostile_file_and_why(folder, tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("server:\n  discover_default_stores: false\nmodels:\n"
                    + "".join(f"  {name}: {folder}/{name}.gguf\n" for name in (*REFUSED, "tmpl", "good")))
    start = time.monotonic()
    r = run_cli("check-config", "--config", str(path), timeout=120)
    assert time.monotonic() - start < CLI_SECONDS
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    for name, reason in REFUSED.items():
        assert any(f"models.{name}: " in line and reason in line for line in lines), (name, r.stderr)
    assert not any("models.good" in line or "models.tmpl" in line for line in lines), r.stderr
