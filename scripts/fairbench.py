"""`scripts/bench.py --fairness`: fair queues across keys, and swap-aware ordering across models,
against first-come order, in one run.

Contenders: this checkout's gateway, and, with ``--baseline CHECKOUT`` (a clone of a commit
before fair queueing, e.g. ``git worktree add /tmp/base fa4e7b0``), that checkout's gateway,
run on this venv with its package first on the path (``benchlib.gateway_server``): today's
first-come order. Without ``--baseline`` the baseline's figures are left out, and said so.

1. **Two keys on one model with 2 slots** (``parallel: 2``; ``--model``, else bench.py's 81M
   random-weight model, on which ``--fair-tokens`` tokens take a noticeable time on a CPU). Keys
   ``a`` and ``b`` (users, weight and priority their defaults). First key b alone: one short
   request (``B_TOKENS`` tokens) a second, ``--fair-b-alone`` of them. Then key a sends
   ``--fair-requests`` streamed completions of ``--fair-tokens`` tokens at once, and from half a
   second later key b sends one short request a second, each without waiting for the last,
   until a's are all answered. Reported: b's time to first token, p50 and p95, alone and beside
   a's batch; a's answer time (its first token to its last: the time one of its answers holds a
   slot), p50; and the target read from them: b's p95 at most one of a's answers plus b's p50
   alone (b waits for one slot to free, never for a's queue).
2. **Three models with room for one** (``max_loaded_models: 1``; three scripted looping models,
   ``testmodels.endless``, so a load and an answer are cheap and the swaps are many). Three
   clients each loop over the models, a then b then c, one streamed request each, waiting for
   its answer, for ``--fair-seconds``; client k begins at the k-th model, so the three want
   different models from the start (the case a swap per change handles worst). Counted: the
   swaps (``gguf_gateway_swaps_total`` where the gateway has it) and the loads (the count of
   ``gguf_gateway_model_load_duration_seconds``, which every checkout has; loads - 1 is the
   swaps by the same measure for all: each load after the first unloaded a model), and each
   request's wait (time to first token), p50, p95 and max. Three configurations: this gateway
   at its defaults (``swap_hold_seconds`` 2, ``max_swap_wait`` 30); this gateway with both 0
   (llama-swap's behaviour: a swap at every change); the baseline checkout. Swaps are reported
   as a ratio to the llama-swap configuration's (target: at most a third, with no wait over
   ``max_swap_wait``).
3. **A 1-token completion's cost** on the tiny scripted model (``benchlib.overhead``), this
   gateway against the baseline, in ``--fair-rounds`` interleaved rounds of
   ``--fair-overhead-requests``: the per-round difference of p50s, median [min..max] (target:
   at most ``TARGET_MS`` added).

``--fair-scenes 1,3`` runs only some scenes. Each figure carries its spread; ``--json`` has
every request's figure.
"""

from __future__ import annotations

import re
import statistics
import sys
import threading
import time
from pathlib import Path

from benchlib import Server, gateway_server, interleaved, overhead, spread, tiny_model

from gateway.models import testmodels as tm

TARGET_MS = 0.05
ROOT_KEY, A_KEY, B_KEY = "sk-fair-root-0123456789abcdef", "sk-fair-a-0123456789abcdef", "sk-fair-b-0123456789abcdef"
MODEL = "fair"
B_TOKENS = 4  # b's short request
STUCK_S = 90.0  # three-model requests unanswered this long after the scene: stuck (past max_swap_wait's 30 s)
SLOTS = 2
THIS, HOLD0, BASE = "fair queues", "fair queues, hold 0 (llama-swap)", "first come (baseline)"


def _keys() -> str:
    return (f"  api_keys:\n    root: {ROOT_KEY}\n    a: {{key: {A_KEY}, role: user}}\n"
            f"    b: {{key: {B_KEY}, role: user}}\n")


def as_key(srv: Server, key: str) -> Server:
    """The same server, every request sent with ``key``."""
    view = srv.serving(srv.model_name)
    view.headers = {**srv.headers, "Authorization": f"Bearer {key}"}
    return view


