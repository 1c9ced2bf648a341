"""`scripts/bench.py --swap`: switching between two models that do not fit together.

Two models (A and B) take turns, one request each, under `max_loaded_models: 1`, and each
request continues that model's own conversation: a ~3,000-token history, then a short new
user message per turn. Every request after the first is a swap: the other model is unloaded
and this one loaded. Contenders, each measured on the same turns:
- gateway + saved caches: the gateway saves the unloaded model's slot caches to disk and
  restores them at its next load (``server.kv_cache_dir``), so a returning conversation reads
  only its new message;
- gateway: the same with ``kv_cache_max_bytes: 0`` (nothing saved: every turn reads its whole
  history again);
- llama-server restarted per swap: what llama-swap does, one llama-server process at a time,
  started with the model the request names (its start counted in that request's time).
Reported: each request's time to first token as its client sees it (from sending the request,
or from beginning the restart, to the first streamed token), the first request of each model
(nothing cached anywhere: the cold start against llama-server's start-to-first-token), and
the total over the returning turns; ratios against llama-server restarted per swap.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from benchlib import Server, long_prompt, random_model

N_CTX = 8192
TURN = " Now tell me what happened next, in one short sentence, about the {topic}."
TOPICS = ("bridge", "harbor", "market", "winter", "garden", "river", "forest", "tower", "letter", "music")


def second_model() -> Path:
    """The default model B: bench.py's random-weight model again, other weights (seed 1)."""
    return random_model("random-qwen2-81m-b.gguf", seed=1, what="the second benchmark model")


def history(words: int, salt: str) -> str:
    return f"A conversation about the city ({salt}).\nUser: {long_prompt(words, salt)}\nAssistant: I see."


class Conversation:
    """One model's conversation, as a growing completion prompt (the same text for every
    contender: a raw prompt, so no chat template decides what is cached)."""

    def __init__(self, words: int, salt: str):
        self.text = history(words, salt)
        self.turns = 0

    def next_prompt(self) -> str:
        self.turns += 1
        return self.text + "\nUser:" + TURN.format(topic=TOPICS[self.turns % len(TOPICS)]) + "\nAssistant:"

    def answered(self, prompt: str, answer: str) -> None:
        self.text = prompt + answer


def first_token(srv: Server, prompt: str, tokens: int, started: float | None = None) -> tuple[float, str, dict]:
    """(seconds from ``started`` (or the request) to the first streamed text, the answer, usage)."""
    got = srv.stream({"prompt": prompt, "max_tokens": tokens, "temperature": 0,
                      "stream_options": {"include_usage": True}})
    first = got.stamps[0] if got.stamps else time.perf_counter()
    return first - (started if started is not None else got.start), got.text, got.usage


def gateway(models: dict[str, Path], threads: int, tmp: Path, saved: bool) -> Server:
    label = "gateway + saved caches" if saved else "gateway"
    kv = f"  kv_cache_dir: {tmp / ('kv-' + str(saved))}\n" if saved else "  kv_cache_max_bytes: 0\n"
    cfg = tmp / f"swap-{saved}.yaml"
    entries = "".join(f"  {name}:\n    path: {path}\n    n_ctx: {N_CTX}\n    parallel: 1\n    n_threads: {threads}\n"
                      for name, path in models.items())
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_loaded_models: 1\n{kv}models:\n{entries}")
    return Server(label, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                          "--log-level", "warning"], "/health", "a", {**os.environ, "HOME": str(tmp)})


def restarted(path: str, model: Path, name: str, threads: int) -> Server:
    return Server("llama-server", [path, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
                                   "-t", str(threads), "-tb", str(threads), "--parallel", "1", "-c", str(N_CTX),
                                   "--no-webui", "-lv", "1"], "/health", name)


def run_gateway(srv: Server, order: list[str], convs: dict[str, Conversation], tokens: int) -> list[dict]:
    out = []
    for name in order:
        conv = convs[name]
        prompt = conv.next_prompt()
        ttft, answer, usage = first_token(srv.serving(name), prompt, tokens)
        conv.answered(prompt, answer)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        out.append({"model": name, "ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens"), "cached": cached})
    return out


def run_restarted(binary: str, models: dict[str, Path], order: list[str], convs: dict[str, Conversation],
                  tokens: int, threads: int) -> list[dict]:
    out = []
    for name in order:
        conv = convs[name]
        prompt = conv.next_prompt()
        began = time.perf_counter()  # the swap starts here: the previous server is already gone
        with restarted(binary, models[name], name, threads) as srv:
            ttft, answer, usage = first_token(srv, prompt, tokens, started=began)
        conv.answered(prompt, answer)
        out.append({"model": name, "ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens"), "cached": None})
    return out


def swap(models: dict[str, Path], args, tmp: Path, binary: str | None) -> dict:
    """Every contender through the same alternating turns: {contender: [turn figures]}."""
    order = [name for _ in range(args.swaps) for name in models]

    def conversations() -> dict[str, Conversation]:
        return {name: Conversation(args.history, salt=name) for name in models}

    results: dict[str, list[dict]] = {}
    for saved in (True, False):
        print(f"  swaps: {'gateway + saved caches' if saved else 'gateway'} ...", file=sys.stderr)
        with gateway(models, args.threads, tmp, saved) as srv:
            results[srv.name] = run_gateway(srv, order, conversations(), args.swap_tokens)
    if binary:
        print("  swaps: llama-server restarted per swap ...", file=sys.stderr)
        results["llama-server restarted"] = run_restarted(binary, models, order, conversations(), args.swap_tokens,
                                                          args.threads)
    return results


def report(results: dict, models: dict[str, Path], args) -> str:
    names = list(results)
    base = "llama-server restarted" if "llama-server restarted" in results else names[-1]
    n_models = len(models)
    lines = [f"swap benchmark: models {', '.join(f'{k}={p.name}' for k, p in models.items())}; "
             f"~{args.history}-word histories, {args.swaps} turns each, {args.swap_tokens} tokens per answer, "
             f"{args.threads} threads, max_loaded_models 1", ""]
    header = "| turn | model | " + " | ".join(f"{n} TTFT s" for n in names) + " |"
    lines += [header, "|" + "---|" * (len(names) + 2)]
    for i in range(len(results[names[0]])):
        row = results[names[0]][i]
        cells = []
        for n in names:
            r = results[n][i]
            cached = f" ({r['cached']}/{r['prompt_tokens']} cached)" if r.get("cached") else ""
            cells.append(f"{r['ttft_s']:.2f}{cached}")
        lines.append(f"| {i + 1} | {row['model']} | " + " | ".join(cells) + " |")
    lines.append("")

    def total(n: str, part: slice) -> float:
        return sum(r["ttft_s"] for r in results[n][part])

    lines.append("| | " + " | ".join(names) + " |")
    lines.append("|" + "---|" * (len(names) + 1))
    for label, part in (("first request per model (cold), s", slice(0, n_models)),
                        ("returning turns (swaps), total s", slice(n_models, None)),
                        ("all turns, total s", slice(None))):
        cells = [f"{total(n, part):.2f}" + (f" ({total(n, part) / total(base, part):.2f}x)" if n != base else "")
                 for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "gateway" in results and len(results[names[0]]) > n_models:
        ratio = statistics.median(a["ttft_s"] / b["ttft_s"] for a, b in
                                  zip(results[names[0]][n_models:], results["gateway"][n_models:], strict=True))
        lines.append("")
        lines.append(f"returning turn with a saved cache / the same turn without: median {ratio:.2f}x")
    return "\n".join(lines)
