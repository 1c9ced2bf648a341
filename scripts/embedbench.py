"""`scripts/bench.py --embeddings`: embeddings and reranking against llama-server, in one run.

Models (``--embed-models``, any of these, comma-separated; default ``bge,qwen3emb,rerank``, or
``generative,rerank`` when ``--model`` is given), random-weight F16 GGUFs that the script writes
once (``benchlib.random_model``) in the shapes people serve:
- bge: a BERT encoder in bge-small's shape (384 wide, 12 layers, 12 heads, n_ff 1536, 512
  positions, mean pooling of its own, no output head) over bge's WordPiece vocabulary;
- qwen3emb: a decoder embedder in Qwen3-Embedding-0.6B's shape (1024 wide, 28 layers, 16 heads
  of 128, 8 KV heads, n_ff 3072, 32k context, last-token pooling of its own) without an
  ``output.weight``: llama.cpp then ties its head to the token embeddings, and an embedding
  context still runs that head on every token (what this shape measures that bge does not);
- generative: ``--model`` (default: the 81M random llama over qwen2's vocabulary), a model with
  no pooling of its own, mean-pooled: a generative model used to embed;
- rerank: a random-weight Qwen3-style reranker over qwen2's vocabulary
  (``testmodels.write_random_model(reranker=True)``).
Contenders, each at its own defaults with the same threads: the gateway (models.yaml
`embeddings: true`; `reranker: true` for the reranker) and llama-server (`--embeddings`, with
`--pooling mean` only for a model that has no pooling of its own, as the gateway mean-pools
those; `--reranking`).
Workloads on each embedding model, each round running every contender in turn with the order
rotating:
- one: a short input, one request at a time: p50 latency;
- clients: 8 clients, each sending one short input a request for a fixed time: requests/s;
- batch: one request of 64 inputs (texts of about 20 tokens): inputs/s and tokens/s;
- rerank (the reranker): one request of a query and 50 documents: documents/s.
Reported per model: each contender's median, and the median of the per-round ratios of the
gateway to llama-server with their min..max; and with llama.cpp's llama-bench beside
llama-server (`cmake --build BUILD --target llama-bench`; ``scripts/rpc_build.py --server``
builds it), the batch's tokens/s against llama-bench's pp512 on the same file and threads, plain
and with ``-embd 1``: the rates a batched embedding approaches. Plain pp512 runs a decoder's
output head on its last token only; an embedding context runs it on every token (llama.cpp's
decoder graphs build the head whatever the pooling, and an embedding decode outputs every
token), as ``-embd 1`` does, so on a decoder (qwen3emb, generative) a batch stays below plain
pp512 by the head's share of the arithmetic.
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

from benchlib import Server, bench_model, interleaved, random_model

from gateway.models import ggufmeta

CLIENTS = 8
WORDS = ("river city people market bridge winter summer stone house garden road north south light water "
         "music story table window letter morning evening school church harbor forest field mountain").split()


def sentence(i: int, words: int = 16) -> str:
    """A distinct input of about ``words`` + 4 tokens."""
    return f"note {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(words))


def reranker_model() -> Path:
    return random_model("random-qwen3-reranker.gguf", seed=5, what="the benchmark reranker", n_embd=512, n_layer=6,
                        n_head=8, n_ff=1536, reranker=True)


def bge_model() -> Path:
    """bge-small's shape. Its vocabulary is llama.cpp's models/ggml-vocab-bert-bge.gguf (bge's
    WordPiece tokens, as llama.cpp ships them for its tokenizer tests; llama.cpp is MIT-licensed),
    taken from the llama-cpp-python sdist (``testmodels.find_vocab``)."""
    return random_model("random-bert-bge-small.gguf", seed=11, what="the bge-small-shaped embedder", vocab="bert-bge",
                        arch="bert", n_embd=384, n_layer=12, n_head=12, n_ff=1536, context_length=512, pooling="mean")


def qwen3emb_model() -> Path:
    """Qwen3-Embedding-0.6B's shape at full size (596M weights, 1.2 GB of F16), over qwen2's
    vocabulary (Qwen3's tokenizer is Qwen2's BPE)."""
    return random_model("random-qwen3-embedding-0.6b.gguf", seed=12, what="the Qwen3-Embedding-shaped embedder",
                        arch="qwen3", n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072,
                        context_length=32768, pooling="last", output_head=False)


MODELS = {"bge": bge_model, "qwen3emb": qwen3emb_model, "rerank": reranker_model}


def chosen(args) -> list[str]:
    """The models ``--embed-models`` names, in its order (see the module's docstring)."""
    names = args.embed_models or (["generative", "rerank"] if args.model else ["bge", "qwen3emb", "rerank"])
    unknown = [n for n in names if n not in (*MODELS, "generative")]
    if unknown:
        raise SystemExit(f"--embed-models: no {', '.join(unknown)} (bge, qwen3emb, generative, rerank)")
    return names


def gateway(model: Path, threads: int, tmp: Path, kind: str) -> Server:
    cfg = tmp / f"embed-{kind}.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  m:\n    path: {model}\n"
                   f"    {'reranker' if kind == 'rerank' else 'embeddings'}: true\n    n_threads: {threads}\n")
    return Server("gateway", [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                              "--log-level", "warning"], "/health", "m", {**os.environ, "HOME": str(tmp)})


