"""`scripts/bench.py --observe`: what captures and OpenTelemetry traces cost a request.

Four gateways on the tiny scripted model (`benchlib.tiny_model()`: its decode costs microseconds,
the rest is the gateway), each bench.py's gateway (4 slots of 4096 tokens, its own process and
worker, its own HOME and state folder, no OTEL_* variables), differing only in models.yaml's
`server:`:
- off: neither feature (the default);
- off again: the same (an A/A pair with off): what two identical gateways differ by here;
- capture: `capture: true` (each request and its answer kept in memory, the defaults' bounds);
- tracing: `otel: {endpoint: SINK, sampler: always_on}` (every request's trace exported over
  OTLP/HTTP protobuf by the SDK's batch processor at its defaults) to a sink in this process:
  a threaded `http.server` on loopback answering each `POST /v1/traces` 200 with an empty
  `application/x-protobuf` body, counting the exports and their bytes (their spans decoded only
  after the gateways have stopped, which flushes what they still held).
Each round runs every gateway in turn, the order rotating each round, on connections new that
round:
- (a) 1-token chat: `POST /v1/chat/completions` ("Hi", `max_tokens: 1`, greedy) one at a time over
  one kept-alive connection, ROUND_WARMUP first, then N timed: the p50 and p95;
- (b) 4-stream aggregate: 4 clients, each sending streamed chat completions of T tokens
  (`ignore_eos: true`, as bench.py's throughput figures; the scripted answer then goes on with
  `<unk>`s) one after another on its own connection for S seconds (each finishing the stream it
  is in): completion tokens (the streams' `usage`) a second, all 4 together.
WARMUP 1-token chats and one group of 4 streams warm each gateway first. Reported against "off":
the median over rounds of the per-round p50 difference (ms) and ratio, and of the per-round
aggregate ratio, each with its spread [min..max]; the targets (tracing at most 0.2 ms and 2%,
capture at most 0.1 ms and 1%) read against those medians, beside the A/A pair's own spread. The
tracing gateway's traces (root spans) are counted in the sink against the requests it was sent,
the capture gateway's captures by their highest id (ids count every capture made): a run where
the sink got nothing is invalid and fails (so does one whose capture gateway captured nothing).
Spans still queued when the tracing gateway's turn ends are exported up to 5 s later (the SDK's
schedule), possibly in another's turn; the sink's reading of them runs in this process, beside
the clients. Nothing is asserted on the figures.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from benchlib import Server, interleaved, tiny_model

WARMUP = 30
ROUND_WARMUP = 5  # on each round's new connection
STREAMS = 4
MODEL = "bench"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0}
OFF, AA, CAPTURE, TRACING = "off", "off again", "capture", "tracing"
TARGETS = {CAPTURE: (0.1, 0.01), TRACING: (0.2, 0.02)}  # p50 ms over off, share of the aggregate lost
KEEP_BODIES = 512 * 2**20  # export bodies kept for counting their spans at the end


class Sink:
    """An OTLP/HTTP traces sink on loopback: every export answered 200, counted, kept to decode."""

    def __init__(self) -> None:
        self.requests = self.bytes = 0
        self.bodies: list[bytes] = []
        self.kept = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the exporter keeps its connection, as with a collector

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = self.headers.get("Content-Encoding", "").lower()
                sink.requests += 1
                sink.bytes += len(body)
                if self.path == "/v1/traces" and sink.kept < KEEP_BODIES:
                    sink.bodies.append(gzip.decompress(body) if encoding == "gzip" else
                                       zlib.decompress(body) if encoding == "deflate" else body)
                    sink.kept += len(body)
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> dict:
        """The exports' spans, and their roots (one a traced request), decoded now."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans = roots = 0
        for body in self.bodies:
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    spans += len(ss.spans)
                    roots += sum(1 for s in ss.spans if not s.parent_span_id)
        return {"requests": self.requests, "bytes": self.bytes, "spans": spans, "traces": roots,
                "decoded_all": self.kept >= self.bytes}


def chat(srv: Server, conn, body: dict) -> bytes:
    status, data = srv.request("POST", "/v1/chat/completions", {"model": srv.model_name, **body}, conn)
    if status != 200:
        raise SystemExit(f"{srv.name}: HTTP {status}: {data[:300]!r}")
    return data


