"""Swap-aware ordering across models, and keys' terms refused at start, against the real
`gguf-gateway serve` process with scripted models:

- three models with room for one, three clients each asking A, B, C in turn: the swaps
  (``gguf_gateway_swaps_total``) with ``swap_hold_seconds`` held are fewer than with a swap at
  every change (llama-swap's behaviour: ``swap_hold_seconds: 0``, ``max_swap_wait: 0``);
- a model kept busy by a stream of requests is closed after ``max_swap_wait`` and the waiting
  model loads; each swap is logged with its reason;
- a keys file with a weight out of bounds is refused by ``check-config`` and ``serve``;
- a key that may not load gets each official client's own error for a 503 naming the model;
- a SIGHUP that raises a key's priority reorders its request already waiting
  (``fairqueues.Gateway``'s scene, on the real process).

Counts and orders only; no time is asserted."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import anthropic
import ollama
import openai
import pytest
from fairqueues import HOLD, ROOT, SLOTS, Gateway, until
from helpers import ServerProcess, gateway_command, request, run_cli

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

MODELS = ("a", "b", "c")
ROUNDS = 2
STAGGER = 1.5  # seconds between two clients' starts: a swap at every change interleaves their requests


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("swaps")
    for name in MODELS:
        tm.plain(d / f"{name}.gguf", [name.upper(), "."])
    tm.endless(d / "loop.gguf")
    return d


def config(d, server: str = "", endless_a: bool = False) -> str:
    """models.yaml: room for one model of ``MODELS`` (``endless_a``: A the model that never ends)."""
    cfg = d / "models.yaml"
    files = {n: "loop" if n == "a" and endless_a else n for n in MODELS}
    cfg.write_text("server:\n  discover_default_stores: false\n  max_loaded_models: 1\n" + server + "models:\n"
                   + "".join(f"  {n}: {d}/{f}.gguf\n" for n, f in files.items()))
    return str(cfg)


def chat(srv: ServerProcess, model: str, max_tokens: int = 2) -> int:
    status, body, _ = request(srv.url + "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}, timeout=120)
    assert status == 200, body
    return status


def swaps(srv: ServerProcess) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {reason: float(n) for reason, n in re.findall(r'gguf_gateway_swaps_total\{reason="([^"]+)"\} (\S+)', text)}


def scene(files, server: str) -> tuple[float, str]:
    """Three clients, each asking A, B, C in turn for ``ROUNDS`` rounds, the second starting
    ``STAGGER`` seconds after the first and the third as long after it (a tiny model swaps and
    answers in far less): the swaps counted, and the server's log."""
    with ServerProcess("--config", config(files, server)) as srv:
        def client(n: int) -> None:
            time.sleep(n * STAGGER)
            for _ in range(ROUNDS):
                for model in MODELS:
                    chat(srv, model)

        with ThreadPoolExecutor(3) as pool:
            list(pool.map(client, range(3)))
        counted = sum(swaps(srv).values())
        _, log = srv.stop()
    return counted, log


def test_holding_the_loaded_models_queue_swaps_less_than_a_swap_at_every_change(files):
    held, held_log = scene(files, "")  # swap_hold_seconds and max_swap_wait as they default
    eager, eager_log = scene(files, "  swap_hold_seconds: 0\n  max_swap_wait: 0\n")
    # each swap counted is logged with its reason
    for count, log in ((held, held_log), (eager, eager_log)):
        lines = re.findall(r"swap: unloading '(\w)' to load '(\w)' \((idle|max_swap_wait)", log)
        assert len(lines) == count, (count, lines)
    # 18 requests over 3 models: a swap at nearly every change of the interleaved requests,
    # against about one per model a round where the loaded model's clients' next requests are
    # held for; the margin is generous (a loaded machine spreads the clients' requests)
    assert held < eager, (held, eager)
    assert held <= 0.75 * eager, (held, eager)


def test_a_model_kept_busy_is_closed_after_max_swap_wait_and_the_waiting_model_loads(files):
    with ServerProcess("--config", config(files, "  max_swap_wait: 1\n", endless_a=True)) as srv:
        chat(srv, "a")
        stop = threading.Event()

        def busy(n: int) -> int:
            time.sleep(n * 0.1)
            done = 0
            while not stop.is_set():
                chat(srv, "a", 300)  # a few tenths of a second each
                done += 1
            return done

        with ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(busy, n) for n in range(3)]  # three clients: a always has a request running
            time.sleep(0.5)
            try:
                assert chat(srv, "b") == 200  # served: a was closed to new requests, drained and unloaded
            finally:
                stop.set()
            assert all(s.result() > 0 for s in streams)
        counted = swaps(srv)
        _, log = srv.stop()
    assert re.search(r"swap: 'a' takes no new request until it is unloaded for 'b'.*server\.max_swap_wait", log), log
    assert re.search(r"swap: unloading 'a' to load 'b' \(max_swap_wait", log), log
    assert counted.get("max_swap_wait", 0) >= 1, counted