def stream_times(srv: Server, prompt: str, tokens: int) -> dict:
    """One streamed completion: seconds to its first text, to its end, first text to last."""
    got = srv.stream({"prompt": prompt, "max_tokens": tokens, "ignore_eos": True, "temperature": 0})
    end = time.perf_counter()
    if not got.stamps:
        raise SystemExit(f"{srv.name}: a streamed completion gave no text")
    return {"ttft_s": got.stamps[0] - got.start, "total_s": end - got.start,
            "answer_s": got.stamps[-1] - got.stamps[0], "sent": got.start}


class Calls:
    """Requests sent from threads; each one's figures, or its error (a thread's exception
    would otherwise vanish)."""

    def __init__(self) -> None:
        self.done: list[dict] = []
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def send(self, fn, *args) -> None:
        def run() -> None:
            try:
                got = fn(*args)
            except BaseException as e:  # noqa: BLE001 (SystemExit from Server too: reported, not lost)
                with self.lock:
                    self.errors.append(str(e)[:300])
                return
            with self.lock:
                self.done.append(got)

        t = threading.Thread(target=run, daemon=True)
        self.threads.append(t)
        t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def join(self) -> None:
        for t in self.threads:
            t.join()


def one_model_config(tmp: Path, label: str, model: Path, threads: int, args) -> Path:
    cfg = tmp / f"two-keys-{label.replace(' ', '_')}.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_queue: {args.fair_requests + 64}\n{_keys()}"
                   f"models:\n  {MODEL}:\n    path: {model}\n    n_ctx: {args.fair_tokens + 256}\n"
                   f"    parallel: {SLOTS}\n    n_threads: {threads}\n")
    return cfg


def two_keys(srv: Server, args) -> dict:
    """Scene 1 on one gateway."""
    a, b = as_key(srv, A_KEY), as_key(srv, B_KEY)
    stream_times(b, "warm up: the model loads\n", 2)
    alone = Calls()
    for i in range(args.fair_b_alone):
        alone.send(stream_times, b, f"b alone {i}: the city\n", B_TOKENS)
        time.sleep(1.0)
    alone.join()
    burst, paced = Calls(), Calls()
    began = time.perf_counter()
    for i in range(args.fair_requests):
        burst.send(stream_times, a, f"a batch {i}: the history of the city\n", args.fair_tokens)
    time.sleep(0.5)
    k = 0
    while burst.alive() or k == 0:  # one at least, however soon a's batch ends
        paced.send(stream_times, b, f"b beside a {k}: the city\n", B_TOKENS)
        k += 1
        time.sleep(1.0)
    burst.join()
    paced.join()
    errors = alone.errors + burst.errors + paced.errors
    b_alone = spread([r["ttft_s"] for r in alone.done])
    b_beside = spread([r["ttft_s"] for r in paced.done])
    a_answer = spread([r["answer_s"] for r in burst.done])
    bound = a_answer["p50"] + b_alone["p50"]
    return {"b_alone_ttft_s": b_alone, "b_ttft_s": b_beside, "a_answer_s": a_answer,
            "a_total_s": spread([r["total_s"] for r in burst.done]), "a_batch_s": time.perf_counter() - began,
            "target_bound_s": bound, "target_met": bool(b_beside["n"]) and b_beside["p95"] <= bound,
            "errors": errors, "b_requests": [r["ttft_s"] for r in sorted(paced.done, key=lambda r: r["sent"])]}


def three_models_files() -> dict[str, Path]:
    """Three scripted looping models, written once into the data directory's bench folder."""
    out = {}
    for name in ("a", "b", "c"):
        path = tm.data_dir() / "bench" / f"fair-loop-{name}.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tm.endless(path.with_suffix(".part"), cycle=(f" {name}1", f" {name}2"))
            path.with_suffix(".part").replace(path)
        out[name] = path
    return out


def three_models_config(tmp: Path, label: str, models: dict[str, Path], threads: int, hold: str) -> Path:
    cfg = tmp / f"three-models-{label.replace(' ', '_').replace(',', '')}.yaml"
    entries = "".join(f"  {name}:\n    path: {path}\n    n_ctx: 512\n    parallel: 1\n    n_threads: {threads}\n"
                      for name, path in models.items())
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_loaded_models: 1\n{hold}models:\n{entries}")
    return cfg


def metric_sum(text: str, name: str) -> float | None:
    """The sum of every series of ``name`` in a Prometheus text exposition; None where absent."""
    got = None
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M):
        got = (got or 0.0) + float(m.group(1))
    return got


