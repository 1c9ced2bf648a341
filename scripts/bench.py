#!/usr/bin/env python3
"""Speed, side by side, on one GGUF with one thread count, in one run.

    .venv/bin/python scripts/bench.py                    # the 81M random-weight qwen2-vocab model
    .venv/bin/python scripts/bench.py --model X.gguf --threads 4 --tokens 256 --json out.json

Measured now, for each contender: single-stream decode tok/s and time to first token of a
greedy completion (the same prompt and token count everywhere):
- gateway: a real `gguf-gateway serve` process, streamed over HTTP (SSE) from a client in
  this process, so the number includes the HTTP, the pipe and the worker;
- llama-cpp-python: `Llama.create_completion(stream=True)` in this process (its high-level API).
Ratios are against the first alternative (llama-cpp-python). Contenders run one after
another, never at once, so they do not share the cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from gateway import testmodels as tm  # noqa: E402

PROMPT = "The history of the city begins with a small settlement on the river, where"
# --sampled: llama-server's default chain, the same on every contender
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 1}
GREEDY = {"temperature": 0}


def bench_model() -> Path:
    path = tm.data_dir() / "bench" / "random-qwen2-81m.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing the benchmark model to {path} ...", file=sys.stderr)
        tm.write_random_model(path.with_suffix(".part"), tm.find_vocab("qwen2"))
        path.with_suffix(".part").replace(path)
    return path


def _rates(stamps: list[float], start: float) -> tuple[float, float]:
    """(time to first token in ms, decode tok/s after the first token)."""
    ttft = (stamps[0] - start) * 1000
    tps = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return ttft, tps


def run_llama_cpp_python(model: Path, threads: int, tokens: int, repeats: int, sampling: dict
                         ) -> list[tuple[float, float]]:
    import llama_cpp

    llm = llama_cpp.Llama(str(model), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    out = []
    for i in range(repeats + 1):
        llm.reset()  # no prompt cache between runs: every run pays for its prompt
        start = time.perf_counter()
        stamps = [time.perf_counter() for _ in llm.create_completion(PROMPT, max_tokens=tokens, stream=True,
                                                                     **sampling)]
        if i:  # the first run warms up
            out.append(_rates(stamps, start))
    llm.close()
    return out


def run_gateway(model: Path, threads: int, tokens: int, repeats: int, sampling: dict) -> list[tuple[float, float]]:
    from helpers import ServerProcess

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "models.yaml"
        cfg.write_text(f"models:\n  bench:\n    path: {model}\n    n_ctx: 2048\n    n_threads: {threads}\n")
        with ServerProcess("--config", str(cfg), "--log-level", "warning") as srv:
            out = []
            for i in range(repeats + 1):
                body = {"model": "bench", "prompt": PROMPT, "max_tokens": tokens, "stream": True,
                        "ignore_eos": True, **sampling}
                if i:  # a different first word each run: no prefix reuse flatters the first token
                    body["prompt"] = f"{i} " + PROMPT
                req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                start = time.perf_counter()
                stamps = []
                with urllib.request.urlopen(req) as r:
                    for line in r:
                        if line.startswith(b"data: {") and b'"text":""' not in line:
                            stamps.append(time.perf_counter())
                if i:
                    out.append(_rates(stamps, start))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="GGUF to measure (default: generate the 81M random model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=200, help="tokens per completion")
    p.add_argument("--repeats", type=int, default=3, help="measured runs per contender (after one warm-up)")
    p.add_argument("--sampled", action="store_true", help="sample (temperature 0.8, top-k 40, top-p 0.95, "
                   "min-p 0.05) instead of greedy decoding")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args(argv)
    model = args.model or bench_model()

    results = {}
    for name, fn in (("llama-cpp-python", run_llama_cpp_python), ("gateway", run_gateway)):
        print(f"measuring {name} ...", file=sys.stderr)
        runs = fn(model, args.threads, args.tokens, args.repeats, SAMPLED if args.sampled else GREEDY)
        results[name] = {"ttft_ms": statistics.median(r[0] for r in runs),
                         "decode_tok_s": statistics.median(r[1] for r in runs), "runs": runs}

    base = results["llama-cpp-python"]
    mode = "sampled" if args.sampled else "greedy"
    print(f"\nmodel {model.name}, {args.threads} threads, {args.tokens} tokens, {mode}, median of {args.repeats}")
    print(f"{'contender':<18} {'decode tok/s':>12} {'ratio':>6} {'TTFT ms':>9} {'ratio':>6}")
    for name, r in results.items():
        print(f"{name:<18} {r['decode_tok_s']:>12.1f} {r['decode_tok_s'] / base['decode_tok_s']:>5.2f}x "
              f"{r['ttft_ms']:>9.1f} {r['ttft_ms'] / base['ttft_ms']:>5.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"model": str(model), "threads": args.threads, "tokens": args.tokens,
                                         "mode": mode, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
