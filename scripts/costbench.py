"""`scripts/bench.py --cost`: where the time of a 1-token completion goes, end to end.

Two gateways on the tiny scripted model (`benchlib.tiny_model()`: its decode costs microseconds,
the rest is the servers), the same configuration as bench.py's (4 slots of 4096 tokens): one
as it is, one with probes (`costtrace.py`: timestamps at the seams of a request's path in the
gateway process and its worker, wrapped around functions from outside, so the plain one runs
no probe code at all); and llama-server on the same model where it is given or on PATH.

Where uvloop is installed, a third gateway runs on the event loop the default does not take
(`serve --event-loop`: asyncio's own where the default is uvloop, else uvloop), so that what
the loop costs is measured in the same rounds: its p50 over the plain gateway's.

Each is sent 1-token `/v1/completions` (`max_tokens: 1`, greedy, prompt "Hi") one at a time over
a kept-alive connection: WARMUP to warm up, then rounds of N per server, the order rotating each
round, each round on a new connection (ROUND_WARMUP requests on it first). Per round and
server: the client's p50 and p95; against llama-server, the median of the per-round p50 ratios
[min..max]; the probes' own cost, the probed gateway's p50 over the plain one's.

The breakdown: each request of the probed gateway is cut at its stamps (the client's send and
receipt, then the gateway's and the worker's, all on CLOCK_MONOTONIC, which the processes of one
machine share; requests go one at a time, so a request's stamps are those between its send and
its receipt); each segment's figure is its median over every request of every round. The
medians need not add up to the median total exactly.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import costtrace
from benchlib import Server, interleaved, tiny_model

from gateway.cli.serve import event_loop
from gateway.models.config import ConfigError, ServerConfig

WARMUP = 30
ROUND_WARMUP = 5  # on each round's new connection
BODY = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
PLAIN, PROBED, LLAMA = "gateway", "gateway (probed)", "llama-server"

# The path of one request, as the stamps cut it: (the stamp a row begins at, the row); each row
# ends where the next present one begins, the last at the client's receipt. A stamp is a probe's
# label (costtrace.PROBES) and its mark: ">" called, "<" returned, "=" a context entered. A row
# whose stamp is missing (a middleware this configuration has not) is left out, and the row
# before it runs on to the next.
PATH: list[tuple[str, str]] = [
    ("client>", "client -> gateway: written, the loop wakes"),
    ("http.in>", "aiohttp: HTTP parse, request, handler task"),
    ("mw.connection>", "middleware in: connection guard"),
    ("mw.observe>", "middleware in: observe (request id, observation)"),
    ("mw.errors>", "middleware in: errors"),
    ("mw.host>", "middleware in: host check"),
    ("mw.browser>", "middleware in: browser guard"),
    ("mw.access>", "middleware in: access (keys, limits)"),
    ("handler>", "body: read, strict JSON, checks"),
    ("body<", "parse: body -> GenerationRequest"),
    ("parse<", "lease: limits, registry, defaults, formats"),
    ("lease=", "generate: renderer, generation, command encoded"),
    ("encode<", "pipe -> worker: written, the worker's loop wakes"),
    ("w.read>", "worker: the command read and decoded"),
    ("w.read<", "worker: the command taken (queued)"),
    ("w.prepare>", "worker: prompt read (tokenize)"),
    ("w.prepare<", "worker: admission (slot, sampler)"),
    ("w.admit<", "worker: start event, to the step"),
    ("w.step>", "worker: decode step (llama_decode, sample, done)"),
    ("w.step<", "worker: events queued, to the write"),
    ("w.flush>", "pipe -> gateway: written, the loop wakes"),
    ("events.in>", "events read, answer folded"),
    ("collect<", "generation closed, answer rendered"),
    ("json_response>", "JSON response made"),
    ("json_response<", "lease released"),
    ("lease<", "handler returns"),
    ("handler<", "middleware out: access (usage)"),
    ("mw.access<", "middleware out: browser guard, host check, errors"),
    ("mw.errors<", "middleware out: observe (request id header)"),
    ("record>", "record: metrics, inference event, live series"),
    ("record<", "middleware out: observe, connection guard"),
    ("mw.connection<", "aiohttp: response prepared, headers"),
    ("http.write>", "gateway -> client: written, the client reads"),
]
# finer rows inside those above: (row, from stamp, to stamp), each the first of its kind in the request
INSIDE: list[tuple[str, str, str]] = [
    ("  of which the registry's lease", "lease.registry>", "lease.registry="),
    ("  of which the command's pipe write, as the gateway saw it", "encode<", "send<"),
    ("  of which the worker's slot choice", "w.choose>", "w.choose<"),
    ("  of which the worker's slot memory", "w.memory>", "w.memory<"),
    ("  of which the worker's sampler chain", "w.chain>", "w.chain<"),
    ("  of which the worker's events' pipe write", "w.flush>", "w.flush<"),
    ("  of which the inference event (JSON, log)", "record.events>", "record.events<"),
    ("  of which the live series", "record.live>", "record.live<"),
]


def with_probes(srv: Server, probes: Path) -> Server:
    """``srv``, a gateway, started with the probes: a ``sitecustomize`` that installs them in its
    process and its worker's, writing their stamps under ``probes``."""
    site = probes / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text("import costtrace\ncosttrace.install()\n")
    here = str(Path(__file__).resolve().parent)
    env = dict(srv.env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), here, *filter(None, [env.get("PYTHONPATH")])])
    env[costtrace.ENV] = str(probes)
    srv.env = env
    return srv


