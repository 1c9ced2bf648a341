"""`scripts/bench.py --tools`: what a round of a tool the gateway runs itself costs beyond the
tool's own time (``api/toolloop``), and the whole loop against the same conversation driven by
hand from a client.

Both on Anthropic's Messages wire (Claude Code's, whose web search is the case in point), a
gateway as bench.py makes it (4 slots of 4096 tokens) with ``server.web_search`` pointed at a
loopback SearXNG stand-in (``Searx``: its JSON API, run in this process, answering at once or
after a fixed ``delay``, its handler's own time stamped on the clock the probes use).

Each round, two contenders, their order rotating:
- **loop**: one request with the hosted ``web_search_20250305``; the model calls it, the
  gateway searches, puts the result into the conversation and generates again, in one answer;
- **by hand**: the same conversation as a client drives it: a request offering ``web_search``
  as the caller's own function (the gateway's own description and schema, so the prompt is the
  same), the stand-in queried by the client, its results put as the gateway puts them
  (``resulttext``) into a ``tool_result``, and a second request.
Figures: each one's wall time (by hand: also its two requests alone, without the client's
search), prompt and cached tokens (the inference event's, the usages'), and loop / by hand per
round, median [min..max].

1. **The scripted model** (``tests/agents.call_model``: calls ``web_search`` with fixed
   arguments, then answers once the result is in; a decode costs microseconds): the gateway's
   part of a round, cut by costtrace's probes (in the gateway process and its worker, plus the
   loop's seams, ``costtrace.PROBES``' tool rows) into the stages of ``ROUND``: from the first
   generation's last events to the second's admission by the worker, less the stand-in's own
   time; then the second prompt's read (``PREFILL``), the model's, with its cached tokens.
2. **Gemma 3 270M** (the real tier's), which does not call a tool by itself: greedy Gemma 3
   270M repeats its prompt, so a prompt that is the call in the syntax the gateway asks of its
   template makes it call ``web_search`` every time, the same on both sides. (A ``tool_choice``
   naming the tool forces it too, but under this bench's gateway greedy Gemma wrote nothing
   under the forced choice of the caller's own function after the loop's warm-up: see
   docs/performance.md.) ``server.max_tool_rounds: 1``: the second generation has no tool left
   (by hand: no tools in the second request), so both are the same two generations.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import costtrace
from benchlib import Server, free_port
from costbench import with_probes

from gateway.tools.hosted import SearchResult
from gateway.tools.resulttext import defang, search_text
from gateway.tools.toolbox import _SEARCH

RESULTS = [{"url": "https://llamas.example.org/andes", "title": "Llamas of the Andes",
            "content": "Llamas were domesticated in the Andes of South America thousands of years ago.",
            "engine": "bench"}]
HOSTED = {"type": "web_search_20250305", "name": "web_search"}
FUNCTION = {"name": _SEARCH["name"], "description": _SEARCH["description"], "input_schema": _SEARCH["parameters"]}
SCRIPTED_FINAL = ["Llamas", " live", " in", " the", " Andes", "."]
# what greedy Gemma 3 270M repeats: a call in hermes' syntax, the gateway's for a template without tools
GEMMA_CALL = '<tool_call>\n{"name": "web_search", "arguments": {"query": "llamas"}}\n</tool_call>'

PREFILL = "the model: prompt read (its uncached part), 1st token"
# The gateway's part of a round, as the stamps cut it (costbench.PATH's form): from the first
# generation's last events leaving the worker to the second generation's first decode step.
ROUND: list[tuple[str, str]] = [
    ("w.flush>", "1st generation's end: pipe, read, call held and parsed"),
    ("loop.run>", "writer: the server_tool_use frame"),
    ("toolbox.run>", "toolbox.run: arguments, bounds, to the backend"),
    ("search.http>", "web_search: HTTP to the stand-in and back"),
    ("search.http<", "toolbox.run: results kept, text, defanged"),
    ("toolbox.run<", "writer's result frame, the token cut"),
    ("loop.run<", "conversation extended, next generation sent"),
    ("encode<", "pipe -> worker: the command read"),
    ("w.prepare>", "worker: prompt rendered and tokenized"),
    ("w.prepare<", "worker: slot chosen, cache matched, admitted"),
    ("w.admit<", PREFILL),
    ("w.step<", ""),
]
INSIDE: list[tuple[str, str, str]] = [
    ("  of which the stand-in's own handler", "searx>", "searx<"),
    ("  of which the writer's result frame", "writer.result>", "writer.result<"),
    ("  of which the token cut (tokenizes long results only)", "loop.cut>", "loop.cut<"),
    ("  of which the conversation extended", "loop.converse>", "loop.converse<"),
]


class Searx:
    """A loopback SearXNG stand-in (``/search?q=...&format=json``) in a thread of this process,
    answering after ``delay`` seconds; ``stamps``: its handler's enter and leave, in ns."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.port, self.stamps = delay, free_port(), []
        self.queries: list[str] = []
        self._ready = threading.Event()

    async def _search(self, request):
        from aiohttp import web

        self.stamps.append((time.perf_counter_ns(), "searx>"))
        self.queries.append(request.query.get("q", ""))
        if self.delay:
            await asyncio.sleep(self.delay)
        out = web.json_response({"query": request.query.get("q"), "number_of_results": len(RESULTS),
                                 "results": RESULTS, "answers": [], "suggestions": [], "unresponsive_engines": []})
        self.stamps.append((time.perf_counter_ns(), "searx<"))
        return out

    def _serve(self) -> None:
        from aiohttp import web

        async def run() -> None:
            app = web.Application()
            app.router.add_get("/search", self._search)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            while True:
                await asyncio.sleep(3600)
        asyncio.run(run())

    def __enter__(self) -> Searx:
        threading.Thread(target=self._serve, daemon=True).start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        pass  # a daemon thread: it ends with the process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_search(self, query: str) -> str:
        """The client's own search, its results as the gateway gives them to a model."""
        import urllib.parse
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/search?{urllib.parse.urlencode({'q': query, 'format': 'json'})}",
                                    timeout=30) as r:
            raw = json.loads(r.read())["results"]
        return defang(search_text([SearchResult(title=x["title"], url=x["url"], content=x["content"])
                                   for x in raw]))


