"""`scripts/bench.py --access`: what API keys, their limits and usage recording cost a request.

Three gateways on the tiny scripted model (`benchlib.tiny_model()`: the model costs microseconds,
the rest is the gateway), each with its own HOME and state folder in a temp dir:
- open, no usage: no keys, `usage_db: off` (usage kept in an in-memory database);
- open: no keys, usage recorded to its file (the default: usage.db in the state folder), as
  key `anonymous`;
- keys + limits + usage: `root` (an admin) and `bench` (models `bench*`, rpm, tpm, max_parallel
  and a daily budget, all far above what the run spends, so every limit is checked and none
  refuses), beside 50 other named user keys; usage to its file; every request sends
  `Authorization: Bearer` bench's key.
Each is sent 1-token chat completions (`/v1/chat/completions`, `max_tokens: 1`, greedy) over one
kept-alive connection: 30 to warm up, then rounds of N per gateway, the order rotating each round.
Per round and gateway: p50 and p95. Reported against "open, no usage": the median over rounds of
the per-round p50 difference (ms) and ratio, each with its spread [min..max], and whether the
keys + limits + usage gateway is within the target (0.1 ms over). After the rounds each gateway's
/usage is read back: the requests it recorded against those sent.

Then the usage store alone, in this process: a `UsageStore` on a temp file is given `record()`
for SPENDS spends over 50 keys x 5 models x 3 wires from one loop (the record calls timed alone),
then a query is awaited (the writer flushes everything before it answers): spends recorded per
second, end to end, and the rows written.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Server, interleaved, tiny_model

TARGET_MS = 0.1
WARMUP = 30
ROOT_KEY = "sk-bench-root-0123456789abcdef"
BENCH_KEY = "sk-bench-user-0123456789abcdef"
OTHER_KEYS = 50
MODEL = "bench"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
BASE, OPEN, KEYS = "open, no usage", "open", "keys + limits + usage"


def _keys_yaml() -> str:
    lines = ["  api_keys:\n", f"    root: {ROOT_KEY}\n",
             f"    bench: {{key: {BENCH_KEY}, models: ['bench*'], rpm: 100000000, tpm: 1000000000000, "
             "max_parallel: 64, budget: 1000000000000, budget_period: day}\n"]
    for i in range(OTHER_KEYS):  # a realistic table: other people's keys, each scoped and limited
        lines.append(f"    user{i:02d}: {{key: sk-bench-other-{i:02d}-0123456789abcdef, models: ['m{i}*'], "
                     f"rpm: {60 + i}, budget: {100000 * (i + 1)}, budget_period: month}}\n")
    return "".join(lines)


def gateway(label: str, tmp: Path, usage: bool, keys: bool) -> Server:
    home = tmp / label.replace(" ", "").replace(",", "-").replace("+", "-")
    home.mkdir()
    cfg = home / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\n" + ("" if usage else "  usage_db: off\n") +
                   (_keys_yaml() if keys else "") +
                   f"models:\n  {MODEL}:\n    path: {tiny_model()}\n    n_ctx: 512\n    parallel: 1\n")
    env = {**os.environ, "HOME": str(home)}  # the state folder (usage.db) under it, nobody's own models
    for var in ("XDG_STATE_HOME", "GGUF_GATEWAY_API_KEYS"):
        env.pop(var, None)
    headers = {"Authorization": f"Bearer {BENCH_KEY}"} if keys else None
    return Server(label, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", "{port}",
                          "--log-level", "warning"], "/health", MODEL, env, headers)


def chat(srv: Server, conn: http.client.HTTPConnection) -> None:
    status, data = srv.request("POST", "/v1/chat/completions", BODY, conn)
    if status != 200:
        raise SystemExit(f"{srv.name}: HTTP {status}: {data[:300]!r}")


def latencies(srv: Server, conn: http.client.HTTPConnection, n: int) -> dict:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        chat(srv, conn)
        lat.append((time.perf_counter() - t0) * 1000)
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2], "p95_ms": lat[min(len(lat) - 1, int(len(lat) * 0.95))]}


def recorded(srv: Server, keys: bool) -> dict:
    """What the gateway's /usage says it recorded (an admin's key where it has keys)."""
    conn = srv.connect()
    conn.request("GET", "/usage?group=hour", headers={"Authorization": f"Bearer {ROOT_KEY}"} if keys else {})
    r = conn.getresponse()
    body = json.loads(r.read())
    conn.close()
    if r.status != 200:
        raise SystemExit(f"{srv.name}: /usage: HTTP {r.status}: {body}")
    return {"recording": body["recording"], "requests": sum(row["requests"] for row in body["data"]),
            "keys": sorted({row["key"] for row in body["data"]})}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(rounds: int, n: int, tmp: Path) -> dict:
    specs = ((BASE, False, False), (OPEN, True, False), (KEYS, True, True))
    servers = [gateway(label, tmp, usage, keys) for label, usage, keys in specs]
    out: dict = {}
    with contextlib.ExitStack() as stack:
        for srv in servers:
            stack.enter_context(srv)
        conns = {srv.name: srv.connect() for srv in servers}
        for srv in servers:
            for _ in range(WARMUP):
                chat(srv, conns[srv.name])
        print(f"  {rounds} rounds of {n} 1-token chat completions per gateway ...", file=sys.stderr)
        runs = interleaved(servers, rounds, lambda s, r: latencies(s, conns[s.name], n))
        for c in conns.values():
            c.close()
        for (label, usage, keys), srv in zip(specs, servers):
            per = {k: [x[k] for x in runs[label]] for k in ("p50_ms", "p95_ms")}
            out[label] = {"usage_file": usage, "keys": keys, "rounds": per,
                          **{k: statistics.median(v) for k, v in per.items()},
                          "sent": WARMUP + rounds * n, "recorded": recorded(srv, keys)}
    base = out[BASE]["rounds"]["p50_ms"]
    for label in (OPEN, KEYS):
        p50 = out[label]["rounds"]["p50_ms"]
        out[label]["vs_base"] = {"p50_diff_ms": spread([a - b for a, b in zip(p50, base)]),
                                 "p50_ratio": spread([a / b for a, b in zip(p50, base) if b])}
    return out


async def _capacity(spends: int, path: Path) -> dict:
    from gateway.access.usage import Spend, UsageStore

    store = UsageStore(path, keep_days=30)
    store.start()
    await store.last_used()  # the file is open before the clock starts
    now = time.time()
    wires = ("chat", "completions", "messages")
    batch = [Spend(f"key{i % 50:02d}", f"model-{i // 50 % 5}", wires[i // 250 % 3], 20 + i % 7, 1, now)
             for i in range(spends)]
    t0 = time.perf_counter()
    for spend in batch:
        store.record(spend)
    t1 = time.perf_counter()
    rows = await store.query(since=now - 3600, group="hour")  # the writer flushes all before it answers
    t2 = time.perf_counter()
    await store.close()
    counted = sum(r.requests for r in rows)
    if counted != spends:
        raise SystemExit(f"the usage store counted {counted} of {spends} spends")
    record_us = (t1 - t0) / spends * 1e6
    return {"spends": spends, "record_us": record_us, "record_per_s": spends / (t1 - t0),
            "flush_s": t2 - t1, "total_s": t2 - t0, "spends_per_s": spends / (t2 - t0), "rows": len(rows),
            "counted": counted, "file_bytes": path.stat().st_size}


def capacity(spends: int, tmp: Path) -> dict:
    print(f"  the usage store alone: {spends} spends ...", file=sys.stderr)
    return asyncio.run(_capacity(spends, tmp / "capacity" / "usage.db"))


def report(res: dict, rounds: int, n: int) -> str:
    servers, store = res["servers"], res["store"]
    lines = [f"\n1-token chat completions on the tiny scripted model, one kept-alive connection per gateway, "
             f"{rounds} interleaved rounds of {n} each (after {WARMUP} to warm up); medians over rounds; "
             f"against \"{BASE}\": median of the per-round differences and ratios [min..max]"]
    w = 24
    lines.append(f"| {'gateway':<{w}} | {'p50 ms':>7} | {'p95 ms':>7} | {'p50 - base, ms':>25} | "
                 f"{'p50 / base':>22} | {'recorded / sent':>17} |")
    lines.append(f"|{'-' * (w + 2)}|{'-' * 9}|{'-' * 9}|{'-' * 27}|{'-' * 24}|{'-' * 19}|")
    for label, s in servers.items():
        diff = ratio = ""
        if "vs_base" in s:
            d, r = s["vs_base"]["p50_diff_ms"], s["vs_base"]["p50_ratio"]
            diff = f"{d['median']:+.3f} [{d['min']:+.3f}..{d['max']:+.3f}]"
            ratio = f"{r['median']:.3f}x [{r['min']:.3f}..{r['max']:.3f}]"
        rec = s["recorded"]
        seen = f"{rec['requests']} / {s['sent']}" + ("" if rec["recording"] else " (mem)")
        lines.append(f"| {label:<{w}} | {s['p50_ms']:7.3f} | {s['p95_ms']:7.3f} | {diff:>25} | {ratio:>22} | "
                     f"{seen:>17} |")
    d = servers[KEYS]["vs_base"]["p50_diff_ms"]
    over = sum(1 for a, b in zip(servers[KEYS]["rounds"]["p50_ms"], servers[BASE]["rounds"]["p50_ms"])
               if a - b > TARGET_MS)
    lines.append(f"target, {KEYS} at most {TARGET_MS} ms over {BASE} (p50): "
                 f"{'MET' if res['target_met'] else 'NOT MET'} ({d['median']:+.3f} ms, the median of the rounds; "
                 f"{over} of {rounds} rounds over)")
    lines.append(f"\nthe usage store alone ({store['spends']} spends over 50 keys x 5 models x 3 wires, one loop, "
                 "a file in a temp dir):")
    lines.append(f"  record(): {store['record_us']:.2f} us per call ({store['record_per_s']:,.0f} calls/s on the "
                 "event loop)")
    lines.append(f"  the writer's flush after the loop (an awaited query): {store['flush_s'] * 1000:.1f} ms, "
                 f"{store['rows']} rows written ({store['counted']} requests counted)")
    base_ms = servers[BASE]["p50_ms"]
    lines.append(f"  end to end: {store['spends_per_s']:,.0f} spends/s recorded and written "
                 f"({store['total_s']:.3f} s): "
                 f"the store would hold about {store['spends_per_s']:,.0f} requests/s; one record() is "
                 f"{store['record_us'] / 1000 / base_ms * 100:.3f}% of a {base_ms:.2f} ms 1-token chat request")
    return "\n".join(lines)


def main(rounds: int, n: int, spends: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        print(f"measuring {BASE}, {OPEN}, {KEYS}, interleaved ...", file=sys.stderr)
        servers = measure(rounds, n, tmp)
        store = capacity(spends, tmp)
    res = {"rounds": rounds, "requests_per_round": n, "warmup": WARMUP, "target_ms": TARGET_MS,
           "servers": servers, "store": store,
           "target_met": servers[KEYS]["vs_base"]["p50_diff_ms"]["median"] <= TARGET_MS}
    print(report(res, rounds, n))
    return res