@pytest.mark.parametrize("weight", ["0", "1.0e+308"])
def test_a_keys_file_with_a_weight_out_of_bounds_is_refused_at_start(files, tmp_path, weight):
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"root: {{key: root-key, role: admin}}\nbulk: {{key: bulk-key, weight: {weight}}}\n")
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys_file: {keys}\nmodels:\n  a: {files}/a.gguf\n")
    check = run_cli("check-config", "--config", str(cfg))
    assert check.returncode != 0
    assert "bulk.weight: must be a number >= 0.001 and <= 1000" in check.stdout + check.stderr, check
    served = subprocess.run([*gateway_command(), "serve", "--port", "0", "--config", str(cfg)], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert served.returncode != 0
    assert "bulk.weight: must be a number >= 0.001 and <= 1000" in served.stdout + served.stderr, served
    assert "Traceback" not in served.stdout + served.stderr


def test_a_sighup_that_raises_a_keys_priority_reorders_its_waiting_request(tmp_path):
    tm.endless(tmp_path / "loop.gguf", context_length=HOLD + 512)
    cfg = tmp_path / "models.yaml"

    def write(b_terms: str = "") -> None:
        cfg.write_text(f"server:\n  discover_default_stores: false\n  usage_db: ':memory:'\n  api_keys:\n"
                       f"    root: {{key: {ROOT}, role: admin}}\n    h: {{key: h-key, role: user}}\n"
                       f"    a: {{key: a-key, role: user}}\n    b: {{key: b-key, role: user{b_terms}}}\n"
                       f"models:\n  loop:\n    path: {tmp_path}/loop.gguf\n    parallel: {SLOTS}\n"
                       f"    n_ctx: {HOLD + 256}\n")

    write()
    with ServerProcess("--config", str(cfg)) as srv:
        async def scene() -> list[str]:
            async with aiohttp.ClientSession(base_url=srv.url) as session:
                gw = Gateway(session)
                await gw.hold("h-key")
                tasks = await gw.queue(("a", "a-key", {}), ("b", "b-key", {}))  # same terms: a would go first
                reloads = srv.output().count("API keys reloaded")
                write(", priority: interactive")
                os.kill(srv.proc.pid, signal.SIGHUP)

                async def log() -> str:
                    return srv.output()

                await until(log, lambda out: out.count("API keys reloaded") > reloads, "the SIGHUP's reload")
                return await gw.drain(tasks)

        assert asyncio.run(scene()) == ["b", "a"]


def test_a_key_that_may_not_load_gets_each_official_clients_503(files, tmp_path):
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  usage_db: ':memory:'\n  api_keys:\n"
                   f"    root: {{key: {ROOT}, role: admin}}\n    viewer: {{key: viewer-key, may_load: false}}\n"
                   f"models:\n  a: {files}/a.gguf\n")
    msgs = [{"role": "user", "content": "hi"}]
    with ServerProcess("--config", str(cfg)) as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="viewer-key", max_retries=0) as c:
            with pytest.raises(openai.InternalServerError) as e:
                c.chat.completions.create(model="a", messages=msgs, max_tokens=2)
            assert e.value.status_code == 503 and e.value.response.headers.get("Retry-After")
            assert "'a'" in str(e.value) and "may_load: false" in str(e.value)
        with anthropic.Anthropic(base_url=srv.url, api_key="viewer-key", max_retries=0) as a:
            with pytest.raises(anthropic.APIStatusError) as m:
                a.messages.create(model="a", messages=msgs, max_tokens=2)
            assert m.value.status_code == 503 and "may_load: false" in str(m.value)
        with ollama.Client(host=srv.url, headers={"Authorization": "Bearer viewer-key"}) as o:
            with pytest.raises(ollama.ResponseError) as r:
                o.chat(model="a", messages=msgs, options={"num_predict": 2})
            assert r.value.status_code == 503 and "may_load: false" in str(r.value)
        status, body, _ = request(srv.url + "/models/load", {"model": "a"}, headers={"Authorization": f"Bearer {ROOT}"})
        assert status == 200, body
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="viewer-key", max_retries=0) as c:
            assert c.chat.completions.create(model="a", messages=msgs, max_tokens=2).choices[0].message.content == "A."