def scripted_model(path: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from agents import call_model

    call_model(path, "web_search", [' {"query":', ' "llamas"}'], SCRIPTED_FINAL)
    return path


def messages(srv: Server, body: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    status, data = srv.request("POST", "/v1/messages", {"model": srv.model_name, **body})
    took = time.perf_counter() - t0
    if status != 200:
        raise SystemExit(f"{srv.name}: HTTP {status}: {data[:300]!r}")
    return json.loads(data), took


def loop(srv: Server, prompt: str, max_tokens: int) -> dict:
    """One answer with one round of the hosted web search in it."""
    t0 = time.perf_counter_ns()
    got, took = messages(srv, {"max_tokens": max_tokens, "temperature": 0, "tools": [HOSTED],
                               "messages": [{"role": "user", "content": prompt}]})
    kinds = [b["type"] for b in got["content"]]
    if "web_search_tool_result" not in kinds:
        raise SystemExit(f"{srv.name}: the model did not call web_search: {kinds}")
    usage = got["usage"]
    return {"s": took, "window": (t0, time.perf_counter_ns()),
            "searches": usage["server_tool_use"]["web_search_requests"],
            "input_tokens": usage["input_tokens"] + usage.get("cache_read_input_tokens", 0),
            "cached_tokens": usage.get("cache_read_input_tokens", 0)}


def by_hand(srv: Server, searx: Searx, prompt: str, max_tokens: int, tools_after: bool) -> dict:
    """The same conversation driven by the client: the call, its own search, the second request
    (``tools_after``: with the function still offered, as the loop's second generation is)."""
    t0 = time.perf_counter()
    first, a = messages(srv, {"max_tokens": max_tokens, "temperature": 0, "tools": [FUNCTION],
                              "messages": [{"role": "user", "content": prompt}]})
    call = next((b for b in first["content"] if b["type"] == "tool_use"), None)
    if call is None:
        raise SystemExit(f"{srv.name}: the model did not call web_search by hand: {first['content']}")
    s0 = time.perf_counter()
    text = searx.client_search(call["input"]["query"])
    search = time.perf_counter() - s0
    body = {"max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": [call]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                       "content": text}]}]}
    if tools_after:
        body["tools"] = [FUNCTION]
    second, b = messages(srv, body)
    took = time.perf_counter() - t0
    u1, u2 = first["usage"], second["usage"]
    return {"s": took, "requests_s": a + b, "first_s": a, "second_s": b, "search_s": search,
            "input_tokens": [u["input_tokens"] + u.get("cache_read_input_tokens", 0) for u in (u1, u2)],
            "cached_tokens": [u.get("cache_read_input_tokens", 0) for u in (u1, u2)]}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compare(srv: Server, searx: Searx, rounds: int, prompt: Callable[[int], str], max_tokens: int,
            tools_after: bool, windows: list | None = None) -> dict:
    """``rounds`` rounds of the loop and by hand, the order alternating, after one of each to warm up."""
    loop(srv, prompt(-1), max_tokens)
    by_hand(srv, searx, prompt(-1), max_tokens, tools_after)
    runs: dict[str, list[dict]] = {"loop": [], "by hand": []}
    for r in range(rounds):
        order = ["loop", "by hand"] if r % 2 == 0 else ["by hand", "loop"]
        for which in order:
            if which == "loop":
                got = loop(srv, prompt(r), max_tokens)
                if windows is not None:
                    windows.append(got["window"])
                runs["loop"].append(got)
            else:
                runs["by hand"].append(by_hand(srv, searx, prompt(r), max_tokens, tools_after))
    lp, bh = runs["loop"], runs["by hand"]
    out = {"rounds": rounds, "loop_ms": spread([x["s"] * 1e3 for x in lp]),
           "by_hand_ms": spread([x["s"] * 1e3 for x in bh]),
           "by_hand_requests_ms": spread([x["requests_s"] * 1e3 for x in bh]),
           "by_hand_first_ms": spread([x["first_s"] * 1e3 for x in bh]),
           "by_hand_second_ms": spread([x["second_s"] * 1e3 for x in bh]),
           "client_search_ms": spread([x["search_s"] * 1e3 for x in bh]),
           "loop_over_by_hand": spread([a["s"] / b["s"] for a, b in zip(lp, bh)]),
           "loop_minus_requests_ms": spread([(a["s"] - b["requests_s"]) * 1e3 for a, b in zip(lp, bh)]),
           "loop_tokens": {"input": lp[-1]["input_tokens"], "cached": lp[-1]["cached_tokens"]},
           "by_hand_tokens": {"input": bh[-1]["input_tokens"], "cached": bh[-1]["cached_tokens"]}}
    return out


