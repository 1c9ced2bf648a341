"""`scripts/bench.py --embeddings`: embeddings and reranking against llama-server, in one run.

Contenders, each at its own defaults with the same threads: the gateway (models.yaml
`embeddings: true`; `reranker: true` for the reranker) and llama-server (`--embeddings
--pooling mean`, as a model without a pooling of its own needs there; `--reranking`).
Workloads, each round running every contender in turn with the order rotating:
- one: a short input, one request at a time: p50 latency;
- clients: 8 clients, each sending one short input a request for a fixed time: requests/s;
- batch: one request of 64 inputs (texts of about 20 tokens): inputs/s;
- rerank: one request of a query and 50 documents: documents/s, on a random-weight Qwen3-style
  reranker over qwen2's vocabulary (``testmodels.write_random_model(reranker=True)``).
Reported per workload: each contender's median, and the median of the per-round ratios of the
gateway to llama-server with their min..max. With llama.cpp's llama-bench beside llama-server,
its pp512 on the same model and threads: the limit of tokens a second that a batched embedding
can approach (an embedding context also runs the output head on every token, which pp512 does
not, so it stays below).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchlib import Server, interleaved, random_model

CLIENTS = 8
WORDS = ("river city people market bridge winter summer stone house garden road north south light water "
         "music story table window letter morning evening school church harbor forest field mountain").split()


def sentence(i: int, words: int = 16) -> str:
    """A distinct input of about ``words`` + 4 tokens."""
    return f"note {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(words))


def reranker_model() -> Path:
    return random_model("random-qwen3-reranker.gguf", seed=5, what="the benchmark reranker", n_embd=512, n_layer=6,
                        n_head=8, n_ff=1536, reranker=True)


def gateway(model: Path, threads: int, tmp: Path, kind: str) -> Server:
    cfg = tmp / f"embed-{kind}.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  m:\n    path: {model}\n"
                   f"    {'reranker' if kind == 'rerank' else 'embeddings'}: true\n    n_threads: {threads}\n")
    return Server("gateway", [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                              "--log-level", "warning"], "/health", "m", {**os.environ, "HOME": str(tmp)})


def llama_server(binary: str, model: Path, threads: int, kind: str) -> Server:
    flags = ["--reranking"] if kind == "rerank" else ["--embeddings", "--pooling", "mean"]
    return Server("llama-server", [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
                                   "-t", str(threads), "-tb", str(threads), *flags], "/health", "m")


def embed(srv: Server, inputs: list[str] | str, conn=None) -> dict:
    status, data = srv.request("POST", "/v1/embeddings", {"model": srv.model_name, "input": inputs}, conn)
    if status != 200:
        raise SystemExit(f"{srv.name}: HTTP {status}: {data[:300]!r}")
    return json.loads(data)


def one(srv: Server, rnd: int, n: int = 20) -> float:
    """p50 ms of a short input alone."""
    conn = srv.connect()
    times = []
    for i in range(n):
        t = time.perf_counter()
        embed(srv, sentence(rnd * 1000 + i, 8), conn)
        times.append((time.perf_counter() - t) * 1000)
    conn.close()
    return statistics.median(times)


def clients(srv: Server, rnd: int, seconds: float = 6.0) -> float:
    """Requests a second from ``CLIENTS`` clients sending one short input each request."""
    done = [0] * CLIENTS
    stop = time.perf_counter() + seconds

    def run(k: int) -> None:
        conn = srv.connect()
        i = 0
        while time.perf_counter() < stop:
            embed(srv, sentence(rnd * 100_000 + k * 10_000 + i), conn)
            done[k] += 1
            i += 1
        conn.close()

    began = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - began)


def batch(srv: Server, rnd: int) -> tuple[float, float]:
    """(inputs a second, tokens a second) of one request of 64 inputs."""
    inputs = [sentence(rnd * 1000 + i) for i in range(64)]
    t = time.perf_counter()
    body = embed(srv, inputs)
    dt = time.perf_counter() - t
    return 64 / dt, body["usage"]["prompt_tokens"] / dt


def rerank(srv: Server, rnd: int) -> float:
    """Documents a second of one request of a query and 50 documents."""
    docs = [sentence(rnd * 1000 + i) for i in range(50)]
    t = time.perf_counter()
    status, data = srv.request("POST", "/v1/rerank", {"model": srv.model_name, "query": "where is the harbor?",
                                                      "documents": docs})
    if status != 200:
        raise SystemExit(f"{srv.name}: HTTP {status}: {data[:300]!r}")
    return 50 / (time.perf_counter() - t)


def pp512(bench: Path, model: Path, threads: int) -> float | None:
    """llama-bench's prompt processing, tokens a second (None where it is not there or fails)."""
    if not bench.exists():
        return None
    got = subprocess.run([str(bench), "-m", str(model), "-t", str(threads), "-p", "512", "-n", "0", "-o", "json",
                          "-r", "3"], capture_output=True, text=True)
    try:
        return float(json.loads(got.stdout)[0]["avg_ts"])
    except (ValueError, LookupError):
        return None


