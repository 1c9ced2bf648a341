"""`scripts/bench.py --conversations`: more conversations than slots, taking turns.

N conversations share a model of M slots (N > M: a slot is taken by another conversation
before its own comes back). Each conversation starts with a ~1,500-word history and, turn
after turn, grows by a few words of a new user message and the answer; the turns go round
the conversations one request at a time (1, 2, ..., N, 1, 2, ...). With ``--middle-change`` a
line in the middle of each conversation's prompt changes every turn (a "turns so far" note, as
agents insert one), so only the part before it is the same as last time. Contenders, each
through the same turns:
- gateway: ``parallel: M``, ``n_ctx`` per slot, its default ``prompt_cache_bytes`` (a slot
  given to another conversation keeps its cache in host memory);
- gateway, no prompt cache (``--uncached-gateway``): the same with ``prompt_cache_bytes: 0``,
  what the cache buys; its greedy answers are compared with the cached gateway's, turn by turn;
- llama-server at its defaults (its RAM prompt cache, ``--cache-ram``, included):
  ``--parallel M -c M*n_ctx`` and nothing else but host, port and threads.
Requests: greedy, streamed ``/v1/completions`` (a raw prompt, so no chat template decides what
is cached) of a few tokens; time to first token is from sending to the first streamed text.
Every round starts new conversations (a new salt at the front: nothing cached from the round
before) and runs the whole workload on each contender in turn, the order rotating each round.
Reported per contender: the median time to first token of the returning turns and of the first
turns (each conversation's first request, its whole history unseen), returning / first (what a
returning turn costs against reading the whole prompt), and the prompt tokens the server said it
reused; each a median over rounds, with the median of per-round ratios to llama-server (or the
first contender) and their min..max.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import time
from pathlib import Path

from benchlib import WORDS, Server

TURN = " Now say in one short sentence what the {word} has to do with it."
GATEWAY, UNCACHED, LLAMA = "gateway", "gateway, no prompt cache", "llama-server"


class Conversation:
    """One conversation's growing completion prompt: a history (with ``middle``, a line at its
    middle that changes every turn), then user turns and answers."""

    def __init__(self, words: int, salt: str, middle: bool):
        # each conversation's own words (not the same text under another salt: a server that
        # reuses chunks past the first difference would find the others' caches)
        rng = random.Random(salt)
        self.head = f"A conversation about the city ({salt}).\nUser: " + " ".join(rng.choices(WORDS, k=words // 2))
        self.tail = "and then " + " ".join(rng.choices(WORDS, k=words - words // 2)) + "\nAssistant: I see."
        self.middle = middle
        self.turns = 0
        self.after = ""  # the user turns and answers since the history

    def next_prompt(self) -> str:
        self.turns += 1
        note = f"\n(Note: turn {self.turns}, {10_000 - 37 * self.turns} tokens left.)\n" if self.middle else "\n"
        turn = "\nUser:" + TURN.format(word=WORDS[(self.turns * 5) % len(WORDS)]) + "\nAssistant:"
        return self.head + note + self.tail + self.after + turn

    def answered(self, prompt: str, answer: str) -> None:
        turn = prompt[prompt.rindex("\nUser:"):]
        self.after += turn + answer


def gateway(model: Path, args, tmp: Path, cache: bool) -> Server:
    label = GATEWAY if cache else UNCACHED
    cfg = tmp / f"conv-{cache}.yaml"
    keep = "" if cache else "    prompt_cache_bytes: 0\n"
    if args.cache_reuse:
        keep += f"    cache_reuse: {args.cache_reuse}\n"
    n_ctx = args.slot_ctx * args.slots if args.kv_unified else args.slot_ctx  # one pool, as llama-server's -c
    if args.kv_unified:
        keep += "    kv_unified: true\n"
    if args.no_swa_full:
        keep += "    swa_full: false\n"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  conv:\n    path: {model}\n"
                   f"    n_ctx: {n_ctx}\n    parallel: {args.slots}\n    n_threads: {args.threads}\n{keep}")
    return Server(label, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                          "--log-level", "warning"], "/health", "conv", {**os.environ, "HOME": str(tmp)})


def llama_server(binary: str, model: Path, args) -> Server:
    return Server(LLAMA, [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
                          "-t", str(args.threads), "-tb", str(args.threads), "--parallel", str(args.slots),
                          "-c", str(args.slot_ctx * args.slots),
                          *(["--cache-reuse", str(args.cache_reuse)] if args.cache_reuse else []),
                          *(["--kv-unified"] if args.kv_unified else [])], "/health", "conv")


def workload(srv: Server, args, rnd: int) -> list[dict]:
    """Every turn of one round on ``srv``: [{conversation, turn, ttft_ms, answer, prompt_tokens, cached}]."""
    convs = [Conversation(args.conv_history, f"round {rnd} conversation {i}", args.middle_change)
             for i in range(args.conversations)]
    out = []
    for turn in range(args.turns):
        for i, conv in enumerate(convs):
            prompt = conv.next_prompt()
            got = srv.stream({"prompt": prompt, "max_tokens": args.answer_tokens, "temperature": 0,
                              "stream_options": {"include_usage": True}})
            first = got.stamps[0] if got.stamps else time.perf_counter()
            conv.answered(prompt, got.text)
            usage = got.usage
            out.append({"conversation": i, "turn": turn, "ttft_ms": (first - got.start) * 1000, "answer": got.text,
                        "prompt_tokens": usage.get("prompt_tokens"),
                        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")})
    return out


def figures(turns: list[dict]) -> dict:
    """One round's figures on one contender."""
    med = statistics.median
    back = [t for t in turns if t["turn"] > 0]
    first = [t for t in turns if t["turn"] == 0]
    out = {"first_ttft_ms": med(t["ttft_ms"] for t in first)}
    if back:
        out["returning_ttft_ms"] = med(t["ttft_ms"] for t in back)
        out["returning_over_first"] = out["returning_ttft_ms"] / out["first_ttft_ms"]
        cached = [t["cached"] / t["prompt_tokens"] for t in back if t["cached"] is not None and t["prompt_tokens"]]
        if cached:
            out["returning_cached_share"] = med(cached)
    return out