def other_loop() -> str | None:
    """The event loop the default gateway does not run on, where both can run (uvloop installed)."""
    default = event_loop(ServerConfig().event_loop)
    if default == "uvloop":
        return "asyncio"
    try:
        return event_loop("uvloop")
    except ConfigError:
        return None


def on_loop(srv: Server, loop: str) -> Server:
    """``srv``, a gateway, started on event loop ``loop``."""
    srv.cmd = [*srv.cmd, "--event-loop", loop]
    return srv


def complete(srv: Server, conn) -> None:
    status, data = srv.request("POST", "/v1/completions", {"model": srv.model_name, **BODY}, conn)
    if status != 200:
        raise SystemExit(f"{srv.name}: HTTP {status}: {data[:300]!r}")


def latencies(srv: Server, n: int, windows: list | None) -> dict:
    """``n`` requests one at a time over a connection of their own (a server may close one left
    idle while the others are measured), after ROUND_WARMUP on it; each one's (send, receipt) in
    ns goes to ``windows`` where given."""
    lat = []
    clock = time.perf_counter_ns
    conn = srv.connect()
    for _ in range(ROUND_WARMUP):
        complete(srv, conn)
    for _ in range(n):
        t0 = clock()
        complete(srv, conn)
        t1 = clock()
        lat.append((t1 - t0) / 1e6)
        if windows is not None:
            windows.append((t0, t1))
    conn.close()
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2], "p95_ms": lat[min(len(lat) - 1, int(len(lat) * 0.95))]}


