"""An OpenAI-compatible server on loopback that misbehaves on purpose, one way per path prefix:
the hostile upstream of tests/test_upstream_hostile.py and scripts/load.py --hostile-upstream.

It runs as its own process (``HostileUpstream``, or ``python tests/hostile_upstream.py``, which
prints its port), so its floods do not share an interpreter with what measures the gateway.
A gateway entry points at ``http://127.0.0.1:PORT/<mode>/v1``. Modes (``MODES``):

- ``embed-flood``: /embeddings answers a JSON vector that never ends;
- ``list-flood``: /models answers a list that never ends; ``list-many``: it lists 100,000
  models (within the gateway's byte bound); ``list-names``: names that must be refused (escape
  codes, ``../``, U+202E, 100 kB) beside two good ones;
- ``chat-flood``: completions stream text chunks without end; ``whole-flood``: a whole JSON
  answer (no stream) that never ends; ``trickle``: a text chunk every 0.2 s, forever;
- ``blank-lines``: a mebibyte of blank lines after another, no event ever; ``empty-data``:
  ``data:`` lines without end; ``keepalive``: a comment line every 50 ms, no event ever;
- ``redirect``: a 307 to ``sink`` (which counts what reaches it: nothing should);
- ``retry-after``: a 429 with a Retry-After of 400 digits;
- ``fail-escapes``: a 502 whose body holds escape codes and a bidi override.

Every other route of a mode answers as a plain server would (its /models lists ``m``).
``GET /stats``: the answers being written now (``open``, by mode), requests by mode, and
``sink`` hits.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from aiohttp import web

MODES = ("embed-flood", "list-flood", "list-many", "list-names", "chat-flood", "whole-flood", "trickle",
         "blank-lines", "empty-data", "keepalive", "redirect", "retry-after", "fail-escapes")
BAD_NAMES = ["\x1b[31mred\x1b[0m", "../../etc/passwd", "a/../b", "back\\slash", "bidi\u202eevil", "x" * 100_000,
             "bell\x07", "iso\u2066late", ""]
GOOD_NAMES = ["good", "org/model:Q4"]
MANY = 100_000
BLOCK = 2**20
FLOOD_TEXT = "flood "  # each chunk's text in chat-flood


def _chunk(text: str) -> bytes:
    body = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(body)}\n\n".encode()


FLOOD = _chunk(FLOOD_TEXT) * (BLOCK // len(_chunk(FLOOD_TEXT)))
LISTS = {
    "list-many": json.dumps({"object": "list", "data": [{"id": f"m{i}"} for i in range(MANY)]},
                            separators=(",", ":")).encode(),
    "list-names": json.dumps({"object": "list", "data": [{"id": n} for n in BAD_NAMES + GOOD_NAMES]}).encode(),
}
PLAIN_LIST = b'{"object": "list", "data": [{"id": "m"}]}'


class Upstream:
    def __init__(self) -> None:
        self.open: collections.Counter[str] = collections.Counter()
        self.requests: collections.Counter[str] = collections.Counter()
        self.sink = 0

    async def endless(self, request: web.Request, mode: str, content_type: str, head: bytes, block: bytes,
                      pause: float = 0.0) -> web.StreamResponse:
        """``head``, then ``block`` after ``block`` until the gateway goes."""
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        self.open[mode] += 1
        try:
            await resp.write(head)
            while True:
                await resp.write(block)
                if pause:
                    await asyncio.sleep(pause)
        except (ConnectionError, RuntimeError):  # the gateway closed the connection: as it should
            pass
        finally:
            self.open[mode] -= 1
        return resp

    async def models(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        self.requests[mode] += 1
        if mode == "list-flood":
            return await self.endless(request, mode, "application/json", b'{"object": "list", "data": [',
                                      b'{"id": "m"},' * (BLOCK // 12))
        if mode == "redirect":
            return self.redirect(request, "models")
        return web.Response(body=LISTS.get(mode, PLAIN_LIST), content_type="application/json")

    def redirect(self, request: web.Request, path: str) -> web.Response:
        return web.Response(status=307, headers={"Location": f"http://{request.host}/sink/v1/{path}"})

    async def post(self, request: web.Request) -> web.StreamResponse:
        mode, path = request.match_info["mode"], request.match_info["path"]
        self.requests[mode] += 1
        if mode == "sink":
            self.sink += 1
            return web.Response(status=500)
        await request.read()
        sse = "text/event-stream"
        if mode == "embed-flood" and path == "embeddings":
            return await self.endless(request, mode, "application/json", b'{"data": [{"index": 0, "embedding": [',
                                      b"0.1," * (BLOCK // 4))
        if mode == "chat-flood":
            return await self.endless(request, mode, sse, b"", FLOOD)
        if mode == "whole-flood":
            return await self.endless(request, mode, "application/json",
                                      b'{"choices": [{"index": 0, "message": {"content": "', b"x" * BLOCK)
        if mode == "trickle":
            return await self.endless(request, mode, sse, b"", _chunk("t"), pause=0.2)
        if mode == "blank-lines":
            return await self.endless(request, mode, sse, b"", b"\n" * BLOCK)
        if mode == "empty-data":
            return await self.endless(request, mode, sse, b"", b"data:\n" * (BLOCK // 6))
        if mode == "keepalive":
            return await self.endless(request, mode, sse, b"", b": ping\n\n", pause=0.05)
        if mode == "redirect":
            return self.redirect(request, path)
        if mode == "retry-after":
            return web.json_response({"error": {"message": "slow down", "code": "rate_limit_exceeded"}}, status=429,
                                     headers={"Retry-After": "9" * 400})
        if mode == "fail-escapes":
            return web.Response(status=502, text="\x1b[2J\x1b]0;owned\x07\u202eboom")
        return web.Response(body=_chunk("fine") + b"data: [DONE]\n\n", content_type=sse)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"open": sum(self.open.values()), "open_by_mode": dict(self.open),
                                  "requests": dict(self.requests), "sink": self.sink})


def app() -> web.Application:
    up = Upstream()
    application = web.Application()
    application.router.add_get("/stats", up.stats)
    application.router.add_get("/{mode}/v1/models", up.models)
    application.router.add_post("/{mode}/v1/{path:.+}", up.post)
    return application


async def serve(port: int) -> None:
    runner = web.AppRunner(app(), access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    await web.SockSite(runner, sock).start()
    print(sock.getsockname()[1], flush=True)
    await asyncio.Event().wait()


class HostileUpstream:
    """The server in a process of its own, for as long as the ``with`` lasts."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.base = f"http://127.0.0.1:{self.port}"

    def url(self, mode: str) -> str:
        return f"{self.base}/{mode}/v1"

    def stats(self) -> dict:
        with urllib.request.urlopen(self.base + "/stats", timeout=10) as r:
            return json.loads(r.read())

    def wait_closed(self, mode: str | None = None, timeout: float = 30.0) -> int:
        """Answers still being written (in ``mode``, or any) once the gateway had ``timeout``
        seconds to close them."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            left = s["open_by_mode"].get(mode, 0) if mode else s["open"]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def __enter__(self) -> HostileUpstream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the gateway's side: its peak memory and /health latency while an attack runs --------------

def peak_rss(pid: int, field: str = "VmHWM") -> int:
    """``pid``'s peak resident bytes (or another /proc/<pid>/status field in kB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak(pid: int) -> int:
    """Start ``pid``'s peak over from what it holds now (Linux's clear_refs); returns that."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return peak_rss(pid, "VmRSS")


class Watch:
    """While the ``with`` lasts: /health asked every ``every`` seconds (its latencies, and the
    answers that failed), and the gateway's peak memory over what it held at the start."""

    def __init__(self, url: str, pid: int, every: float = 0.05):
        self.url, self.pid, self.every = url, pid, every
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
                    r.read()
                self.latencies.append(time.monotonic() - began)
            except OSError:
                self.failures += 1
            self._stop.wait(self.every)

    def __enter__(self) -> Watch:
        self.start = reset_peak(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = peak_rss(self.pid)

    @property
    def grew_mib(self) -> float:
        return (self.peak - self.start) / 2**20

    @property
    def slowest(self) -> float:
        return max(self.latencies, default=float("inf"))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0)
    asyncio.run(serve(p.parse_args().port))
