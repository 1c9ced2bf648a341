"""`scripts/bench.py --speculation`: speculative decoding by prompt lookup (n-grams), on an
editing workload, an ordinary chat and four chats at once, with and without it, against
llama-server with the same speculation settings, in one run.

Workloads (greedy, streamed ``/v1/completions``: a raw prompt, so both servers read the same
tokens):
- editing: a Python file of a few hundred tokens, then the request to write it again with one
  name changed; the answer copies most of the file (where the model copies);
- chat: an ordinary question whose answer the prompt does not hold;
- 4 streams: four ordinary questions streamed at once (every contender has four slots), their
  tokens per second together: every token after each stream's first, over the time from the
  first stream's first token to the last stream's last;
- 4 answers: the same four questions at once, each answered to its full ``--tokens`` (``ignore_eos``):
  four different prompts, nothing to copy from them, every step a batch of four from start to end
  (where speculation must never cost the aggregate); greedy, or sampled with bench.py's
  ``--sampled`` (a seed per stream), where a tiny model's greedy answers repeat themselves;
- 4 continuations: bench.py's own four streams, one opening continued four times, likewise.
Contenders: the gateway with ``spec_type: none``, with ``spec_type: ngram`` (``--spec-n``,
``--spec-m``) and at its own defaults (no ``spec_type`` given), llama-server at its defaults
and with ``--spec-type ngram-simple`` and the same sizes (``--spec-contenders``: fewer). Each
round runs each workload on every contender in turn, the order rotating. Reported: decode tokens per second (after the
first token) per contender and workload, the median over rounds, with the median of per-round
ratios (to the same server without speculation, and the gateway's to llama-server's with the
same setting and at its defaults) and their min..max; the share of drafted tokens the model
kept (the gateway's, from its done events' counts as its usage reports them). Run it once per
model (``--model``).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import threading
from pathlib import Path

from benchlib import Server

CODE = '''def add(a, b):
    """Return the sum of a and b."""
    return a + b


def scale(values, factor):
    """Each value times factor."""
    return [v * factor for v in values]


def mean(values):
    """The arithmetic mean of values (0 for none)."""
    return add(sum(values), 0) / len(values) if values else 0


class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance

    def deposit(self, amount):
        self.balance = add(self.balance, amount)
        return self.balance

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("not enough money")
        self.balance = add(self.balance, -amount)
        return self.balance
'''
WORKLOADS = {
    "editing": f"Here is a Python file:\n```python\n{CODE}```\nThe same file, with the function `add` renamed to "
               "`plus` everywhere and nothing else changed:\n```python\n",
    "chat": "Question: Why is the sky blue at noon and red at sunset? Explain it to a child.\nAnswer:\n",
    "4 streams": None,  # STREAMS, at once
    "4 answers": None,  # STREAMS, at once, each to its full length
    "4 continuations": None,  # CONTINUATIONS, at once, each to its full length
}
STREAMS = ["Question: Why is the sky blue at noon and red at sunset? Explain it to a child.\nAnswer:\n",
           "Question: How does a bicycle stay upright while it moves? Explain it simply.\nAnswer:\n",
           "Question: What should I pack for a week of hiking in the mountains in autumn?\nAnswer:\n",
           "Question: Why do cats purr, and what does it mean when they do?\nAnswer:\n"]
# bench.py's own four streams: one opening continued four times, each told apart by its number
CONTINUATIONS = [f"{k} The history of the city begins with a small settlement on the river, where" for k in range(4)]
SLOTS = len(STREAMS)  # every contender's slots (parallel)
GATEWAY, GATEWAY_SPEC, LLAMA, LLAMA_SPEC = "gateway", "gateway, ngram", "llama-server", "llama-server, ngram"
GATEWAY_DEFAULT = "gateway, default"
GATEWAY_DRAFT, LLAMA_DRAFT = "gateway, draft model", "llama-server, draft model"


def gateway(model: Path, args, tmp: Path, spec: str) -> Server:
    """``spec``: none, ngram, draft (``--spec-draft``, ``--spec-draft-max`` tokens a step) or
    default (no speculation setting: the gateway's own default)."""
    cfg = tmp / f"spec-{spec}.yaml"
    extra = {"none": "    spec_type: none\n", "default": "",
             "ngram": f"    spec_type: ngram\n    spec_ngram_size_n: {args.spec_n}\n"
                      f"    spec_ngram_size_m: {args.spec_m}\n",
             "draft": f"    draft: {args.spec_draft}\n    draft_max: {args.spec_draft_max}\n"}[spec]
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  spec:\n    path: {model}\n"
                   f"    n_ctx: 4096\n    parallel: {SLOTS}\n    n_threads: {args.threads}\n{extra}")
    name = {"none": GATEWAY, "ngram": GATEWAY_SPEC, "draft": GATEWAY_DRAFT, "default": GATEWAY_DEFAULT}[spec]
    return Server(name, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                         "--log-level", "warning"], "/health", "spec", {**os.environ, "HOME": str(tmp)})