def breakdown(stamps: list[tuple[int, str, int]], windows: list[tuple[int, int]]) -> dict:
    """Each ``ROUND`` row's median in microseconds over the looped answers, the ``INSIDE`` rows,
    and the gateway's part of the round: from the first row's start to the second generation's
    admission (before ``PREFILL``, the model's own time, which a request by hand pays alike),
    less the stand-in's own time."""
    rows: dict[str, list[float]] = {}
    totals: list[float] = []
    for t0, t1 in windows:
        mine = [(ns, label) for ns, label, _ in stamps if t0 <= ns <= t1]
        at = next((k for k, (_, label) in enumerate(mine) if label == "loop.run>"), None)
        if at is None:
            continue
        start = next((k for k in range(at, -1, -1) if mine[k][1] == "w.flush>"), at)
        cuts, k = [], start
        for stamp, row in ROUND:
            found = next((m for m in range(k, len(mine)) if mine[m][1] == stamp), None)
            if found is not None:
                cuts.append((mine[found][0], row))
                k = found
        for (a, row), (b, _) in zip(cuts, cuts[1:]):
            rows.setdefault(row, []).append((b - a) / 1e3)
        firsts: dict[str, int] = {}
        for ns, label in mine[start:]:
            firsts.setdefault(label, ns)
        own = (firsts["searx<"] - firsts["searx>"]) if "searx>" in firsts and "searx<" in firsts else 0
        for row, a, b in INSIDE:
            if a in firsts and b in firsts:
                rows.setdefault(row, []).append((firsts[b] - firsts[a]) / 1e3)
        admitted = next((ns for ns, row in cuts if row == PREFILL), cuts[-1][0])
        totals.append((admitted - cuts[0][0] - own) / 1e3)
    order = [row for _, row in ROUND if row] + [row for row, _, _ in INSIDE]
    return {"rows_us": {row: statistics.median(rows[row]) for row in order if rows.get(row)},
            "round_less_tool_us": spread(totals) if totals else None, "answers": len(totals)}