def latencies(srv: Server, n: int, sent: dict) -> dict:
    """``n`` 1-token chats one at a time on a new kept-alive connection (ROUND_WARMUP first)."""
    conn = srv.connect()
    for _ in range(ROUND_WARMUP):
        chat(srv, conn, CHAT)
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        chat(srv, conn, CHAT)
        lat.append((time.perf_counter() - t0) * 1000)
    conn.close()
    sent[srv.name] += ROUND_WARMUP + n
    lat.sort()
    return {"p50_ms": lat[len(lat) // 2], "p95_ms": lat[min(len(lat) - 1, int(len(lat) * 0.95))]}


def stream_tokens(srv: Server, conn, tokens: int) -> int:
    """One streamed chat of ``tokens`` tokens, read whole: its completion tokens (its ``usage``)."""
    data = chat(srv, conn, {**CHAT, "max_tokens": tokens, "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}})
    for line in reversed(data.splitlines()):
        if line.startswith(b"data: {") and b'"usage"' in line:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                return usage["completion_tokens"]
    raise SystemExit(f"{srv.name}: a stream without usage: {data[-300:]!r}")


def aggregate(srv: Server, seconds: float, tokens: int, sent: dict) -> float:
    """Completion tokens a second of STREAMS clients streaming one after another for ``seconds``."""
    counts, made, failed = [0] * STREAMS, [0] * STREAMS, []
    stop = time.perf_counter() + seconds

    def client(k: int) -> None:
        try:
            conn = srv.connect()
            while True:
                counts[k] += stream_tokens(srv, conn, tokens)
                made[k] += 1
                if time.perf_counter() >= stop:
                    break
            conn.close()
        except BaseException as exc:  # noqa: BLE001 (SystemExit too: a thread would drop it silently)
            failed.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(STREAMS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    sent[srv.name] += sum(made)
    if failed:
        raise SystemExit(f"{srv.name}: a stream client failed: {failed[0]}")
    return sum(counts) / elapsed


def captured(srv: Server, sent: int) -> dict:
    """What a gateway captured: the highest id among its newest captures counts every capture
    made (ids are given in order; the store lists them as they finish, which a stream's last bytes
    may precede a moment: asked again for up to 5 s until every request sent is there)."""
    deadline = time.monotonic() + 5
    while True:
        status, data = srv.request("GET", "/captures?limit=1000")
        if status != 200:
            raise SystemExit(f"{srv.name}: /captures: HTTP {status}: {data[:300]!r}")
        body = json.loads(data)
        made = max((int(r["id"].rsplit("-", 1)[1]) for r in body["data"]), default=0)
        if made >= sent or time.monotonic() > deadline or not body["enabled"]:
            return {"enabled": body["enabled"], "made": made, "held": body["count"], "bytes": body["bytes"],
                    "sent": sent}
        time.sleep(0.1)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(rounds: int, n: int, seconds: float, tokens: int, tmp: Path,
            gateway: Callable[[Path, Path, str, str], Server]) -> dict:
    """``gateway(model, home, label, server_yaml)``: bench.py's gateway on that model, named
    ``label``, HOME ``home``, with ``server_yaml`` (lines indented two spaces) under ``server:``."""
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError:
        raise SystemExit("--observe: the tracing gateway needs the otel extra: pip install -e '.[otel]'") from None
    out: dict = {"rounds": rounds, "requests": n, "seconds": seconds, "tokens": tokens, "streams": STREAMS,
                 "warmup": WARMUP, "round_warmup": ROUND_WARMUP, "servers": {}}
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(Sink())  # entered first: it outlives the gateways, which flush as they stop
        yaml = {OFF: "", AA: "", CAPTURE: "  capture: true\n",
                TRACING: f"  otel: {{endpoint: \"{sink.url}\", sampler: always_on}}\n"}
        servers = []
        for label, extra in yaml.items():
            home = tmp / label.replace(" ", "-")
            home.mkdir()
            srv = gateway(tiny_model(), home, label, extra)
            srv.env = {k: v for k, v in (srv.env or os.environ).items() if not k.startswith("OTEL_")}
            servers.append(stack.enter_context(srv))
        sent = {s.name: 0 for s in servers}
        for srv in servers:
            conn = srv.connect()
            for _ in range(WARMUP):
                chat(srv, conn, CHAT)
            conn.close()
            sent[srv.name] += WARMUP
            aggregate(srv, 0, tokens, sent)
        print(f"  {rounds} rounds: {n} 1-token chats, then {STREAMS} streams of {tokens} tokens for {seconds:g} s, "
              "per gateway ...", file=sys.stderr)
        runs = interleaved(servers, rounds, lambda s, r: {**latencies(s, n, sent),
                                                          "aggregate_tok_s": aggregate(s, seconds, tokens, sent)})
        out["captured"] = captured(servers[2], sent[CAPTURE])
        off_captured = captured(servers[0], 0)
        if off_captured["enabled"] or off_captured["made"]:
            raise SystemExit(f"{OFF}: captures on ({off_captured})")
    out["exports"] = {**sink.spans(), "sent": sent[TRACING]}  # every gateway stopped: the spans all flushed
    for srv in servers:
        per = {k: [x[k] for x in runs[srv.name]] for k in ("p50_ms", "p95_ms", "aggregate_tok_s")}
        out["servers"][srv.name] = {"rounds": per, **{k: statistics.median(v) for k, v in per.items()},
                                    "sent": sent[srv.name]}
    base = out["servers"][OFF]["rounds"]
    for name in (AA, CAPTURE, TRACING):
        mine = out["servers"][name]["rounds"]
        out["servers"][name]["vs_off"] = {
            "p50_diff_ms": spread([a - b for a, b in zip(mine["p50_ms"], base["p50_ms"])]),
            "p50_ratio": spread([a / b for a, b in zip(mine["p50_ms"], base["p50_ms"])]),
            "aggregate_ratio": spread([a / b for a, b in zip(mine["aggregate_tok_s"], base["aggregate_tok_s"])])}
    out["targets"] = {}
    for name, (ms, share) in TARGETS.items():
        vs = out["servers"][name]["vs_off"]
        out["targets"][name] = {"p50_ms": ms, "aggregate_share": share,
                                "p50_met": vs["p50_diff_ms"]["median"] <= ms,
                                "aggregate_met": vs["aggregate_ratio"]["median"] >= 1 - share}
    out["valid"] = out["exports"]["requests"] > 0 and out["exports"]["traces"] > 0 and out["captured"]["made"] > 0
    return out


def report(res: dict) -> str:
    s = res["servers"]
    lines = [f"\ncaptures and traces on the tiny scripted model, {len(s)} gateways, {res['rounds']} interleaved "
             "rounds; medians over rounds; against \"off\": median of the per-round differences and ratios "
             "[min..max]",
             f"(a) 1-token chat, one at a time on a kept-alive connection: {res['requests']} a gateway and round "
             f"(after {res['warmup']} to warm up)",
             f"(b) {res['streams']} concurrent streams of {res['tokens']} tokens (ignore_eos) one after another for "
             f"{res['seconds']:g} s a gateway and round: completion tokens/s, all {res['streams']} together"]
    w = 10
    lines.append(f"| {'gateway':<{w}} | {'p50 ms':>7} | {'p95 ms':>7} | {'p50 - off, ms':>27} | {'p50 / off':>22} | "
                 f"{'aggregate tok/s':>15} | {'aggregate / off':>22} |")
    lines.append(f"|{'-' * (w + 2)}|{'-' * 9}|{'-' * 9}|{'-' * 29}|{'-' * 24}|{'-' * 17}|{'-' * 24}|")
    for name, x in s.items():
        diff = ratio = agg = ""
        if "vs_off" in x:
            d, r, a = (x["vs_off"][k] for k in ("p50_diff_ms", "p50_ratio", "aggregate_ratio"))
            diff = f"{d['median']:+.3f} [{d['min']:+.3f}..{d['max']:+.3f}]"
            ratio = f"{r['median']:.3f}x [{r['min']:.3f}..{r['max']:.3f}]"
            agg = f"{a['median']:.3f}x [{a['min']:.3f}..{a['max']:.3f}]"
        lines.append(f"| {name:<{w}} | {x['p50_ms']:7.3f} | {x['p95_ms']:7.3f} | {diff:>27} | {ratio:>22} | "
                     f"{x['aggregate_tok_s']:15.0f} | {agg:>22} |")
    aa = s[AA]["vs_off"]
    lines.append(f"A/A, two identical gateways: p50 {aa['p50_diff_ms']['median']:+.3f} ms "
                 f"[{aa['p50_diff_ms']['min']:+.3f}..{aa['p50_diff_ms']['max']:+.3f}], aggregate "
                 f"{aa['aggregate_ratio']['median']:.3f}x [{aa['aggregate_ratio']['min']:.3f}.."
                 f"{aa['aggregate_ratio']['max']:.3f}]: differences of that size are this machine's noise")
    for name, t in res["targets"].items():
        vs = s[name]["vs_off"]
        lines.append(f"target, {name} at most {t['p50_ms']} ms p50 and {t['aggregate_share']:.0%} of the aggregate: "
                     f"p50 {'MET' if t['p50_met'] else 'NOT MET'} ({vs['p50_diff_ms']['median']:+.3f} ms), aggregate "
                     f"{'MET' if t['aggregate_met'] else 'NOT MET'} ({vs['aggregate_ratio']['median'] - 1:+.1%})")
    e, c = res["exports"], res["captured"]
    lines.append(f"exported: {e['spans']} spans in {e['requests']} OTLP requests ({e['bytes'] / 1024:.0f} KiB) to the "
                 f"sink, traces of {e['traces']} of the {e['sent']} requests sent to {TRACING}"
                 + ("" if e["decoded_all"] else " (only the first exports decoded)"))
    lines.append(f"captured: {c['made']} of the {c['sent']} requests sent to {CAPTURE} (the store holds {c['held']}, "
                 f"{c['bytes'] / 2**20:.1f} MiB)")
    if not res["valid"]:
        lines.append("INVALID: " + ("the sink received no spans: the tracing gateway exported nothing"
                                    if not e["traces"] else "the capture gateway captured nothing"))
    return "\n".join(lines)


def main(rounds: int, n: int, seconds: float, tokens: int, tmp: Path,
         gateway: Callable[[Path, Path, str, str], Server]) -> dict:
    print(f"measuring {OFF}, {AA}, {CAPTURE}, {TRACING}, interleaved ...", file=sys.stderr)
    res = measure(rounds, n, seconds, tokens, tmp, gateway)
    print(report(res))
    return res