def three_models(srv: Server, seconds: float, tokens: int) -> dict:
    """Scene 2 on one gateway: model a loaded first (one request), then the clients for
    ``seconds``. Requests still unanswered ``STUCK_S`` after that count as errors (the gateway is
    then stopped under them), so a gateway that deadlocks ends the scene, reported."""
    names = ["a", "b", "c"]
    stream_times(srv.serving("a"), "warm up: the model loads\n", 2)
    stop = time.perf_counter() + seconds
    waits: dict[str, list[float]] = {n: [] for n in names}
    errors: list[str] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        i = k
        while time.perf_counter() < stop:
            name = names[i % 3]
            try:
                got = stream_times(srv.serving(name), f"client {k} turn {i}\n", tokens)
            except BaseException as e:  # noqa: BLE001 (reported, not lost in the thread)
                with lock:
                    errors.append(f"{name}: {str(e)[:300]}")
                time.sleep(0.5)
            else:
                with lock:
                    waits[name].append(got["ttft_s"])
            i += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:  # a stream that waits on (a gateway may send keep-alives) is bounded here
        t.join(max(0.0, stop + STUCK_S - time.perf_counter()))
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        errors.append(f"stuck: {stuck} request(s) unanswered {STUCK_S:g} s after the scene's end (a deadlock?)")
    status, body = srv.request("GET", "/metrics")
    text = body.decode() if status == 200 else ""
    swaps = metric_sum(text, "gguf_gateway_swaps_total")
    loads = metric_sum(text, "gguf_gateway_model_load_duration_seconds_count")
    every = [w for n in names for w in waits[n]]
    return {"requests": len(every), "stuck": stuck, "swaps_total": swaps, "loads": loads,
            "swaps": None if loads is None else max(0.0, loads - 1), "wait_s": spread(every),
            "wait_by_model_s": {n: spread(w) for n, w in waits.items()}, "errors": errors}


def main(args, tmp: Path, model: Path, baseline: Path | None) -> dict:
    scenes = set(args.fair_scenes)
    out: dict = {"model": str(model), "requests": args.fair_requests, "tokens": args.fair_tokens,
                 "seconds": args.fair_seconds, "threads": args.threads,
                 "baseline": str(baseline) if baseline else None}
    checkouts = [(THIS, None)] + ([(BASE, baseline)] if baseline else [])
    if 1 in scenes:
        out["two_keys"] = {}
        for label, checkout in checkouts:
            print(f"  two keys, one model with {SLOTS} slots: {label} ...", file=sys.stderr)
            cfg = one_model_config(tmp, label, model, args.threads, args)
            with gateway_server(cfg, label, MODEL, tmp, checkout, {"Authorization": f"Bearer {ROOT_KEY}"}) as srv:
                out["two_keys"][label] = two_keys(srv, args)
    if 2 in scenes:
        models = three_models_files()
        out["three_models"] = {}
        holds = [(THIS, None, ""), (HOLD0, None, "  swap_hold_seconds: 0\n  max_swap_wait: 0\n")]
        holds += [(BASE, baseline, "")] if baseline else []
        for label, checkout, hold in holds:
            print(f"  three models, room for one: {label}, {args.fair_seconds:g} s ...", file=sys.stderr)
            cfg = three_models_config(tmp, label, models, args.threads, hold)
            with gateway_server(cfg, label, "a", tmp, checkout) as srv:
                out["three_models"][label] = three_models(srv, args.fair_seconds, B_TOKENS)
        ref = out["three_models"][HOLD0]["swaps"]
        for r in out["three_models"].values():
            r["swaps_over_llama_swap"] = (r["swaps"] / ref) if ref and not r["stuck"] else None
    if 3 in scenes and baseline:
        print(f"  1-token completions, {args.fair_rounds} interleaved rounds ...", file=sys.stderr)
        with gateway_server(one_model_config(tmp, "cost this", tiny_model(), 1, args), THIS, MODEL, tmp,
                            None, {"Authorization": f"Bearer {A_KEY}"}) as this, \
                gateway_server(one_model_config(tmp, "cost base", tiny_model(), 1, args), BASE, MODEL, tmp,
                               baseline, {"Authorization": f"Bearer {A_KEY}"}) as base:
            runs = interleaved([this, base], args.fair_rounds, lambda s, r: overhead_round(s, args))
        diffs = [x["p50_ms"] - y["p50_ms"] for x, y in zip(runs[THIS], runs[BASE], strict=True)]
        out["one_token"] = {"rounds": runs, THIS: spread([x["p50_ms"] for x in runs[THIS]]),
                            BASE: spread([x["p50_ms"] for x in runs[BASE]]), "p50_diff_ms": spread(diffs),
                            "target_ms": TARGET_MS, "target_met": statistics.median(diffs) <= TARGET_MS}
    elif 3 in scenes:
        out["one_token"] = None
    return out