def breakdown(stamps: list[tuple[int, str, int]], windows: list[tuple[int, int]]) -> dict:
    """Each row's median in microseconds over the requests (``PATH``, then ``INSIDE``), and the total's."""
    rows: dict[str, list[float]] = {}
    totals = []
    i = 0
    for t0, t1 in windows:
        while i < len(stamps) and stamps[i][0] < t0:
            i += 1
        mine: list[tuple[int, str]] = [(t0, "client>")]
        j = i
        while j < len(stamps) and stamps[j][0] <= t1:
            mine.append(stamps[j][:2])
            j += 1
        mine.append((t1, "client<"))
        cuts, k = [], 0  # (ns, row) of each row's start found in order
        for stamp, row in PATH:
            found = next((m for m in range(k, len(mine)) if mine[m][1] == stamp), None)
            if found is not None:
                cuts.append((mine[found][0], row))
                k = found
        cuts.append((t1, ""))
        for (a, row), (b, _) in zip(cuts, cuts[1:]):
            rows.setdefault(row, []).append((b - a) / 1e3)
        firsts: dict[str, int] = {}
        for ns, label in mine:
            firsts.setdefault(label, ns)
        for row, a, b in INSIDE:
            if a in firsts and b in firsts:
                rows.setdefault(row, []).append((firsts[b] - firsts[a]) / 1e3)
        totals.append((t1 - t0) / 1e3)
    order = [row for _, row in PATH] + [row for row, _, _ in INSIDE]
    out = {row: statistics.median(rows[row]) for row in order if rows.get(row)}
    return {"rows_us": out, "total_us": statistics.median(totals), "requests": len(totals)}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(rounds: int, n: int, tmp: Path, gateway: Callable[[Path, str], Server],
            llama_server: Callable[[Path], Server] | None) -> dict:
    """``gateway(model, label)``: bench.py's gateway on that model, named ``label``."""
    probes = tmp / "probes"
    servers = [gateway(tiny_model(), PLAIN), with_probes(gateway(tiny_model(), PROBED), probes)]
    other = other_loop()
    if other is not None:
        servers.append(on_loop(gateway(tiny_model(), f"{PLAIN} ({other})"), other))
    if llama_server is not None:
        servers.append(llama_server(tiny_model()))
    windows: list[tuple[int, int]] = []
    with contextlib.ExitStack() as stack:
        for srv in servers:
            stack.enter_context(srv)
        for srv in servers:
            latencies(srv, WARMUP, None)
        print(f"  {rounds} rounds of {n} 1-token completions per server ...", file=sys.stderr)
        runs = interleaved(servers, rounds, lambda s, r: latencies(s, n, windows if s.name == PROBED else None))
    # the probed gateway and its worker wrote their stamps as they exited
    out: dict = {"servers": {}, "rounds": rounds, "requests": n}
    for srv in servers:
        per = {k: [x[k] for x in runs[srv.name]] for k in ("p50_ms", "p95_ms")}
        out["servers"][srv.name] = {"rounds": per, **{k: statistics.median(v) for k, v in per.items()}}
    base = out["servers"][PLAIN]["rounds"]["p50_ms"]
    probed = out["servers"][PROBED]["rounds"]["p50_ms"]
    out["probes_cost"] = spread([a / b for a, b in zip(probed, base)])
    out["default_loop"] = event_loop(ServerConfig().event_loop)
    if other is not None:
        out["other_loop"] = {"loop": other, "p50_ratio": spread(
            [a / b for a, b in zip(out["servers"][f"{PLAIN} ({other})"]["rounds"]["p50_ms"], base)])}
    if LLAMA in out["servers"]:
        ls = out["servers"][LLAMA]["rounds"]["p50_ms"]
        out["vs_llama_server"] = {name: spread([a / b for a, b in zip(out["servers"][name]["rounds"]["p50_ms"], ls)])
                                  for name in out["servers"] if name != LLAMA}
    out["breakdown"] = breakdown(costtrace.read(probes), windows)
    return out


def report(res: dict) -> str:
    lines = [f"\n1-token /v1/completions on the tiny scripted model, a kept-alive connection per server and "
             f"round, {res['rounds']} interleaved rounds of {res['requests']} (after {WARMUP} to warm up); "
             "medians over rounds; ratios: median of the per-round ratios [min..max]"]
    lines.append(f"| {'server':<18} | {'p50 ms':>7} | {'p95 ms':>7} | {'p50 / llama-server':>22} |")
    lines.append(f"|{'-' * 20}|{'-' * 9}|{'-' * 9}|{'-' * 24}|")
    for name, s in res["servers"].items():
        r = res.get("vs_llama_server", {}).get(name)
        ratio = f"{r['median']:.2f}x [{r['min']:.2f}..{r['max']:.2f}]" if r else ""
        lines.append(f"| {name:<18} | {s['p50_ms']:7.3f} | {s['p95_ms']:7.3f} | {ratio:>22} |")
    c = res["probes_cost"]
    lines.append(f"the probes' own cost: probed / plain p50 {c['median']:.3f}x [{c['min']:.3f}..{c['max']:.3f}]")
    lines.append(f"the plain gateway's event loop (the default): {res['default_loop']}")
    if "other_loop" in res:
        o, c = res["other_loop"]["loop"], res["other_loop"]["p50_ratio"]
        lines.append(f"on {o} instead: p50 / plain p50 {c['median']:.3f}x [{c['min']:.3f}..{c['max']:.3f}]")
    b = res["breakdown"]
    lines.append(f"\nwhere the time goes (the probed gateway, {b['requests']} requests; median microseconds "
                 f"per row; the median total {b['total_us']:.0f} us):")
    lines.append(f"| {'':<52} | {'us':>6} |")
    lines.append(f"|{'-' * 54}|{'-' * 8}|")
    for row, us in b["rows_us"].items():
        lines.append(f"| {row:<52} | {us:6.1f} |")
    return "\n".join(lines)


def main(rounds: int, n: int, tmp: Path, gateway: Callable[[Path, str], Server],
         llama_server: Callable[[Path], Server] | None) -> dict:
    res = measure(rounds, n, tmp, gateway, llama_server)
    print(report(res))
    return res