def measure(model: Path, args, tmp: Path, binary: str | None) -> dict:
    results: dict = {"model": str(model), "threads": args.threads, "rounds": args.embed_rounds, "workloads": {}}
    for kind, path in (("embed", model), ("rerank", reranker_model())):
        makers = [lambda p=path, k=kind: gateway(p, args.threads, tmp, k)]
        if binary:
            makers.append(lambda p=path, k=kind: llama_server(binary, p, args.threads, k))
        work = {"rerank": rerank} if kind == "rerank" else {"one": one, "clients": clients, "batch": batch}
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(make()) for make in makers]
            for srv in servers:  # warm: the gateway loads on the first request
                next(iter(work.values()))(srv, -1)
            for name, fn in work.items():
                print(f"  embeddings: {name} ...", file=sys.stderr)
                results["workloads"][name] = interleaved(servers, args.embed_rounds, fn)
    if binary:
        results["pp512"] = pp512(Path(binary).with_name("llama-bench"), model, args.threads)
    return results


UNITS = {"one": ("p50 ms", "lower"), "clients": (f"requests/s, {CLIENTS} clients", "higher"),
         "batch": ("inputs/s, one request of 64", "higher"), "rerank": ("documents/s, one request of 50", "higher")}


def report(results: dict) -> str:
    med = statistics.median
    lines = [f"embeddings on {Path(results['model']).name} (reranking on a random Qwen3-style reranker), "
             f"{results['threads']} threads, {results['rounds']} rounds",
             "| workload | gateway | llama-server | gateway / llama-server (speed) |", "|---|---|---|---|"]
    for name, runs in results["workloads"].items():
        unit, better = UNITS[name]
        g = [x[0] if isinstance(x, (list, tuple)) else x for x in runs.get("gateway", [])]
        ls = [x[0] if isinstance(x, (list, tuple)) else x for x in runs.get("llama-server", [])]
        ratio = ""
        if g and ls:
            per = [(b / a if better == "lower" else a / b) for a, b in zip(g, ls, strict=True) if a and b]
            ratio = f"{med(per):.2f}x [{min(per):.2f}..{max(per):.2f}]"
        lines.append(f"| {name} ({unit}) | {med(g):.1f} | {med(ls) if ls else float('nan'):.1f} | {ratio} |")
    tokens = [x[1] for x in results["workloads"].get("batch", {}).get("gateway", [])]
    if tokens:
        limit = results.get("pp512")
        lines.append(f"batched embedding: {med(tokens):.0f} tokens/s"
                     + (f" against llama-bench pp512's {limit:.0f} ({med(tokens) / limit:.0%})" if limit else ""))
    return "\n".join(lines)
