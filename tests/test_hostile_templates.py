"""Models whose chat template (in the GGUF file) runs away, beside a good model, on the real
server (issue 50: a model file is untrusted input). Each chat request to such a model fails on
its own, soon, in the caller's wire shape (500 ``chat_template_error``: the caller did nothing
wrong, the model file is bad), while ``/health`` stays fast, the worker's peak memory stays
bounded and the worker lives on: the good model answers, the bad one answers a request its
template has no part in, and unloads at once. (The bounds themselves: test_template_bounds.py.)"""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers import ServerProcess, request
from hostile_upstream import peak_rss

from gateway.models import testmodels as tm
from gateway.text import templatebounds

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]
TEMPLATES = {  # model -> (its template, what its error says)
    # only time: 10**10 turns of an empty loop (before: every request to the model hung, and the
    # worker burnt a core until it was killed)
    "spin": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran longer"),
    # folded at compile time, in one C call holding the GIL (before: the worker froze, its unload took 120 s)
    "power": ("{{ 9**(9**9) }}", "integer of more than"),
    # nested loops over a 20 KB string (before: past 2 GiB in 2 s)
    "flood": ("{% set s = 'x' * 20000 %}{% for a in s %}{% for b in s %}{{ s }}{% endfor %}{% endfor %}",
              "its output"),
    # a list that grows a fresh megabyte at each turn
    "hoard": ("{% set ns = namespace(l=[]) %}{% set s = 'x' * 1000000 %}{% for i in range(100000) %}"
              "{% set _ = ns.l.append(s[1:]) %}{% endfor %}", "MiB"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-templates")
    tm.plain(d / "plain.gguf")
    for name, (template, _) in TEMPLATES.items():
        tm.plain(d / f"{name}.gguf", chat_template=template)
    return d


@pytest.fixture(scope="module")
def server(files):
    cfg = files / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\n  max_loaded_models: 0\nmodels:\n"
                   + "".join(f"  {name}: {files}/{name}.gguf\n" for name in ["plain", *TEMPLATES]))
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv
        code, log = srv.stop()
        assert code == 0
        assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]


def worker(srv, model: str) -> int:
    return next(m["pid"] for m in srv.get("/models")[1]["data"] if m["id"] == model)


def peak_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM)."""
    return peak_rss(pid) / 2**20


def completes(srv, model: str) -> None:
    """The model answers a completion: its prompt is the caller's text, no template in it."""
    status, out, _ = request(srv.url + "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 4})
    assert status == 200 and out["choices"][0]["finish_reason"], out


class Health:
    """``/health`` asked every 50 ms while the ``with`` lasts; its slowest answer."""

    def __init__(self, srv):
        self.srv, self.slowest, self.failed = srv, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            started = time.monotonic()
            try:
                status, _ = self.srv.get("/health")
                self.failed += status != 200
            except OSError:
                self.failed += 1
            self.slowest = max(self.slowest, time.monotonic() - started)

    def __enter__(self) -> Health:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize("model", list(TEMPLATES))
def test_a_runaway_template_fails_its_request_alone(server, model):
    completes(server, model)  # loaded, its worker warm
    pid, before = worker(server, model), peak_mib(worker(server, model))
    with Health(server) as health:
        started = time.monotonic()
        status, out, _ = request(server.url + "/v1/chat/completions", {"model": model, "messages": HI}, timeout=60)
        took = time.monotonic() - started
        status_plain, answer, _ = request(server.url + "/v1/chat/completions", {"model": "plain", "messages": HI})
    assert status == 500 and out["error"]["code"] == "chat_template_error", out
    message = out["error"]["message"]
    assert f"model '{model}'" in message and "chat template stopped" in message, message
    assert TEMPLATES[model][1] in message, message
    assert took < templatebounds.SECONDS + 5, took  # the deadline is the longest any takes
    assert health.failed == 0 and health.slowest < 1, (health.failed, health.slowest)
    assert status_plain == 200 and answer["choices"][0]["message"]["content"] == "Hello, world!"
    grown = peak_mib(pid) - before
    assert grown < 2 * templatebounds.MEMORY / 2**20, f"the worker's peak grew {grown:.0f} MiB"
    completes(server, model)  # the same worker serves on
    assert worker(server, model) == pid and server.get("/health")[1]["worker_failures"] == 0


@pytest.mark.parametrize("path, shape", [
    ("/v1/messages", lambda out: out["type"] == "error" and out["error"]["type"] == "api_error"),
    ("/api/chat", lambda out: "chat template stopped" in out["error"]),
    ("/v1/responses", lambda out: out["error"]["code"] == "chat_template_error"),
])
def test_each_wire_tells_it_in_its_own_shape(server, path, shape):
    body = {"model": "power", "messages": HI, "max_tokens": 8} if path != "/v1/responses" else \
        {"model": "power", "input": "hi"}
    status, out, _ = request(server.url + path, body)
    assert status == 500 and shape(out), out
    assert "integer of more than" in json.dumps(out)


def test_a_model_whose_template_runs_away_unloads_at_once(server):
    """Its runaway request ends by itself at the deadline (an unload waits for the requests in
    flight: 409 until then); then the model unloads at once, its worker gone."""
    completes(server, "spin")
    pid = worker(server, "spin")
    answers: list[int] = []
    started = time.monotonic()
    asking = threading.Thread(target=lambda: answers.append(request(
        server.url + "/v1/chat/completions", {"model": "spin", "messages": HI}, timeout=60)[0]))
    asking.start()
    time.sleep(0.5)  # rendering now
    assert request(server.url + "/models/unload", {"model": "spin"})[0] == 409
    asking.join(30)
    assert answers == [500]
    unloading = time.monotonic()
    status, out, _ = request(server.url + "/models/unload", {"model": "spin"})
    assert status == 200, out
    assert time.monotonic() - unloading < 2 and time.monotonic() - started < templatebounds.SECONDS + 5
    with pytest.raises(FileNotFoundError):
        peak_mib(pid)  # the process is gone