def measure(model: Path, args, tmp: Path, binary: str | None, wanted: set[str]) -> dict:
    """{"rounds": {contender: [per-round figures]}, "turns": {contender: [per-round turn lists]}}."""
    makers = []
    if "gateway" in wanted:
        makers.append(lambda: gateway(model, args, tmp, cache=True))
        if args.uncached_gateway:
            makers.append(lambda: gateway(model, args, tmp, cache=False))
    if binary and "llama-server" in wanted:
        makers.append(lambda: llama_server(binary, model, args))
    if not makers:
        raise SystemExit("conversations: no contender to measure (see --only and --llama-server)")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(make()) for make in makers]
        for srv in servers:
            srv.complete({"prompt": "warm up: the city by the river", "max_tokens": 4, "temperature": 0})
        rounds: dict[str, list] = {s.name: [] for s in servers}
        turns: dict[str, list] = {s.name: [] for s in servers}
        for rnd in range(args.rounds):
            k = rnd % len(servers)
            for srv in servers[k:] + servers[:k]:
                print(f"  conversations: round {rnd + 1}/{args.rounds}, {srv.name} ...", file=sys.stderr)
                got = workload(srv, args, rnd)
                turns[srv.name].append(got)
                rounds[srv.name].append(figures(got))
    return {"rounds": rounds, "turns": turns}


def mismatches(results: dict) -> tuple[int, int] | None:
    """(turns whose greedy answer differs between the gateway with and without its prompt
    cache, turns compared), or None when one of the two was not measured."""
    turns = results["turns"]
    if GATEWAY not in turns or UNCACHED not in turns:
        return None
    pairs = [(a["answer"], b["answer"]) for ra, rb in zip(turns[GATEWAY], turns[UNCACHED], strict=True)
             for a, b in zip(ra, rb, strict=True)]
    return sum(a != b for a, b in pairs), len(pairs)


def report(results: dict, model: Path, args) -> str:
    rounds = results["rounds"]
    names = list(rounds)
    base = LLAMA if LLAMA in rounds else names[0]
    med = statistics.median
    what = ", a line in the middle changing every turn" if args.middle_change else ""
    what += f", cache_reuse {args.cache_reuse}" if args.cache_reuse else ""
    what += ", kv_unified" if args.kv_unified else ""
    what += ", the gateway with swa_full: false" if args.no_swa_full else ""
    lines = [f"conversations: {model.name}, {args.conversations} conversations over {args.slots} slots of "
             f"{args.slot_ctx} tokens, ~{args.conv_history}-word histories{what}, {args.turns} turns each, "
             f"{args.answer_tokens} tokens per answer (greedy), {args.threads} threads, {args.rounds} rounds whose "
             f"order rotates; medians over rounds, and ratios to {base}: median of per-round ratios [min..max]", ""]
    width = 30
    lines.append(f"| {'':<34} |" + "".join(f" {n:>{width}} |" for n in names))
    lines.append("|" + "-" * 36 + "|" + "".join("-" * (width + 2) + "|" for _ in names))
    rows = (("returning turns TTFT, median ms", "returning_ttft_ms", "{:.1f}", True),
            ("first turns TTFT, median ms", "first_ttft_ms", "{:.1f}", True),
            ("returning / first turn", "returning_over_first", "{:.3f}", False),
            ("returning turns: prompt reused", "returning_cached_share", "{:.0%}", False))
    for label, key, fmt, ratio in rows:
        if not any(key in r for n in names for r in rounds[n]):
            continue
        cells = []
        for n in names:
            values = [r[key] for r in rounds[n] if key in r]
            cell = fmt.format(med(values)) if values else "-"
            if values and len(values) > 1 and not ratio:
                cell += f" [{fmt.format(min(values))}..{fmt.format(max(values))}]"
            if ratio and values and n != base:
                per = [a[key] / b[key] for a, b in zip(rounds[n], rounds[base], strict=True)
                       if key in a and b.get(key)]
                if per:
                    cell += f" ({med(per):.2f}x [{min(per):.2f}..{max(per):.2f}])"
            cells.append(f" {cell:>{width}} |")
        lines.append(f"| {label:<34} |" + "".join(cells))
    same = mismatches(results)
    if same is not None:
        lines += ["", f"greedy answers, gateway with and without its prompt cache: {same[0]} of {same[1]} turns differ"]
    return "\n".join(lines)