def main(args, tmp: Path, gateway: Callable[[Path, str, str], Server], gemma: Path | None) -> dict:
    """``gateway(model, label, server_yaml)``: bench.py's gateway; ``gemma``: the real model, or None."""
    out: dict = {"delay_ms": args.tools_delay_ms}
    with Searx(args.tools_delay_ms / 1000) as searx:
        extra = f"  web_search: {{searxng: '{searx.url}'}}\n"
        probes = tmp / "tool-probes"
        srv = with_probes(gateway(scripted_model(tmp / "searcher.gguf"), "gateway (probed)", extra), probes)
        windows: list[tuple[int, int]] = []
        print(f"  the scripted model: {args.tools_rounds} rounds, loop and by hand ...", file=sys.stderr)
        with srv:
            out["scripted"] = compare(srv, searx, args.tools_rounds, lambda r: f"Where do llamas live? ({r})", 32,
                                      True, windows)
        stamps = sorted(costtrace.read(probes) + [(ns, label, 0) for ns, label in searx.stamps])
        out["scripted"]["breakdown"] = breakdown(stamps, windows)
        if gemma is not None and args.tools_real_rounds > 0:
            print(f"  {gemma.name}: {args.tools_real_rounds} rounds, loop and by hand ...", file=sys.stderr)
            with gateway(gemma, "gateway", extra + "  max_tool_rounds: 1\n") as real:
                out["real"] = {"model": gemma.name, **compare(real, searx, args.tools_real_rounds,
                                                              lambda r: GEMMA_CALL, args.tools_real_tokens, False)}
    return out


def _ms(s: dict) -> str:
    return f"{s['median']:.1f} [{s['min']:.1f}..{s['max']:.1f}]"


def report(res: dict) -> str:
    lines = []
    for key, title in (("scripted", "the scripted model (tests/agents.call_model)"), ("real", None)):
        r = res.get(key)
        if r is None:
            continue
        title = title or r["model"]
        lines += [f"\none web_search round on {title}, {r['rounds']} alternating rounds, the stand-in answering "
                  f"after {res['delay_ms']:g} ms; medians [min..max]",
                  f"| {'':<44} | {'ms':>28} |", f"|{'-' * 46}|{'-' * 30}|"]
        for label, k in (("loop: the whole answer", "loop_ms"), ("by hand: both requests and the search", "by_hand_ms"),
                         ("by hand: 1st request (to the call)", "by_hand_first_ms"),
                         ("by hand: 2nd request (result in)", "by_hand_second_ms"),
                         ("by hand: the two requests alone", "by_hand_requests_ms"),
                         ("by hand: the client's search", "client_search_ms"),
                         ("loop - the two requests alone", "loop_minus_requests_ms")):
            lines.append(f"| {label:<44} | {_ms(r[k]):>28} |")
        ratio = r["loop_over_by_hand"]
        lines.append(f"loop / by hand: {ratio['median']:.3f}x [{ratio['min']:.3f}..{ratio['max']:.3f}]; prompt "
                     f"tokens (of which cached): loop {r['loop_tokens']['input']} ({r['loop_tokens']['cached']}) "
                     f"over its two generations; by hand {r['by_hand_tokens']['input']} "
                     f"({r['by_hand_tokens']['cached']})")
        b = r.get("breakdown")
        if b and b["round_less_tool_us"]:
            t = b["round_less_tool_us"]
            lines += [f"\nthe gateway's part of a round ({b['answers']} answers; median microseconds per row): "
                      f"{t['median']:.0f} us [{t['min']:.0f}..{t['max']:.0f}] from the 1st generation's last events "
                      "to the 2nd's admission by the worker, less the stand-in's own time (the rows above the model's)",
                      f"| {'':<56} | {'us':>7} |", f"|{'-' * 58}|{'-' * 9}|"]
            for row, us in b["rows_us"].items():
                lines.append(f"| {row:<56} | {us:7.1f} |")
    return "\n".join(lines)
