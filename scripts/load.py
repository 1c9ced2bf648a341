#!/usr/bin/env python3
"""A bounded load and soak run against a gateway on loopback.

    .venv/bin/python scripts/load.py --clients 16 --seconds 300
    .venv/bin/python scripts/load.py --url http://127.0.0.1:8080 --models a,b --seconds 60

Without --url it starts `gguf-gateway serve` on scripted models it writes itself (three
models, so several workers run at once). N clients loop for T seconds over a mix of
OpenAI chat (whole and streamed), text completions and Anthropic messages (streamed),
and some clients disconnect early on purpose. It reports requests done, errors by kind,
lost or truncated streams (a stream that ended without its terminator and was not cut
by us), p50/p95 latency, and the resident memory of the gateway and its workers at
start and end. It only ever talks to the address given (loopback by default) and stops
by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import aiohttp  # noqa: E402

from gateway import testmodels as tm  # noqa: E402


def rss_tree(pid: int) -> int | None:
    """Resident bytes of ``pid`` and its children (Linux /proc); None elsewhere."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, found = 0, False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(entry) == pid or int(fields[1]) == pid:
                with open(f"/proc/{entry}/statm") as f:
                    total += int(f.read().split()[1]) * page
                found = True
        except (OSError, ValueError, IndexError):
            continue
    return total if found else None


class Stats:
    def __init__(self) -> None:
        self.done = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.lost_streams = 0
        self.disconnected = 0
        self.latencies: list[float] = []
        self.by_kind: dict[str, list[float]] = collections.defaultdict(list)


async def one(session: aiohttp.ClientSession, url: str, models: list[str], stats: Stats, rng: random.Random):
    model = rng.choice(models)
    kind = rng.choice(["chat", "chat-stream", "completion-stream", "messages-stream"])
    quit_early = rng.random() < 0.1
    body: dict = {"model": model, "max_tokens": rng.choice([8, 32, 64])}
    if kind.startswith("chat"):
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": "hello"}]
    elif kind.startswith("completion"):
        path, body["prompt"] = "/v1/completions", "Once upon a time\n"
    else:
        path, body["messages"] = "/v1/messages", [{"role": "user", "content": "hello"}]
    stream = kind.endswith("stream")
    body["stream"] = stream
    started = time.monotonic()
    try:
        async with session.post(url + path, json=body) as r:
            if r.status != 200:
                stats.errors[f"http_{r.status}"] += 1
                await r.read()
                return
            if not stream:
                if quit_early:
                    stats.disconnected += 1
                    return  # leaving without reading: the connection closes
                await r.json()
            else:
                terminator = "event: message_stop" if path == "/v1/messages" else "data: [DONE]"
                seen_end, lines = False, 0
                async for raw in r.content:
                    line = raw.decode().strip()
                    lines += 1
                    if line == terminator:
                        seen_end = True
                    if '"error"' in line and line.startswith("data: "):
                        stats.errors["stream_error_event"] += 1
                    if quit_early and lines > 3:
                        stats.disconnected += 1
                        return
                if not seen_end:
                    stats.lost_streams += 1
                    return
        stats.done += 1
        stats.latencies.append(time.monotonic() - started)
        stats.by_kind[f"{kind}/{model}"].append(time.monotonic() - started)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        stats.errors[type(e).__name__] += 1


async def client_loop(url, models, stats, deadline, seed):
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            await one(session, url, models, stats, rng)


async def run(url: str, models: list[str], clients: int, seconds: float, pid: int | None) -> dict:
    stats = Stats()
    rss_start = rss_tree(pid) if pid else None
    deadline = time.monotonic() + seconds
    samples = []

    async def sample_memory():
        while time.monotonic() < deadline:
            await asyncio.sleep(min(30, seconds / 4))
            if pid:
                samples.append(rss_tree(pid))

    await asyncio.gather(sample_memory(), *(client_loop(url, models, stats, deadline, i) for i in range(clients)))
    lat = sorted(stats.latencies)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None  # noqa: E731
    return {
        "clients": clients, "seconds": seconds, "requests_done": stats.done,
        "requests_per_second": round(stats.done / seconds, 1),
        "deliberate_disconnects": stats.disconnected, "errors": dict(stats.errors),
        "errors_5xx": sum(v for k, v in stats.errors.items() if k.startswith("http_5")),
        "lost_or_truncated_streams": stats.lost_streams,
        "latency_p50_s": round(pct(0.5), 4) if lat else None, "latency_p95_s": round(pct(0.95), 4) if lat else None,
        "latency_mean_s": round(statistics.fmean(lat), 4) if lat else None,
        "latency_p95_s_by_kind": {k: round(sorted(v)[int(0.95 * len(v))], 4) for k, v in sorted(stats.by_kind.items())},
        "rss_start_mib": round(rss_start / 2**20, 1) if rss_start else None,
        "rss_samples_mib": [round(s / 2**20, 1) for s in samples if s],
        "rss_end_mib": round(rss_tree(pid) / 2**20, 1) if pid and rss_tree(pid) else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running gateway (default: start one on scripted models)")
    p.add_argument("--models", help="comma-separated model names (with --url)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--threads", type=int, help="n_threads for each scripted model (default: the gateway's)")
    p.add_argument("--json", type=Path, help="write the report here too")
    p.add_argument("--server-log", type=Path, help="write the started gateway's log here")
    args = p.parse_args(argv)
    if args.url:
        host = args.url.split("//", 1)[-1].split(":")[0].split("/")[0]
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]") and not host.startswith("127."):
            p.error("--url must be a loopback address")
        report = asyncio.run(run(args.url, args.models.split(","), args.clients, args.seconds, None))
    else:
        from helpers import ServerProcess

        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
            tm.thinking(d / "thinker.gguf", "Let me think about it.", "The answer is 4.")
            tm.endless(d / "loop.gguf", [" tick", " tock"])
            cfg = d / "models.yaml"
            threads = f"\n    n_threads: {args.threads}" if args.threads else ""
            cfg.write_text("server:\n  discover_default_stores: false\nmodels:\n" + "".join(
                f"  {m}:\n    path: {d}/{m}.gguf{threads}\n" for m in ("plain", "thinker", "loop")))
            with ServerProcess("--config", str(cfg), "--log-level", "warning", env={"HOME": tmp}) as srv:
                for m in ("plain", "thinker", "loop"):  # load all three before measuring memory
                    srv.get("/health")
                    import urllib.request

                    urllib.request.urlopen(urllib.request.Request(
                        srv.url + "/models/load", data=json.dumps({"model": m}).encode())).read()
                report = asyncio.run(run(srv.url, ["plain", "thinker", "loop"], args.clients, args.seconds,
                                         srv.proc.pid))
                code, log = srv.stop()
                report["server_exit_code"] = code
                report["server_tracebacks"] = log.count("Traceback")
                if args.server_log:
                    args.server_log.write_text(log)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    ok = report["errors_5xx"] == 0 and report["lost_or_truncated_streams"] == 0 and \
        not report.get("server_tracebacks")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