def overhead_round(srv: Server, args) -> dict:
    return overhead(srv, args.fair_overhead_requests)


def _s(x: dict, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(x['p50'] * scale)} / {fmt.format(x['p95'] * scale)} [{fmt.format(x['min'] * scale)}.." \
           f"{fmt.format(x['max'] * scale)}]"


def report(res: dict) -> str:
    lines = []
    if res["baseline"] is None:
        lines.append("baseline: not measured (give --baseline CHECKOUT, a clone of a commit before fair queues)")
    if "two_keys" in res:
        lines += ["", f"two keys, one model with {SLOTS} slots ({Path(res['model']).name}, {res['threads']} threads): "
                  f"key a sends {res['requests']} x {res['tokens']} tokens at once, key b one {B_TOKENS}-token "
                  "request a second; seconds, p50 / p95 [min..max]", "",
                  "| gateway | b alone TTFT | b beside a's batch TTFT | a's answer (first token to last) | "
                  "a's batch, s | target: b p95 <= a p50 + b alone p50 |", "|---|---|---|---|---|---|"]
        for label, r in res["two_keys"].items():
            lines.append(f"| {label} | {_s(r['b_alone_ttft_s'])} | {_s(r['b_ttft_s'])} (n={r['b_ttft_s']['n']}) | "
                         f"{_s(r['a_answer_s'])} | {r['a_batch_s']:.1f} | {r['b_ttft_s']['p95']:.2f} <= "
                         f"{r['target_bound_s']:.2f}: {'met' if r['target_met'] else 'NOT met'} |")
            if r["errors"]:
                lines.append(f"|  errors: {len(r['errors'])}, first: {r['errors'][0]} |")
    if "three_models" in res:
        lines += ["", f"three models, room for one: three clients looping a, b, c for {res['seconds']:g} s; waits "
                  "(time to first token) in seconds, p50 / p95 [min..max]; swaps = loads - 1", "",
                  "| gateway | requests | swaps | / llama-swap's | swaps_total | wait |", "|---|---|---|---|---|---|"]
        for label, r in res["three_models"].items():
            ratio, total = r["swaps_over_llama_swap"], r["swaps_total"]
            lines.append(f"| {label} | {r['requests']} | {r['swaps']:.0f} | "
                         f"{'stuck' if r['stuck'] else '' if ratio is None else f'{ratio:.2f}x'} | "
                         f"{'(none)' if total is None else format(total, '.0f')} | {_s(r['wait_s'])} |")
            if r["errors"]:
                lines.append(f"|  errors: {len(r['errors'])}, first: {r['errors'][0]} |")
    if res.get("one_token"):
        o = res["one_token"]
        d = o["p50_diff_ms"]
        lines += ["", f"1-token completion on the tiny scripted model, {len(o['rounds'][THIS])} interleaved rounds: "
                  f"p50 ms, median [min..max] over rounds; {THIS} {o[THIS]['median']:.3f} "
                  f"[{o[THIS]['min']:.3f}..{o[THIS]['max']:.3f}], {BASE} {o[BASE]['median']:.3f} "
                  f"[{o[BASE]['min']:.3f}..{o[BASE]['max']:.3f}]; difference {d['median']:+.3f} "
                  f"[{d['min']:+.3f}..{d['max']:+.3f}] ms (target at most +{TARGET_MS} ms: "
                  f"{'met' if o['target_met'] else 'NOT met'})"]
    elif "one_token" in res:
        lines += ["", "1-token completion: not measured (it needs --baseline CHECKOUT)"]
    return "\n".join(lines)
