"""`scripts/bench.py --lora`: what LoRA adapters chosen per request cost, on one model with two
random adapters (``testmodels.random_lora``: rank 4 on every attention and feed-forward weight),
against llama-server with the same two, in one run.

Contenders (each its own process, started once; greedy ``/v1/completions``):
- gateway: the model (``--model``, else bench.py's 81M random-weight model) with ``loras: {a, b}``,
  4 slots of 4096 tokens, no speculation; a request picks its adapter by model name
  (``bench:a``, ``bench:b``);
- llama-server (``--llama-server PATH``, else on PATH, else the vendored one that
  ``scripts/rpc_build.server()`` builds: the same llama.cpp as the gateway's): ``--lora-scaled
  a:0,b:0``, ``--parallel 4``, 4 x 4096 tokens; a request picks its adapter by its ``lora`` field
  (``[{"id": 0, "scale": 1}]``).

Figures, each round running every contender in turn (the order rotating):
1. switching: 1-token completions of one short prompt, one at a time over one kept-alive
   connection, N always under a, then N alternating a, b, a, b (which of the two goes first
   alternates by round): each mode's p50 and p95 latency, and their p50 difference: what a
   switch of adapters costs a request (every alternating request is one);
2. streams: 4 completions of T tokens at once (``ignore_eos``; tokens from ``usage``), 2 under a
   and 2 under b, then 4 under a: the aggregate tokens/s of each and their ratio (two sets over
   one). llama.cpp sets adapters on a whole context, so a decode holds one set's sequences: two
   sets need a decode each where one set needs one (llama-server, too, batches only slots of
   equal adapters), and each change of set makes llama.cpp reserve its graph again.
Reported: the median over rounds of each figure, and of each per-round difference or ratio with
its spread [min..max]. Nothing is asserted on the figures.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from benchlib import Server

from gateway.models import testmodels as tm

PROMPT = "The history of the city begins with a small settlement on the river, where"
SLOTS, N_CTX = 4, 4096
GATEWAY, LLAMA = "gateway", "llama-server"
WARMUP = 10


def adapters(model: Path, tmp: Path) -> dict[str, Path]:
    return {name: tm.random_lora(model, tmp / f"lora-{name}.gguf", seed=seed) for name, seed in (("a", 1), ("b", 2))}


def gateway(model: Path, files: dict[str, Path], threads: int, tmp: Path) -> Server:
    cfg = tmp / "lora.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  bench:\n    path: {model}\n"
                   f"    n_ctx: {N_CTX}\n    parallel: {SLOTS}\n    n_threads: {threads}\n    spec_type: none\n"
                   f"    loras: {{a: {files['a']}, b: {files['b']}}}\n")
    return Server(GATEWAY, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                            "--log-level", "warning"], "/health", "bench", {**os.environ, "HOME": str(tmp)})


def llama_server(binary: str, model: Path, files: dict[str, Path], threads: int) -> Server:
    return Server(LLAMA, [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}", "-t", str(threads),
                          "-tb", str(threads), "--parallel", str(SLOTS), "-c", str(N_CTX * SLOTS), "--no-webui",
                          "--lora-scaled", f"{files['a']}:0,{files['b']}:0"], "/health", "bench")


def under(srv: Server, adapter: str) -> dict:
    """What a request under ``adapter`` adds to its body on ``srv``."""
    if srv.name == GATEWAY:
        return {"model": f"bench:{adapter}"}
    return {"lora": [{"id": "ab".index(adapter), "scale": 1.0}]}


def switching(srv: Server, n: int, rnd: int) -> dict:
    """p50 and p95 of 1-token completions always under a, and alternating a and b."""
    conn = srv.connect()
    body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    order = ("a", "b") if rnd % 2 == 0 else ("b", "a")
    for i in range(WARMUP):
        srv.complete({**body, **under(srv, order[i % 2])}, conn)
    out: dict[str, float] = {}
    for mode, pick in (("same", lambda i: "a"), ("alternating", lambda i: order[i % 2]))[::1 if rnd % 2 else -1]:
        lat = []
        for i in range(n):
            t0 = time.perf_counter()
            srv.complete({**body, **under(srv, pick(i))}, conn)
            lat.append((time.perf_counter() - t0) * 1000)
        lat.sort()
        out[f"{mode}_p50_ms"] = statistics.median(lat)
        out[f"{mode}_p95_ms"] = lat[min(len(lat) - 1, int(len(lat) * 0.95))]
    conn.close()
    out["per_switch_ms"] = out["alternating_p50_ms"] - out["same_p50_ms"]
    return out


def streams(srv: Server, picks: tuple[str, ...], tokens: int, rnd: int) -> float:
    """Completion tokens a second of ``len(picks)`` completions at once, each under its pick."""
    got = [0] * len(picks)

    def one(k: int) -> None:
        body = {"prompt": f"{rnd} {k} {PROMPT}", "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                **under(srv, picks[k])}
        got[k] = srv.complete(body)["usage"]["completion_tokens"]

    threads = [threading.Thread(target=one, args=(k,)) for k in range(len(picks))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(got) / (time.perf_counter() - t0)


def measure(model: Path, args, tmp: Path, binary: str | None) -> dict:
    """{contender: {"rounds": {figure: [per round]}, figure: median}}."""
    files = adapters(model, tmp)
    makers = [lambda: gateway(model, files, args.threads, tmp)]
    if binary:
        makers.append(lambda: llama_server(binary, model, files, args.threads))
    out: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(make()) for make in makers]
        for srv in servers:  # each adapter once, and the 4 streams once
            streams(srv, ("a", "b", "a", "b"), 8, -1)
            out[srv.name] = {"rounds": {}}
        for rnd in range(args.lora_rounds):
            print(f"  lora: round {rnd + 1}/{args.lora_rounds} ...", file=sys.stderr)
            k = rnd % len(servers)
            for srv in servers[k:] + servers[:k]:
                rounds = out[srv.name]["rounds"]
                for figure, value in switching(srv, args.lora_requests, rnd).items():
                    rounds.setdefault(figure, []).append(value)
                sets = [("two_sets_tok_s", ("a", "b", "a", "b")), ("one_set_tok_s", ("a",) * 4)]
                for figure, picks in sets[::1 if rnd % 2 == 0 else -1]:
                    rounds.setdefault(figure, []).append(streams(srv, picks, args.lora_tokens, rnd))
                rounds.setdefault("two_over_one", []).append(rounds["two_sets_tok_s"][-1] / rounds["one_set_tok_s"][-1])
    for res in out.values():
        res.update({figure: statistics.median(values) for figure, values in res["rounds"].items()})
    return out


def _spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}..{fmt.format(max(values))}]"


def report(results: dict, model: Path, args) -> str:
    lines = [f"LoRA adapters per request on {model.name} (2 random adapters, rank 4), {args.threads} threads, "
             f"{args.lora_rounds} rounds; medians over rounds, differences and ratios per round [min..max]",
             f"| contender | 1-token p50 always a, ms | p50 alternating a/b, ms | per switch, ms | p95 always a / "
             f"alternating, ms | 4 streams x {args.lora_tokens} tok, 1 set, tok/s | 2 sets, tok/s | 2 sets / 1 set |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        rounds = r["rounds"]
        lines.append(f"| {name} | {r['same_p50_ms']:.2f} | {r['alternating_p50_ms']:.2f} | "
                     f"{_spread(rounds['per_switch_ms'], '{:+.2f}')} | {r['same_p95_ms']:.2f} / "
                     f"{r['alternating_p95_ms']:.2f} | {r['one_set_tok_s']:.1f} | {r['two_sets_tok_s']:.1f} | "
                     f"{_spread(rounds['two_over_one'], '{:.2f}')}x |")
    if GATEWAY in results and LLAMA in results:
        g, ls = results[GATEWAY]["rounds"], results[LLAMA]["rounds"]
        for label, key in (("4 streams over 2 sets, tok/s", "two_sets_tok_s"), ("4 streams over 1 set, tok/s",
                                                                                 "one_set_tok_s")):
            lines.append(f"gateway / llama-server, {label}: "
                         f"{_spread([a / b for a, b in zip(g[key], ls[key]) if b], '{:.2f}')}x")
    return "\n".join(lines)