def llama_server_flags(model: Path, kind: str) -> list[str]:
    """``--reranking``, or ``--embeddings`` with ``--pooling mean`` where the model has no pooling of
    its own (as the gateway pools such a model), and without it where it has (llama.cpp then uses
    the model's). An encoder counts as having its own (``ggufmeta``'s reading)."""
    if kind == "rerank":
        return ["--reranking"]
    return ["--embeddings"] + ([] if ggufmeta.read_info(model).pooling else ["--pooling", "mean"])


def llama_server(binary: str, model: Path, threads: int, kind: str) -> Server:
    return Server("llama-server", [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
                                   "-t", str(threads), "-tb", str(threads), *llama_server_flags(model, kind)],
                  "/health", "m")


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


def pp512(bench: Path, model: Path, threads: int) -> dict[str, float] | None:
    """llama-bench's prompt processing of 512 tokens, tokens a second: ``plain`` (a generating
    context: the head on the last token only) and ``embeddings`` (``-embd 1``: an embedding
    context, which runs a decoder's head on every token, as an embedding batch does). None where
    llama-bench is not there or fails."""
    if not bench.exists():
        return None
    got = subprocess.run([str(bench), "-m", str(model), "-t", str(threads), "-p", "512", "-n", "0", "-embd", "0,1",
                          "-o", "json", "-r", "3"], capture_output=True, text=True)
    try:
        return {"embeddings" if row["embeddings"] else "plain": float(row["avg_ts"]) for row in json.loads(got.stdout)}
    except (ValueError, LookupError, TypeError):
        return None


def measure(args, tmp: Path, binary: str | None) -> dict:
    results: dict = {"threads": args.threads, "rounds": args.embed_rounds, "models": {}}
    for name in chosen(args):
        path = (args.model or bench_model()).resolve() if name == "generative" else MODELS[name]()
        kind = "rerank" if name == "rerank" else "embed"
        makers = [lambda p=path, k=kind: gateway(p, args.threads, tmp, k)]
        if binary:
            makers.append(lambda p=path, k=kind: llama_server(binary, p, args.threads, k))
        work = {"rerank": rerank} if kind == "rerank" else {"one": one, "clients": clients, "batch": batch}
        entry: dict = {"model": str(path), "workloads": {}}
        if binary:
            entry["llama_server_flags"] = llama_server_flags(path, kind)
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(make()) for make in makers]
            for srv in servers:  # warm: the gateway loads on the first request
                next(iter(work.values()))(srv, -1)
            for wname, fn in work.items():
                print(f"  embeddings: {name}: {wname} ...", file=sys.stderr)
                entry["workloads"][wname] = interleaved(servers, args.embed_rounds, fn)
        if binary and kind == "embed":
            entry["pp512"] = pp512(Path(binary).with_name("llama-bench"), path, args.threads)
        results["models"][name] = entry
    return results


UNITS = {"one": ("p50 ms", "lower"), "clients": (f"requests/s, {CLIENTS} clients", "higher"),
         "batch": ("inputs/s, one request of 64", "higher"), "rerank": ("documents/s, one request of 50", "higher")}
SHAPES = {"bge": "bge-small's shape (BERT, 384 wide, 12 layers, mean pooling, no head)",
          "qwen3emb": "Qwen3-Embedding-0.6B's shape (1024 wide, 28 layers, last-token pooling, head tied)",
          "rerank": "a random Qwen3-style reranker (512 wide, 6 layers)"}


def report(results: dict) -> str:
    med = statistics.median
    lines = [f"embeddings, {results['threads']} threads, {results['rounds']} rounds"]
    for name, entry in results["models"].items():
        flags = f"; llama-server {' '.join(entry['llama_server_flags'])}" if "llama_server_flags" in entry else ""
        lines += ["", f"{name}: {Path(entry['model']).name}, {SHAPES.get(name, '--model')}{flags}",
                  "| workload | gateway | llama-server | gateway / llama-server (speed) |", "|---|---|---|---|"]
        for wname, runs in entry["workloads"].items():
            unit, better = UNITS[wname]
            g = [x[0] if isinstance(x, (list, tuple)) else x for x in runs.get("gateway", [])]
            ls = [x[0] if isinstance(x, (list, tuple)) else x for x in runs.get("llama-server", [])]
            ratio = ""
            if g and ls:
                per = [(b / a if better == "lower" else a / b) for a, b in zip(g, ls, strict=True) if a and b]
                ratio = f"{med(per):.2f}x [{min(per):.2f}..{max(per):.2f}]"
            lines.append(f"| {wname} ({unit}) | {med(g):.1f} | {med(ls) if ls else float('nan'):.1f} | {ratio} |")
        limit = entry.get("pp512") or {}
        for who, runs in entry["workloads"].get("batch", {}).items():
            tokens = med(x[1] for x in runs)
            against = [f"{tokens / limit[k]:.0%} of llama-bench pp512's {limit[k]:.0f}{label}"
                       for k, label in (("plain", ""), ("embeddings", " with -embd 1")) if limit.get(k)]
            lines.append(f"batch, {who}: {tokens:.0f} tokens/s" + "".join(f", {a}" for a in against))
    return "\n".join(lines)
