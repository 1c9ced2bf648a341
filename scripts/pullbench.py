"""`scripts/bench.py --pull`: pulling a model from a loopback hub, against curl.

A Hugging Face hub and its CDN are served on loopback by the tests' own `hubserver.Hub` (the
real routes and headers, the file from disk). Each round, interleaved:
- curl: `curl -sSL -o FILE URL` of the file's CDN link, the bytes alone;
- gateway: a running `gguf-gateway serve` pulls `hf.co/bench/Bench-GGUF` (the listing, the
  file's metadata, the bytes with their SHA-256 checked, the snapshot's link, the catalog's
  rescan), asked with `"stream": false`: no progress told to anyone;
- gateway + progress: the same pull streamed, every progress line read by the caller;
then the pulled model is deleted (`/models/delete`) for the next round. Reported: each one's
median seconds and MB/s, the gateway's throughput as a ratio to curl's (median and the spread of
the rounds' ratios), the progress lines' cost as the streamed pull's time over the silent one's,
and how many lines a pull streams.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import free_port

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

NAME = "hf.co/bench/Bench-GGUF"


def _post(port: int, path: str, body: dict) -> tuple[int, bytes, int]:
    """Status, body, and the lines it held (a streamed answer's count)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    lines, chunks = 0, []
    while line := resp.readline():
        lines += 1
        chunks.append(line)
    conn.close()
    return resp.status, b"".join(chunks), lines


def _wait(port: int, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("the gateway exited")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("the gateway did not start")


def main(model: Path, rounds: int) -> dict:
    from hubserver import Hub

    if not shutil.which("curl"):
        raise SystemExit("curl is not on PATH")
    size = model.stat().st_size
    with Hub() as hub, tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        hub.add_hf_repo("bench/Bench-GGUF", {"bench-Q4_K_M.gguf": model})
        from hashlib import sha256
        digest = sha256(model.read_bytes()).hexdigest()
        url = hub.cdn_link(digest)
        (tmp / "models.yaml").write_text("server:\n  pull_keep_free_bytes: 0\n")
        port = free_port()
        env = {**os.environ, "HOME": str(tmp), "HF_HOME": str(tmp / "hf"), "HF_ENDPOINT": hub.url,
               "HF_HUB_DISABLE_XET": "1", "OLLAMA_MODELS": str(tmp / "ollama")}
        env.pop("HF_HUB_CACHE", None)
        env.pop("HF_HUB_OFFLINE", None)
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--port", str(port), "--config",
                                 str(tmp / "models.yaml"), "--log-level", "warning"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times: dict[str, list[float]] = {"curl": [], "gateway": [], "gateway + progress": []}
        lines: list[int] = []
        try:
            _wait(port, proc)
            for r in range(rounds):
                print(f"  round {r + 1}/{rounds} ...", file=sys.stderr)
                out = tmp / "curl.gguf"
                t = time.perf_counter()
                subprocess.run(["curl", "-sSL", "-o", str(out), url], check=True)
                times["curl"].append(time.perf_counter() - t)
                out.unlink()
                for label, stream in (("gateway", False), ("gateway + progress", True)):
                    t = time.perf_counter()
                    status, body, n = _post(port, "/models/pull", {"model": NAME, "stream": stream})
                    times[label].append(time.perf_counter() - t)
                    if status != 200 or b"success" not in body:
                        raise RuntimeError(f"the pull failed: {status} {body[-300:]!r}")
                    if stream:
                        lines.append(n)
                    status, body, _ = _post(port, "/models/delete", {"model": NAME})
                    if status != 200:
                        raise RuntimeError(f"the delete failed: {status} {body[-300:]!r}")
        finally:
            proc.terminate()
            proc.wait(30)
    ratios = [times["curl"][i] / times["gateway"][i] for i in range(rounds)]
    progress = [times["gateway + progress"][i] / times["gateway"][i] for i in range(rounds)]
    result = {"bytes": size, "rounds": rounds, "seconds": times,
              "mb_per_second": {k: size / 1e6 / statistics.median(v) for k, v in times.items()},
              "throughput_vs_curl": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
              "progress_cost": {"median": statistics.median(progress), "min": min(progress), "max": max(progress)},
              "progress_lines": statistics.median(lines)}
    print(f"\npull of {size / 1e6:.1f} MB from a loopback hub, {rounds} rounds (medians)")
    for k, v in times.items():
        print(f"  {k:20s} {statistics.median(v):7.3f} s  {result['mb_per_second'][k]:8.1f} MB/s")
    t = result["throughput_vs_curl"]
    print(f"  gateway throughput / curl's: {t['median']:.2f}x (rounds {t['min']:.2f}-{t['max']:.2f})")
    c = result["progress_cost"]
    print(f"  streamed progress ({result['progress_lines']:.0f} lines) / silent pull time: {c['median']:.3f}x "
          f"(rounds {c['min']:.3f}-{c['max']:.3f})")
    return result
