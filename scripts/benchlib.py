"""What scripts/bench.py and its scene modules share: the benchmark's models, its prompts,
``Server``, a contender process on a free port driven over HTTP (``/v1/completions``), with
its resident memory; ``gateway_server`` (a gateway of a written configuration, this checkout's
or another's); ``overhead`` (a 1-token completion's latency); ``interleaved`` rounds. The
caller puts the repository on ``sys.path`` first."""

from __future__ import annotations

import copy
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway.models import testmodels as tm

WORDS = ("river city people market bridge winter summer stone house garden road north south light water "
         "music story table window letter morning evening school church harbor forest field mountain").split()


def random_model(name: str, seed: int = 0, what: str = "the benchmark model", vocab: str = "qwen2",
                 **shape) -> Path:
    """A random-weight model over llama.cpp's ``vocab`` vocabulary (qwen2's unless told;
    ``testmodels.write_random_model``, with its ``shape`` arguments), written once into the data
    directory and kept: a file's name stands for its shape, so a new shape takes a new name."""
    path = tm.data_dir() / "bench" / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {what} to {path} ...", file=sys.stderr)
        tm.write_random_model(path.with_suffix(".part"), tm.find_vocab(vocab), seed=seed, **shape)
        path.with_suffix(".part").replace(path)
    return path


def bench_model() -> Path:
    """The default model: 81M random weights."""
    return random_model("random-qwen2-81m.gguf")


def tiny_model() -> Path:
    path = tm.data_dir() / "bench" / "tiny-scripted.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tm.plain(path.with_suffix(".part"))
        path.with_suffix(".part").replace(path)
    return path


def long_prompt(words: int, salt: str) -> str:
    """About one token per word with a BPE vocabulary; ``salt`` makes the prefix unseen."""
    return salt + " " + " ".join(WORDS[(i * 7 + i // 29) % len(WORDS)] for i in range(words))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    out = []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for k in map(int, kids):
        out += [k, *descendants(k)]
    return out


@dataclass
class Streamed:
    """One streamed completion, as ``Server.stream`` saw it."""

    start: float  # perf_counter when it was sent
    stamps: list[float] = field(default_factory=list)  # when each chunk with text came
    text: str = ""
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # llama-server's (its speculation's draft_n, draft_n_accepted)


class Server:
    """A contender: a server process on a free port, stopped on exit."""

    def __init__(self, name: str, cmd: list[str], health: str, model_name: str, env: dict | None = None,
                 headers: dict | None = None, cwd: Path | None = None):
        self.name, self.cmd, self.health, self.model_name = name, cmd, health, model_name
        self.headers = headers or {}  # sent with every request (an API key's Authorization)
        self.port = free_port()
        self.cmd = [c.replace("{port}", str(self.port)) for c in cmd]
        self.env, self.cwd = env, cwd  # cwd: where ``python -m`` finds its package first
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{name}-", suffix=".log", delete=False)

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.cwd, start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited at start; its log: {self.log.name}")
            try:
                if self.request("GET", self.health)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.name} did not become ready; its log: {self.log.name}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.unlink(self.log.name)

    def serving(self, model_name: str) -> Server:
        """This server, asked for another of its models (under that model's name)."""
        view = copy.copy(self)
        view.name = view.model_name = model_name
        return view

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def request(self, method: str, path: str, body: dict | None = None, conn=None) -> tuple[int, bytes]:
        c = conn or self.connect()
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json", **self.headers})
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, data

    def complete(self, body: dict, conn=None) -> dict:
        status, data = self.request("POST", "/v1/completions", {"model": self.model_name, **body}, conn)
        if status != 200:
            raise SystemExit(f"{self.name}: HTTP {status}: {data[:300]!r}")
        return json.loads(data)

    def stream(self, body: dict) -> Streamed:
        """Send a streamed completion: when it went, when each chunk with text came, the text,
        and the usage (where the server sends it: ``stream_options.include_usage``)."""
        c = self.connect()
        start = time.perf_counter()
        c.request("POST", "/v1/completions", body=json.dumps({"model": self.model_name, "stream": True, **body}),
                  headers={"Content-Type": "application/json", **self.headers})
        r = c.getresponse()
        if r.status != 200:
            raise SystemExit(f"{self.name}: HTTP {r.status}: {r.read()[:300]!r}")
        out = Streamed(start)
        for line in r:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                out.usage = chunk.get("usage") or out.usage
                out.timings = chunk.get("timings") or out.timings
                text = "".join(ch.get("text") or "" for ch in chunk.get("choices", ()))
                if text:
                    out.stamps.append(time.perf_counter())
                    out.text += text
        c.close()
        return out

    def memory(self) -> tuple[int, int]:
        """(RSS of the server process, RSS of it and every process it started) in KiB."""
        own = rss_kib(self.proc.pid)
        return own, own + sum(rss_kib(p) for p in descendants(self.proc.pid))


def gateway_server(cfg: Path, label: str, model_name: str, home: Path, checkout: Path | None = None,
                   headers: dict | None = None) -> Server:
    """A ``gguf-gateway serve`` of the configuration file ``cfg``, with ``home`` as its HOME (so
    no models of the user's own are discovered). ``checkout``: another clone of this repository
    whose gateway runs instead (on this venv, its package first on the path for the gateway, run
    in it, and for its workers): an A/B against another commit in one run."""
    env = {**os.environ, "HOME": str(home)}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout.resolve()), *filter(None, [env.get("PYTHONPATH")])])
    return Server(label, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                          "--log-level", "warning"], "/health", model_name, env, headers=headers,
                  cwd=checkout.resolve() if checkout is not None else None)


def overhead(srv: Server, n: int) -> dict:
    """Latency of a 1-token completion over one kept-alive connection (on a tiny model it costs
    microseconds; the rest is the server): 20 to warm up, then ``n``, their p50 and p95 in ms."""
    conn = srv.connect()
    body = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
    for _ in range(20):
        srv.complete(body, conn)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        srv.complete(body, conn)
        lat.append((time.perf_counter() - t0) * 1000)
    conn.close()
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2], "p95_ms": lat[int(len(lat) * 0.95)]}


def spread(values: list[float]) -> dict:
    """median, min, max, and p50/p95 (nearest rank) of some figures; zeros where there are none."""
    if not values:
        return {"n": 0, "median": 0.0, "min": 0.0, "max": 0.0, "p50": 0.0, "p95": 0.0}
    s = sorted(values)
    return {"n": len(s), "median": statistics.median(s), "min": s[0], "max": s[-1], "p50": s[len(s) // 2],
            "p95": s[min(len(s) - 1, int(len(s) * 0.95))]}


def interleaved(servers: list[Server], repeats: int, fn) -> dict[str, list]:
    """``fn(server, rep)`` for every server, ``repeats`` rounds, the order rotating each round,
    so a slow spell of the machine does not land on one contender."""
    out: dict[str, list] = {s.name: [] for s in servers}
    for rep in range(repeats):
        for srv in servers[rep % len(servers):] + servers[:rep % len(servers)]:
            out[srv.name].append(fn(srv, rep))
    return out
