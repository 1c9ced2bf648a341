"""`scripts/bench.py --speculation`: speculative decoding by prompt lookup (n-grams), on an
editing workload and an ordinary chat, with and without it, against llama-server with the
same speculation settings, in one run.

Workloads (greedy, streamed ``/v1/completions``: a raw prompt, so both servers read the same
tokens):
- editing: a Python file of a few hundred tokens, then the request to write it again with one
  name changed; the answer copies most of the file;
- chat: an ordinary question whose answer the prompt does not hold.
Contenders: the gateway with ``spec_type: none`` and ``spec_type: ngram`` (``--spec-n``,
``--spec-m``), llama-server at its defaults and with ``--spec-type ngram-simple`` and the same
sizes. Each round runs every workload on each contender in turn, the order rotating. Reported:
decode tokens per second (after the first token) per contender and workload, the median over
rounds, with the median of per-round ratios (to the same server without speculation, and the
gateway's to llama-server's) and their min..max; the share of drafted tokens the model kept
(the gateway's, from its done events' counts as its usage reports them).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
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
}
GATEWAY, GATEWAY_SPEC, LLAMA, LLAMA_SPEC = "gateway", "gateway, ngram", "llama-server", "llama-server, ngram"
GATEWAY_DRAFT, LLAMA_DRAFT = "gateway, draft model", "llama-server, draft model"


def gateway(model: Path, args, tmp: Path, spec: str) -> Server:
    """``spec``: none, ngram or draft (``--spec-draft``, ``--spec-draft-max`` tokens a step)."""
    cfg = tmp / f"spec-{spec}.yaml"
    extra = {"none": "    spec_type: none\n",
             "ngram": f"    spec_type: ngram\n    spec_ngram_size_n: {args.spec_n}\n"
                      f"    spec_ngram_size_m: {args.spec_m}\n",
             "draft": f"    draft: {args.spec_draft}\n    draft_max: {args.spec_draft_max}\n"}[spec]
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  spec:\n    path: {model}\n"
                   f"    n_ctx: 4096\n    parallel: 1\n    n_threads: {args.threads}\n{extra}")
    name = {"none": GATEWAY, "ngram": GATEWAY_SPEC, "draft": GATEWAY_DRAFT}[spec]
    return Server(name, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                         "--log-level", "warning"], "/health", "spec", {**os.environ, "HOME": str(tmp)})


def llama_server(binary: str, model: Path, args, spec: str) -> Server:
    flags = {"none": [], "ngram": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(args.spec_n),
                                   "--spec-ngram-simple-size-m", str(args.spec_m)],
             "draft": ["-md", str(args.spec_draft), "--spec-draft-n-max", str(args.spec_draft_max)]}[spec]
    name = {"none": LLAMA, "ngram": LLAMA_SPEC, "draft": LLAMA_DRAFT}[spec]
    return Server(name, [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}", "-t", str(args.threads),
                         "-tb", str(args.threads), "--parallel", "1", "-c", "4096", *flags], "/health", "spec")


def once(srv: Server, prompt: str, tokens: int) -> dict:
    got = srv.stream({"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                      "stream_options": {"include_usage": True}})
    n = got.usage.get("completion_tokens") or len(got.stamps)
    decode = got.stamps[-1] - got.stamps[0] if len(got.stamps) > 1 else 0.0
    told = got.usage.get("speculation") or {}  # the gateway's usage; llama-server's timings
    return {"tok_s": (n - 1) / decode if decode > 0 else 0.0, "text": got.text, "tokens": n,
            "drafted": told.get("drafted", got.timings.get("draft_n")),
            "accepted": told.get("accepted", got.timings.get("draft_n_accepted"))}


def measure(model: Path, args, tmp: Path, binary: str | None, wanted: set[str]) -> dict:
    """{contender: {workload: [per-round figures]}}."""
    kinds = ["none", "ngram"] + (["draft"] if args.spec_draft else [])
    makers = []
    if "gateway" in wanted:
        makers += [lambda k=k: gateway(model, args, tmp, k) for k in kinds]
    if binary and "llama-server" in wanted:
        makers += [lambda k=k: llama_server(binary, model, args, k) for k in kinds]
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(make()) for make in makers]
        for srv in servers:
            once(srv, "warm up: the city by the river", 4)
        out: dict[str, dict[str, list]] = {s.name: {w: [] for w in WORKLOADS} for s in servers}
        for rnd in range(args.rounds):
            k = rnd % len(servers)
            for srv in servers[k:] + servers[:k]:
                print(f"  speculation: round {rnd + 1}/{args.rounds}, {srv.name} ...", file=sys.stderr)
                for name, prompt in WORKLOADS.items():
                    out[srv.name][name].append(once(srv, prompt, args.tokens))
    return out


def _ratio(results: dict, a: str, b: str, workload: str) -> str:
    if a not in results or b not in results:
        return ""
    per = [x["tok_s"] / y["tok_s"] for x, y in zip(results[a][workload], results[b][workload]) if y["tok_s"]]
    return f"{statistics.median(per):.2f}x [{min(per):.2f}..{max(per):.2f}]" if per else ""


def report(results: dict, model: Path, args) -> str:
    med = statistics.median
    lines = [f"speculation (n-gram prompt lookup, n={args.spec_n}, m={args.spec_m}) on {model.name}, "
             f"{args.threads} threads, {args.tokens} tokens, {args.rounds} rounds, greedy",
             "| contender | workload | decode tok/s | vs the same without | vs llama-server (same setting) | kept |",
             "|---|---|---|---|---|---|"]
    plain = {GATEWAY_SPEC: GATEWAY, LLAMA_SPEC: LLAMA, GATEWAY_DRAFT: GATEWAY, LLAMA_DRAFT: LLAMA}
    rival = {GATEWAY: LLAMA, GATEWAY_SPEC: LLAMA_SPEC, GATEWAY_DRAFT: LLAMA_DRAFT}
    for name, per in results.items():
        for workload, rounds in per.items():
            drafted = sum(r["drafted"] or 0 for r in rounds)
            kept = f"{sum(r['accepted'] or 0 for r in rounds) / drafted:.0%} of {drafted}" if drafted else ""
            lines.append(f"| {name} | {workload} | {med(r['tok_s'] for r in rounds):.1f} | "
                         f"{_ratio(results, name, plain[name], workload) if name in plain else ''} | "
                         f"{_ratio(results, name, rival[name], workload) if name in rival else ''} | {kept} |")
    for spec in (GATEWAY_SPEC, GATEWAY_DRAFT):
        same = [a["text"] == b["text"] for w in WORKLOADS for a, b in zip(results.get(GATEWAY, {}).get(w, []),
                                                                            results.get(spec, {}).get(w, []))]
        if same:
            lines.append(f"greedy answers of the {spec} against the gateway without: {sum(same)} of {len(same)} "
                         "the same")
    return "\n".join(lines)
