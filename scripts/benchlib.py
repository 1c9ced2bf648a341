"""What scripts/bench.py and scripts/swapbench.py share: the benchmark's models, its prompts,
and ``Server``, a contender process on a free port driven over HTTP (``/v1/completions``),
with its resident memory. The caller puts the repository on ``sys.path`` first."""

from __future__ import annotations

import copy
import http.client
import json
import os
import socket
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


def interleaved(servers: list[Server], repeats: int, fn) -> dict[str, list]:
    """``fn(server, rep)`` for every server, ``repeats`` rounds, the order rotating each round,
    so a slow spell of the machine does not land on one contender."""
    out: dict[str, list] = {s.name: [] for s in servers}
    for rep in range(repeats):
        for srv in servers[rep % len(servers):] + servers[:rep % len(servers)]:
            out[srv.name].append(fn(srv, rep))
    return out