def llama_server(binary: str, model: Path, args, spec: str) -> Server:
    flags = {"none": [], "ngram": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(args.spec_n),
                                   "--spec-ngram-simple-size-m", str(args.spec_m)],
             "draft": ["-md", str(args.spec_draft), "--spec-draft-n-max", str(args.spec_draft_max)]}[spec]
    name = {"none": LLAMA, "ngram": LLAMA_SPEC, "draft": LLAMA_DRAFT}[spec]
    return Server(name, [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}", "-t", str(args.threads),
                         "-tb", str(args.threads), "--parallel", str(SLOTS), "-c", str(4096 * SLOTS), *flags],
                  "/health", "spec")


def once(srv: Server, prompt: str | None, tokens: int, workload: str = "", sampled: bool = False) -> dict:
    if prompt is None:
        prompts = CONTINUATIONS if workload == "4 continuations" else STREAMS
        return together(srv, prompts, tokens, full=workload != "4 streams", sampled=sampled)
    got = srv.stream({"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                      "stream_options": {"include_usage": True}})
    n = got.usage.get("completion_tokens") or len(got.stamps)
    decode = got.stamps[-1] - got.stamps[0] if len(got.stamps) > 1 else 0.0
    told = got.usage.get("speculation") or {}  # the gateway's usage; llama-server's timings
    return {"tok_s": (n - 1) / decode if decode > 0 else 0.0, "text": got.text, "tokens": n,
            "drafted": told.get("drafted", got.timings.get("draft_n")),
            "accepted": told.get("accepted", got.timings.get("draft_n_accepted"))}


def together(srv: Server, prompts: list[str], tokens: int, full: bool = False, sampled: bool = False) -> dict:
    """``prompts`` streamed at once (``full``: each to ``tokens``, past its end of text; ``sampled``:
    bench.py's sampling, a seed per stream): their decode tokens per second together."""

    def sampling(i: int) -> dict:
        return {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 1000 + i} if sampled else {"temperature": 0}

    got: list = [None] * len(prompts)

    def run(i: int) -> None:
        got[i] = srv.stream({"prompt": prompts[i], "max_tokens": tokens, "ignore_eos": full, **sampling(i),
                             "stream_options": {"include_usage": True}})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(g is None for g in got):
        raise SystemExit(f"{srv.name}: a stream of the 4 streams failed")
    counts = [g.usage.get("completion_tokens") or len(g.stamps) for g in got]
    first = min(g.stamps[0] for g in got if g.stamps)
    last = max(g.stamps[-1] for g in got if g.stamps)
    told = [g.usage.get("speculation") or {} for g in got]
    drafted = [t.get("drafted", g.timings.get("draft_n")) for t, g in zip(told, got)]
    kept = [t.get("accepted", g.timings.get("draft_n_accepted")) for t, g in zip(told, got)]
    return {"tok_s": (sum(counts) - len(got)) / (last - first) if last > first else 0.0,
            "text": "\x00".join(g.text for g in got), "tokens": sum(counts),
            "drafted": None if all(d is None for d in drafted) else sum(d or 0 for d in drafted),
            "accepted": None if all(k is None for k in kept) else sum(k or 0 for k in kept)}


def measure(model: Path, args, tmp: Path, binary: str | None, wanted: set[str]) -> dict:
    """{contender: {workload: [per-round figures]}}."""
    kinds = ["none", "ngram"] + (["draft"] if args.spec_draft else [])
    only = getattr(args, "spec_contenders", None)  # bench.py's --spec-contenders
    workloads = getattr(args, "spec_workloads", None) or set(WORKLOADS)  # bench.py's --spec-workloads

    def chosen(short: str) -> bool:
        return not only or short in only

    makers = []
    if "gateway" in wanted:
        makers += [lambda k=k: gateway(model, args, tmp, k) for k in [*kinds, "default"] if chosen(k)]
    if binary and "llama-server" in wanted:
        makers += [lambda k=k: llama_server(binary, model, args, k) for k in kinds
                   if chosen("llama" if k == "none" else f"llama-{k}")]
    out: dict[str, dict[str, list]] = {}
    for rnd in range(args.rounds):
        print(f"  speculation: round {rnd + 1}/{args.rounds} ...", file=sys.stderr)
        # Every contender is started afresh each round, in a rotating order: two servers started
        # alike on this machine can differ by a tenth for a whole run (an A/A test of two plain
        # gateways gave 0.86x), which a fixed set of processes would fold into every ratio.
        k = rnd % len(makers)
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(make()) for make in makers[k:] + makers[:k]]
            for srv in servers:
                once(srv, "warm up: the city by the river", 4)
                out.setdefault(srv.name, {w: [] for w in WORKLOADS if w in workloads})
            for name, prompt in WORKLOADS.items():  # a workload on every contender in turn: a slow spell of a
                if name not in workloads:
                    continue
                for srv in servers:  # shared machine lands on neighbours, not on one's round
                    out[srv.name][name].append(once(srv, prompt, args.tokens, name, getattr(args, "sampled", False)))
    return out  # (the first round starts them in their given order, so the report's is that)


def _ratio(results: dict, a: str, b: str, workload: str) -> str:
    if a not in results or b not in results:
        return ""
    per = [x["tok_s"] / y["tok_s"] for x, y in zip(results[a][workload], results[b][workload]) if y["tok_s"]]
    return f"{statistics.median(per):.2f}x [{min(per):.2f}..{max(per):.2f}]" if per else ""


def report(results: dict, model: Path, args) -> str:
    med = statistics.median
    lines = [f"speculation (n-gram prompt lookup, n={args.spec_n}, m={args.spec_m}) on {model.name}, "
             f"{args.threads} threads, {args.tokens} tokens, {args.rounds} rounds, greedy"
             + (" (the four-stream workloads sampled, a seed per stream)" if getattr(args, "sampled", False) else ""),
             "| contender | workload | decode tok/s | vs the same without | vs llama-server (same setting) "
             "| vs llama-server's defaults | kept |",
             "|---|---|---|---|---|---|---|"]
    plain = {GATEWAY_SPEC: GATEWAY, LLAMA_SPEC: LLAMA, GATEWAY_DRAFT: GATEWAY, LLAMA_DRAFT: LLAMA,
             GATEWAY_DEFAULT: GATEWAY}
    rival = {GATEWAY: LLAMA, GATEWAY_SPEC: LLAMA_SPEC, GATEWAY_DRAFT: LLAMA_DRAFT}
    for name, per in results.items():
        for workload, rounds in per.items():
            drafted = sum(r["drafted"] or 0 for r in rounds)
            kept = f"{sum(r['accepted'] or 0 for r in rounds) / drafted:.0%} of {drafted}" if drafted else ""
            lines.append(f"| {name} | {workload} | {med(r['tok_s'] for r in rounds):.1f} | "
                         f"{_ratio(results, name, plain[name], workload) if name in plain else ''} | "
                         f"{_ratio(results, name, rival[name], workload) if name in rival else ''} | "
                         f"{_ratio(results, name, LLAMA, workload) if name.startswith(GATEWAY) else ''} | {kept} |")
    for spec in (GATEWAY_SPEC, GATEWAY_DRAFT, GATEWAY_DEFAULT):
        plain_runs, spec_runs = results.get(GATEWAY, {}), results.get(spec, {})
        greedy = [w for w in plain_runs if not (getattr(args, "sampled", False) and w.startswith("4 "))]
        same = [a["text"] == b["text"] for w in greedy for a, b in zip(plain_runs[w], spec_runs.get(w, []))]
        if same:
            lines.append(f"greedy answers of the {spec} against the gateway without: {sum(same)} of {len(same)} "
                         "the same")
    return "\n".join(lines)
