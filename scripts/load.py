#!/usr/bin/env python3
"""A bounded load and soak run against a gateway on loopback.

    .venv/bin/python scripts/load.py --clients 16 --seconds 300
    .venv/bin/python scripts/load.py --url http://127.0.0.1:8080 --models a,b --seconds 60 [--api-key KEY]
    .venv/bin/python scripts/load.py --hostile --clients 16 --seconds 60 --stalled 4 --idle 200

Without --url it starts `gguf-gateway serve` on scripted models it writes itself (three
models, so several workers run at once). N clients loop for T seconds over a mix of
OpenAI chat (whole and streamed), text completions and Anthropic messages (streamed),
and some clients disconnect early on purpose. It reports requests done, errors by kind,
lost or truncated streams (a stream that ended without its terminator and was not cut
by us), p50/p95 latency, and the resident memory of the gateway and its workers at
start and end. It only ever talks to the address given (loopback by default) and stops
by itself.

Usage under load: the gateway it starts records usage as a gateway does by default (no keys: as
key `anonymous`, to usage.db in its state folder, here in the run's temp dir); with --url,
--api-key is sent on every request (`Authorization: Bearer`). After the run it reads
`/usage?group=hour` (with that key; the figures are what the run added to what was there before
it) until the count settles, and reports the requests the gateway recorded, per wire and per
second of the run, beside the normal clients' requests: all of them are to routes that spend
(chat, completions, messages), and the gateway records every one it let in, whether it finished,
failed or its client left. The check `usage_counts_every_request`: recorded at least the clients'
requests that got their answer (those read to the end, and those the client cut early on purpose)
and at most every request they started; in --hostile and --hostile-upstream modes the upper
bound adds every hostile request sent to a spending route (each stalled reader's, each idle
socket's that names one), since those count too. With --url the usage may hold other callers'
requests made meanwhile: reported, and judged only where /usage could be read.

--hostile (only with the gateway it starts: it needs its scripted models and short connection
limits, and reads the server's sockets from /proc) runs hostile actors beside the same normal
clients until the same deadline: stalled readers (a streamed answer never read, on a 4 KiB
receive buffer), idle and slow sockets (silent, partial headers, a header line a second, a
chunked body that never ends), and a few clients looping over request bodies the gateway
must refuse (or, for grammars that finish at once, answer with finish_reason "stop"). The
normal clients' figures stay apart from theirs. The exit code is 0 only when every check in
the report's "checks" passes: no 5xx and no lost stream for normal requests, no server
traceback, no worker failure, RSS at the end within --rss-bound-mib of the start, and in
hostile mode no hostile request answered other than expected and every stalled or idle
socket closed by the server in time.

--hostile also serves what a stranger's files do (issue 50): a models folder holding hostile
GGUF headers (a tensor in layer 150,000,000, a block_count of 40,000,000, tens of KiB of
unclosed `{{`, a template past its bound), models whose chat templates run away (an integer
folded at compile time, loops whose output floods, a list that hoards memory), and a vision and
an audio model that hostile clients send pictures and sounds whose headers lie or claim too much
(a padded JPEG and a CgBI PNG of 16000x16000, sixteen legal 7680x4320 PNGs in one request, an
MP3 of 17 minutes of silence, an MP3 whose Xing header claims hours). Its clients list and
describe the hostile models (/models, /metrics, Ollama's /api/show) and ask them to answer.
Meanwhile /health is asked every 100 ms; the checks hold its latency, the gateway's peak memory
growth and every worker's peak memory (VmHWM) within --health-p99-ms / --health-max-ms,
--gateway-peak-mib and --worker-peak-mib.

--hostile's gateway also holds keys (issue 64): the normal clients go as an admin, the hostile
bodies as a user. Beside them: a key scoped to one model asks for names that resolve outside its
scope (the tag fallback, an adapter's name, over every wire and /api/show and /props: each a 404);
a key with a token budget reads streams part way and drops them (what was made is charged: the key
is refused once past its budget, and /usage holds at least what its streams read); keyless
requests with a flood of long headers (a 401, and never kept as a capture); model names of
megabytes with traces on and the collector down (a 404 of bounded size); and names of a loopback
host the caller chose for an on-demand pull (refused, the host never connected to).

--hostile-upstream (also only with the gateway it starts; with --hostile or alone) starts a
loopback server that misbehaves as an upstream in each way we have seen one do harm (tests/hostile_upstream.py:
endless embeddings, model lists and answers, a trickle, blank lines, empty data lines, keep-alive
comments, a redirect, a Retry-After of 400 digits, escape codes in errors, hostile model names),
serves it through one models.yaml entry per way, and runs --upstream-clients clients looping over
requests to them, each answered only as expected. Meanwhile /health is asked every 100 ms and the
gateway process's peak memory (VmHWM, reset at the start) is read at the end: the checks hold them
within --health-p99-ms / --health-max-ms and --upstream-peak-mib, and after the run no upstream
answer is still being read and no redirect was followed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import aiohttp  # noqa: E402
from hostile_upstream import FLOOD_TEXT, HostileUpstream, Watch, peak_rss, reset_peak  # noqa: E402

from gateway.backends import upstream_wire as wire  # noqa: E402
from gateway.models import testmodels as tm  # noqa: E402
from gateway.protocol import GenerationRequest  # noqa: E402


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
        self.started = 0  # requests sent (every one to a route that spends: chat, completions, messages)
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
    stats.started += 1
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


async def client_loop(url, models, stats, deadline, seed, headers=None):
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        while time.monotonic() < deadline:
            await one(session, url, models, stats, rng)


# --- hostile mode ---------------------------------------------------------------------------------
# The gateway started for --hostile holds keys: the normal clients go as an admin, the hostile bodies
# as a user, the scope names as a key limited to one model, the dropped streams as a key with a
# budget; each secret made afresh for the run.
KEYS = {who: f"sk-load-{who}-{os.urandom(12).hex()}" for who in ("admin", "user", "scoped", "budget")}
SCOPED_TO = "*lain"  # the scoped key's models: `plain` alone
BUDGET_TOKENS = 50  # the budget key's tokens a day; a dropped stream spends more than that


def bearer(who: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"} if who else {}


def keys_config() -> str:
    """``server.api_keys`` for KEYS, as models.yaml lines."""
    return ("  api_keys:\n"
            f"    load-admin: {{key: {KEYS['admin']}, role: admin}}\n"
            f"    load-user: {{key: {KEYS['user']}, role: user}}\n"
            f"    load-scoped: {{key: {KEYS['scoped']}, models: ['{SCOPED_TO}']}}\n"
            f"    load-budget: {{key: {KEYS['budget']}, models: [loop], budget: {BUDGET_TOKENS}, "
            "budget_period: day}\n")


# Short server limits, so a short run reaches each of them many times (max_connections is set
# above every socket the run opens: no normal client is ever refused).
HOSTILE_LIMITS = {"write_timeout": 2, "header_timeout": 2, "keepalive_timeout": 5, "body_timeout": 5}
# A stalled reader: a 4 KiB receive buffer, and a small MSS. On loopback (64 KiB segments) the
# server's send buffer otherwise grows to tcp_wmem's maximum (4 MiB, ~25,000 streamed tokens, more
# than a busy run generates in its seconds) before any write stalls; with 536-byte segments it
# stays near 100 KB, as for a slow client far away. The answer (16,000 tokens, ~2.6 MB) must not
# fit in what the server buffers, or it is sent whole and nothing stalls.
STALL_RCVBUF = 4096
STALL_MSS = 536
STALL_MAX_TOKENS = 16000
LOOP_N_CTX = 16384
HI = [{"role": "user", "content": "hi"}]
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


@dataclass(frozen=True)
class Hostile:
    """A hostile request body and the answers right for it; ``body(n)`` makes the n-th one sent
    (bytes, headers)."""

    name: str
    path: str
    body: Callable[[int], tuple[bytes, dict]]
    expect: frozenset[str]  # statuses that are right
    finishes: bool = False  # a 200 must end cleanly with finish_reason "stop"
    method: str = "POST"  # a GET sends no body
    key: str | None = "user"  # the key it is sent with (``KEYS``), None: none
    max_answer: int | None = None  # an answer longer than this many bytes is unexpected ("404_long")


def _json(body: dict) -> tuple[bytes, dict]:
    return json.dumps(body).encode(), {}


def _grammar(path: str, grammar: str) -> Callable[[int], tuple[bytes, dict]]:
    # every other one streamed: both ways of answering must end the answer, not the worker
    def body(n: int):
        rest = {"messages": HI} if path == CHAT else {"prompt": "go\n"}
        return _json({"model": "loop", "grammar": grammar, "ignore_eos": True, "stream": n % 2 == 1, **rest})
    return body


def _unknown_keys(n: int):
    # unique names on every body: nothing a request names may be kept (interned, cached)
    body = {f"k{n}_{i}": 1 for i in range(50_000)}
    return _json({**body, "model": "plain", "prompt": "x", "max_tokens": 1})


_PLAIN_CHAT = json.dumps({"model": "plain", "messages": HI}).encode()
HOSTILE: tuple[Hostile, ...] = (
    Hostile("grammar_a/chat", CHAT, _grammar(CHAT, 'root ::= "a"'), frozenset({"200"}), True),
    Hostile("grammar_a/completions", TEXT, _grammar(TEXT, 'root ::= "a"'), frozenset({"200"}), True),
    Hostile("grammar_x00/chat", CHAT, _grammar(CHAT, "root ::= [\\x00]"), frozenset({"200"}), True),
    Hostile("grammar_x00/completions", TEXT, _grammar(TEXT, "root ::= [\\x00]"), frozenset({"200"}), True),
    Hostile("lone_surrogate/chat", CHAT, lambda n: (
        b'{"model": "plain", "messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 3}', {}),
        frozenset({"400"})),
    Hostile("lone_surrogate/completions", TEXT, lambda n: (
        b'{"model": "plain", "prompt": "\\ud800", "max_tokens": 3}', {}), frozenset({"400"})),
    Hostile("nested_100000", CHAT, lambda n: (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}),
            frozenset({"400"})),
    Hostile("number_5000_digits", TEXT, lambda n: (
        b'{"model": "plain", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", {}), frozenset({"400"})),
    Hostile("repeat_penalty_1e400", CHAT, lambda n: _json({"model": "plain", "messages": HI,
                                                         "repeat_penalty": 10 ** 400}), frozenset({"400"})),
    Hostile("prompt_400kb/completions", TEXT, lambda n: _json({"model": "plain", "prompt": "y" * 400_000}),
            frozenset({"400"})),
    Hostile("prompt_400kb/chat", CHAT, lambda n: _json({
        "model": "plain", "messages": [{"role": "user", "content": "x" * 400_000}]}), frozenset({"400"})),
    Hostile("stop_300000_chars", TEXT, lambda n: _json({"model": "loop", "prompt": "go\n", "stop": ["x" * 300_000]}),
            frozenset({"400"})),
    # the gateway ignores (and logs) unknown keys: the request itself is fine
    Hostile("unknown_keys_50000", TEXT, _unknown_keys, frozenset({"200"})),
    Hostile("template_kwargs_self", CHAT, lambda n: _json({"model": "plain", "messages": HI,
                                                         "chat_template_kwargs": {"self": 1}}), frozenset({"400"})),
    Hostile("gzip_not_compressed", CHAT, lambda n: (_PLAIN_CHAT, {"Content-Encoding": "gzip"}), frozenset({"400"})),
    Hostile("content_encoding_br", CHAT, lambda n: (_PLAIN_CHAT, {"Content-Encoding": "br"}), frozenset({"415"})),
)

# Idle and slow sockets: (first bytes, bytes sent again every DRIP_SECONDS, the answer expected
# before the server closes it: "none" is a close without a word).
IDLE_MODES = {
    "silent": (b"", b"", "none"),
    "partial_headers": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n", b"", "none"),
    "slowloris": (b"GET /health HTTP/1.1\r\nHost: localhost\r\n", b"X-Slow: 1\r\n", "none"),
    "endless_body": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                     b"Authorization: Bearer " + KEYS["user"].encode() + b"\r\n"
                     b"Content-Type: application/json\r\n\r\n5\r\n{\"a\":\r\n", b"1\r\n \r\n", "408"),
}
# --- hostile files: model files, templates, pictures and sounds from strangers (issue 50) -------------
STRANGERS = ("deep-layer", "huge-blocks", "unclosed-braces", "long-template")  # GGUF headers, by stem
TEMPLATE_BOMBS = {  # a model -> its chat template, each stopped by the render's bounds (a 500)
    "t-power": "{{ 9**(9**9) }}",  # folded at compile time, in one C call holding the GIL
    "t-flood": "{% set s = 'x' * 20000 %}{% for a in s %}{% for b in s %}{{ s }}{% endfor %}{% endfor %}",
    "t-hoard": "{% set ns = namespace(l=[]) %}{% set s = 'x' * 1000000 %}{% for i in range(100000) %}"
               "{% set _ = ns.l.append(s[1:]) %}{% endfor %}",
}
MEDIA_MODELS = ("vl", "ear")  # a vision and an audio model: a random model with a random projector


def write_hostile_files(d: Path) -> list[str]:
    """The strangers' model files under ``d`` (discovered from ``d/strangers`` and ``d/media``);
    the models.yaml entries of the template bombs."""
    import shutil

    import hostilegguf as hg
    from helpers import tiny_projector, tiny_random_model

    from gateway.models.ggufmeta import MAX_TEMPLATE_BYTES

    folder = d / "strangers"
    folder.mkdir()
    hg.deep_layer_index(folder / "deep-layer.gguf")
    hg.huge_block_count(folder / "huge-blocks.gguf")
    hg.unclosed_template(folder / "unclosed-braces.gguf")
    hg.unclosed_template(folder / "long-template.gguf", size=MAX_TEMPLATE_BYTES + 1)
    for model in MEDIA_MODELS:
        (d / "media" / model).mkdir(parents=True)
        shutil.copy(tiny_random_model("qwen2", seed=1), d / "media" / model / f"{model}.gguf")
        (d / "media" / model / f"mmproj-{model}-f16.gguf").symlink_to(tiny_projector(64, audio=model == "ear"))
    for name, template in TEMPLATE_BOMBS.items():
        tm.plain(d / f"{name}.gguf", chat_template=template)
    return [f"  {name}: {d}/{name}.gguf\n" for name in TEMPLATE_BOMBS]


def _media(model: str, parts: list[tuple[str, bytes]]) -> Callable[[int], tuple[bytes, dict]]:
    """A chat request to ``model`` with pictures (``png``, ``jpeg``) and sounds (``mp3``), each sent
    as base64 in its part; the body is made once."""
    import base64

    content: list[dict] = [{"type": "text", "text": "What is it?"}]
    for kind, data in parts:
        b64 = base64.b64encode(data).decode()
        content.append({"type": "input_audio", "input_audio": {"data": b64, "format": kind}} if kind == "mp3" else
                       {"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{b64}"}})
    body = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}).encode()
    return lambda n: (body, {})


def _legal_8k_png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (7680, 4320), (40, 120, 200)).save(out, format="PNG")
    return out.getvalue()


def hostile_file_kinds() -> tuple[Hostile, ...]:
    """The requests that reach the strangers' files, each with the answers right for it."""
    import hostile_media as hm

    big = _legal_8k_png()
    ok, refused, failed, template = frozenset({"200"}), frozenset({"400"}), frozenset({"503"}), frozenset({"500"})
    return (
        Hostile("files/models", "/models", lambda n: (b"", {}), ok, method="GET"),
        Hostile("files/metrics", "/metrics", lambda n: (b"", {}), ok, method="GET", key="admin"),  # an admin's
        Hostile("files/tags", "/api/tags", lambda n: (b"", {}), ok, method="GET"),
        *(Hostile(f"files/show/{m}", "/api/show", lambda n, m=m: _json({"model": m}), ok) for m in STRANGERS),
        *(Hostile(f"files/chat/{m}", CHAT, lambda n, m=m: _json({"model": m, "messages": HI}), failed)
          for m in STRANGERS),
        *(Hostile(f"files/template/{m}", CHAT, lambda n, m=m: _json({"model": m, "messages": HI}), template)
          for m in TEMPLATE_BOMBS),
        Hostile("files/jpeg_padded_16000", CHAT, _media("vl", [("jpeg", hm.jpeg(16000, 16000, padding=b"\x00"))]),
                refused),
        Hostile("files/png_cgbi_16000", CHAT, _media("vl", [("png", hm.png(16000, 16000, cgbi=True))]), refused),
        Hostile("files/png_8k_x16", CHAT, _media("vl", [("png", big)] * 16), refused),
        Hostile("files/png_8k_x2", CHAT, _media("vl", [("png", big)] * 2), ok),  # legal: decoded one at a time
        Hostile("files/mp3_silence_1000s", CHAT, _media("ear", [("mp3", hm.silent_mp3(1000))]), refused),
        Hostile("files/mp3_xing_hours", CHAT, _media("ear", [("mp3", hm.xing_mp3(1 << 20))]), refused),
    )


# --- keys, budgets, captures, traces and on-demand pulls (issue 64) ---------------------------------
LONG_NAME_CHARS = 2 * 2**20  # a model name of 2 MiB: a span or a 404 that keeps it whole grows by that
FLOOD_HEADERS, FLOOD_HEADER_BYTES = 60, 1024  # a keyless request's header block: kept whole by a capture
ANSWER_BOUND = 8192  # bytes an error answer quoting a caller's name may take
DROP_AFTER_FRAMES = 20  # a budget key's stream is read this far, then dropped
ON_DEMAND_HOSTS = ("hf.co",)  # the registries a name may be pulled from on demand: HF_ENDPOINT is a closed port


def round_five_kinds(foreign_port: int) -> tuple[Hostile, ...]:
    """This round's hostile requests: names a scoped key may not reach (the tag fallback, an
    adapter's name, every route that takes a name), keyless requests with a flood of headers,
    model names of megabytes (traces on), and names of a host the caller picked for an on-demand
    pull (``foreign_port``: a loopback listener that must never see a connection)."""
    out_of_scope = "loop:x-plain"  # no model has it; the tag fallback would serve `loop`, outside the scope
    flood = {f"X-Flood-{i}": "f" * FLOOD_HEADER_BYTES for i in range(FLOOD_HEADERS)}
    long_name = "m" * LONG_NAME_CHARS
    missing = frozenset({"404"})
    scoped = [
        Hostile("scope/chat_tag_fallback", CHAT, lambda n: _json({"model": out_of_scope, "messages": HI}), missing),
        Hostile("scope/chat_adapter_name", CHAT, lambda n: _json({"model": "thinker:zzz", "messages": HI}), missing),
        Hostile("scope/messages", "/v1/messages", lambda n: _json({"model": out_of_scope, "max_tokens": 4,
                                                                   "messages": HI}), missing),
        Hostile("scope/responses", "/v1/responses", lambda n: _json({"model": out_of_scope, "input": "hi"}), missing),
        Hostile("scope/ollama_show", "/api/show", lambda n: _json({"model": out_of_scope}), missing),
        Hostile("scope/ollama_chat", "/api/chat", lambda n: _json({"model": out_of_scope, "messages": HI,
                                                                   "stream": False}), missing),
        Hostile("scope/props", "/props?model=" + urllib.parse.quote(out_of_scope), lambda n: (b"", {}), missing,
                method="GET"),
    ]
    return (
        *(Hostile(k.name, k.path, k.body, k.expect, method=k.method, key="scoped", max_answer=ANSWER_BOUND)
          for k in scoped),
        Hostile("captures/keyless_header_flood", CHAT, lambda n: (_PLAIN_CHAT, flood), frozenset({"401"}), key=None),
        Hostile("traces/long_model_name", CHAT, lambda n: _json({"model": long_name, "messages": HI}),
                frozenset({"404", "400"}), max_answer=ANSWER_BOUND),
        *(Hostile(f"pull/foreign_host_{i}", CHAT, lambda n, host=host: _json({
            "model": f"{host}:{foreign_port}/ns/m:latest", "messages": HI}), frozenset({"404", "400"}),
            max_answer=ANSWER_BOUND) for i, host in enumerate(("127.0.0.1", "localhost"))),
    )


class ForeignHost:
    """A loopback port a request may name as a registry: it listens and never accepts, so the
    kernel completes (and keeps in the backlog) any connection the gateway makes; ``reached``
    counts them at the end."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]

    def reached(self) -> int:
        self.sock.setblocking(False)
        n = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, OSError):
                return n
            conn.close()
            n += 1

    def __enter__(self) -> ForeignHost:
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


async def budget_dropper(url: str, hs: HostileStats, deadline: float) -> None:
    """The budget key's streams, each read DROP_AFTER_FRAMES frames in and dropped: what was made
    is charged, so the key is refused (429) once past its budget."""
    body = {"model": "loop", "messages": HI, "max_tokens": 120, "stream": True}
    counts = hs.budget
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), headers=bearer("budget")) as session:
        while time.monotonic() < deadline:
            counts["sent"] += 1
            try:
                async with session.post(url + CHAT, json=body) as r:
                    if r.status == 429:
                        counts["refused_429"] += 1
                        await r.read()
                        await asyncio.sleep(0.5)
                        continue
                    if r.status != 200:
                        hs.unexpected["budget/dropped_stream"][str(r.status)] += 1
                        await r.read()
                        continue
                    frames = 0
                    async for raw in r.content:
                        if raw.startswith(b"data: {"):
                            frames += 1
                            if frames >= DROP_AFTER_FRAMES:
                                break
                    counts["frames_read"] += frames
                    counts["dropped"] += 1
                    r.close()  # the connection goes, mid-answer
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                hs.unexpected["budget/dropped_stream"][type(e).__name__] += 1


async def budget_usage(url: str) -> dict:
    """The budget key's recorded tokens, as /usage answers an admin."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=bearer("admin")) as session:
        async with session.get(url + "/usage", params={"key": "load-budget", "group": "hour"}) as r:
            body = await r.json(content_type=None)
    rows = body.get("data") or ()
    return {"requests": sum(r["requests"] for r in rows), "tokens": sum(r["total_tokens"] for r in rows)}


async def round_five_report(url: str, hs: HostileStats, foreign: ForeignHost | None) -> dict:
    """What this round's checks read: the budget key's charge beside what its streams read, and
    whether anything connected to the foreign host."""
    charged = {}
    for _ in range(int(USAGE_SETTLE_SECONDS * 2)):  # a dropped stream is charged once the gateway sees it go
        charged = await budget_usage(url)
        if charged["tokens"] >= hs.budget["frames_read"]:
            break
        await asyncio.sleep(0.5)
    return {"budget": {**{k: hs.budget[k] for k in ("sent", "dropped", "frames_read", "refused_429")},
                       "budget_tokens": BUDGET_TOKENS, "charged": charged},
            "foreign_host_connections": foreign.reached() if foreign is not None else None}


def worker_peaks(url: str) -> dict[str, float]:
    """Each loaded local model's worker's peak resident memory (VmHWM), in MiB, by model."""
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url + "/models", headers=bearer("admin")), timeout=30) as r:
        rows = json.loads(r.read())["data"]
    out = {}
    for row in rows:
        if row.get("pid"):
            with contextlib.suppress(OSError, KeyError):
                out[row["id"]] = round(peak_rss(row["pid"]) / 2**20, 1)
    return out


def reset_worker_peaks(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url + "/models", headers=bearer("admin")), timeout=30) as r:
        for row in json.loads(r.read())["data"]:
            if row.get("pid"):
                with contextlib.suppress(OSError, KeyError):
                    reset_peak(row["pid"])


DRIP_SECONDS = 1.0  # under header_timeout, so each slow socket does send again before its close
SLACK_SECONDS = 3.0  # the server's sweep runs once a second; the rest is for a busy 2-core machine


@dataclass(frozen=True)
class HostileOptions:
    stalled: int = 4
    idle: int = 200
    clients: int = 2
    worker_peak_mib: float = 768.0  # each worker's peak (VmHWM): one 8K picture decoded is about 200 MiB
    limits: dict = field(default_factory=lambda: dict(HOSTILE_LIMITS))
    kinds: tuple[Hostile, ...] = HOSTILE  # with the hostile files' (``hostile_file_kinds``) in a full run
    files: bool = False  # the strangers' model files are served (``write_hostile_files``)

    def idle_bound(self, mode: str) -> float:
        """Seconds an idle socket in ``mode`` may stay open: its timeouts and a slack. A chunked body
        that never ends gets its 408 at body_timeout, and the connection then waits out
        keepalive_timeout (or header_timeout once more bytes come)."""
        lim = self.limits
        if mode == "endless_body":
            return lim["body_timeout"] + max(lim["keepalive_timeout"], lim["header_timeout"]) + SLACK_SECONDS
        return lim["header_timeout"] + SLACK_SECONDS

    @property
    def stall_bound(self) -> float:
        """Seconds a stalled reader may stay open after its answer began: filling the server's
        buffers (~100 KB of tokens, which a busy model takes a while to make), then write_timeout."""
        return self.limits["write_timeout"] + 10


class HostileStats:
    def __init__(self) -> None:
        self.sent: collections.Counter[str] = collections.Counter()
        self.statuses: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.unexpected: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.stalled: collections.Counter[str] = collections.Counter()
        self.stalled_seconds: list[float] = []  # from an answer's first bytes to the server's close
        self.idle: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.idle_seconds: dict[str, list[float]] = collections.defaultdict(list)
        self.serial = itertools.count()  # numbers each hostile body, for unique field names
        self.budget: collections.Counter[str] = collections.Counter()  # the budget key's streams (``budget_dropper``)


def answer_status(answer: bytes) -> str:
    if not answer:
        return "none"
    return answer[9:12].decode("latin-1") if answer.startswith(b"HTTP/1.") else "not_http"


def ended_cleanly(content_type: str, text: str) -> bool:
    """A 200 answer that ends as a finished one must: finish_reason "stop", and [DONE] when streamed."""
    if "text/event-stream" in content_type:
        return '"finish_reason":"stop"' in text and text.rstrip().endswith("data: [DONE]")
    try:
        return json.loads(text)["choices"][0]["finish_reason"] == "stop"
    except (ValueError, KeyError, IndexError, TypeError):
        return False


async def hostile_request(session: aiohttp.ClientSession, url: str, kind: Hostile, hs: HostileStats) -> None:
    data, headers = kind.body(next(hs.serial))
    hs.sent[kind.name] += 1
    try:
        async with session.request(kind.method, url + kind.path, data=data if kind.method == "POST" else None,
                                   headers={"Content-Type": "application/json", **bearer(kind.key), **headers}) as r:
            raw = await r.read()
            text = raw.decode("utf-8", "replace")
            status = str(r.status)
            if r.status == 200 and kind.finishes and not ended_cleanly(r.content_type, text):
                status = "200_unclean"
            if kind.max_answer is not None and len(raw) > kind.max_answer:
                status += "_long"
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        status = type(e).__name__
    hs.statuses[kind.name][status] += 1
    if status not in kind.expect:
        hs.unexpected[kind.name][status] += 1


async def hostile_client(url: str, hs: HostileStats, deadline: float, offset: int,
                         kinds: tuple[Hostile, ...] = HOSTILE) -> None:
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i in itertools.count(offset):  # each client starts elsewhere in the list
            if time.monotonic() >= deadline:
                return
            await hostile_request(session, url, kinds[i % len(kinds)], hs)


def established_server_side(port: int) -> set[int]:
    """Client ports whose connection to ``port`` is ESTABLISHED on the server's side (Linux)."""
    suffix, ports = f":{port:04X}", set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split(None, 4)  # sl, local address, remote address, state, ...
            if parts[1].endswith(suffix) and parts[3] == "01":
                ports.add(int(parts[2].rsplit(":", 1)[1], 16))
    return ports


class ServerSide:
    """Which connections the server still holds, as the kernel sees its sockets. A stalled reader
    must not read, so it cannot see the server's close: the FIN waits behind the unread answer.
    The server's socket leaving ESTABLISHED (FIN_WAIT1, with that answer still queued) is the close.
    One read of /proc/net/tcp serves every reader for POLL_SECONDS."""

    POLL_SECONDS = 0.25

    def __init__(self, port: int):
        self.port, self._at, self._ports = port, float("-inf"), set()

    def holds(self, client_port: int, since: float) -> bool:
        """Whether the server holds the connection from ``client_port``, open since ``since``
        (a snapshot older than that cannot know it)."""
        now = time.monotonic()
        if now - self._at >= self.POLL_SECONDS or self._at < since:
            self._ports, self._at = established_server_side(self.port), now
        return client_port in self._ports


async def raw_connection(host: str, port: int, rcvbuf: int | None = None, mss: int | None = None):
    """Asyncio streams on a socket of our own. ``rcvbuf`` and ``mss`` are set before connecting:
    the receive window (and its scale) and the segment size are agreed in the handshake."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if mss:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        return await asyncio.open_connection(sock=sock, limit=rcvbuf or 2**16)
    except BaseException:
        sock.close()
        raise


async def drain(reader: asyncio.StreamReader) -> bytes:
    """Read to the end; the last bytes."""
    tail = b""
    while chunk := await reader.read(2**16):
        tail = (tail + chunk)[-64:]
    return tail


async def stalled_reader(host: str, port: int, opts: HostileOptions, hs: HostileStats, server: ServerSide) -> None:
    body = json.dumps({"model": "loop", "prompt": "go\n", "max_tokens": STALL_MAX_TOKENS, "stream": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
               b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s" % (KEYS["user"].encode(), len(body), body))
    while True:
        try:
            reader, writer = await raw_connection(host, port, STALL_RCVBUF, STALL_MSS)
        except OSError:
            hs.stalled["connect_errors"] += 1
            await asyncio.sleep(0.5)
            continue
        hs.stalled["opened"] += 1
        since = None
        try:
            writer.write(request)
            status = answer_status(await reader.readexactly(12))
            if status != "200":
                hs.unexpected["stalled_reader"][status] += 1
                await asyncio.sleep(0.5)
                continue
            # From here nothing is read (asyncio would otherwise take what comes, up to its limit).
            writer.transport.pause_reading()
            since = time.monotonic()
            client_port = writer.get_extra_info("sockname")[1]
            while server.holds(client_port, since):
                await asyncio.sleep(ServerSide.POLL_SECONDS)
            seconds, since = time.monotonic() - since, None
            hs.stalled_seconds.append(seconds)
            hs.stalled["closed_by_server"] += 1
            if seconds > opts.stall_bound:
                hs.stalled["overstayed"] += 1
            # What the kernel still held comes, then the end: [DONE] in it means the whole answer
            # fitted in the buffers and the close was keep-alive's, not write_timeout's.
            writer.transport.resume_reading()
            try:
                tail = await asyncio.wait_for(drain(reader), 10)
                hs.stalled["closed_after_whole_answer" if b"data: [DONE]" in tail else "closed_mid_answer"] += 1
            except ConnectionError:
                hs.stalled["closed_mid_answer"] += 1
            except asyncio.TimeoutError:
                hs.stalled["undrained"] += 1
        except asyncio.CancelledError:  # the deadline
            if since is not None:
                late = time.monotonic() - since > opts.stall_bound
                hs.stalled["overstayed" if late else "open_at_deadline"] += 1
            raise
        except (OSError, asyncio.IncompleteReadError) as e:
            hs.unexpected["stalled_reader"][type(e).__name__] += 1
            await asyncio.sleep(0.5)
        finally:
            writer.close()


async def drip(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        while True:
            await asyncio.sleep(DRIP_SECONDS)
            writer.write(data)
            await writer.drain()
    except OSError:
        pass  # closed on it, as it should be


async def idle_socket(host: str, port: int, mode: str, opts: HostileOptions, hs: HostileStats,
                      delay: float = 0.0) -> None:
    first, again, expect = IDLE_MODES[mode]
    counts, bound = hs.idle[mode], opts.idle_bound(mode)
    await asyncio.sleep(delay)  # not all at once: the listen backlog is 128
    while True:
        try:
            reader, writer = await raw_connection(host, port)
        except OSError:
            counts["connect_errors"] += 1
            await asyncio.sleep(0.5)
            continue
        counts["opened"] += 1
        opened, dripping = time.monotonic(), None
        try:
            if first:
                writer.write(first)
            if again:
                dripping = asyncio.ensure_future(drip(writer, again))
            answer = b""
            try:  # whatever the server says, up to its close; a reset (the server closed with our
                # drip unread) keeps what had already arrived
                while chunk := await reader.read(65536):
                    answer += chunk
            except ConnectionError:
                pass
            seconds = time.monotonic() - opened
            counts["closed_by_server"] += 1
            hs.idle_seconds[mode].append(seconds)
            if seconds > bound:
                counts["overstayed"] += 1
            if answer_status(answer) != expect:
                hs.unexpected[f"idle/{mode}"][answer_status(answer)] += 1
        except asyncio.CancelledError:  # the deadline
            counts["overstayed" if time.monotonic() - opened > bound else "open_at_deadline"] += 1
            raise
        finally:
            if dripping is not None:
                dripping.cancel()
            writer.close()


async def until(deadline: float, coro) -> None:
    """Run ``coro`` (an endless actor) and cancel it at ``deadline``: it stops by itself."""
    try:
        await asyncio.wait_for(coro, max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        pass


def hostile_actors(url: str, opts: HostileOptions, hs: HostileStats, deadline: float) -> list:
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname, parts.port
    server = ServerSide(port)
    modes = list(IDLE_MODES)
    return [
        *(hostile_client(url, hs, deadline, i * 5, opts.kinds) for i in range(opts.clients)),
        budget_dropper(url, hs, deadline),
        *(until(deadline, stalled_reader(host, port, opts, hs, server)) for _ in range(opts.stalled)),
        *(until(deadline, idle_socket(host, port, modes[i % len(modes)], opts, hs, i * 0.005))
          for i in range(opts.idle)),
    ]


def seconds_summary(values: list[float]) -> dict:
    v = sorted(values)
    return {"p50": round(v[len(v) // 2], 2), "max": round(v[-1], 2)} if v else {}


def hostile_report(hs: HostileStats, opts: HostileOptions) -> dict:
    idle_totals: collections.Counter[str] = collections.Counter()
    for counts in hs.idle.values():
        idle_totals.update(counts)
    unexpected = {k: dict(v) for k, v in sorted(hs.unexpected.items()) if v}
    return {
        "hostile_limits": opts.limits,
        "hostile_clients": opts.clients,
        "hostile_sent": dict(sorted(hs.sent.items())),
        "hostile_statuses": {k: dict(v) for k, v in sorted(hs.statuses.items())},
        "hostile_expected": {k.name: sorted(k.expect) for k in opts.kinds},
        "hostile_unexpected": unexpected,
        "hostile_5xx": sum(n for v in hs.unexpected.values() for s, n in v.items() if s.startswith("5")),
        "stalled_readers": {
            "sockets": opts.stalled,
            **{k: hs.stalled[k] for k in ("opened", "closed_by_server", "closed_mid_answer",
                                          "closed_after_whole_answer", "undrained", "open_at_deadline",
                                          "overstayed", "connect_errors")},
            "seconds_to_close": seconds_summary(hs.stalled_seconds),
            "bound_s": opts.stall_bound,
        },
        "idle_sockets": {
            "sockets": opts.idle,
            **{k: idle_totals[k] for k in ("opened", "closed_by_server", "open_at_deadline", "overstayed",
                                           "connect_errors")},
            "by_mode": {mode: {**dict(hs.idle[mode]), "seconds_open": seconds_summary(hs.idle_seconds[mode]),
                               "bound_s": opts.idle_bound(mode), "expected_answer": IDLE_MODES[mode][2]}
                        for mode in IDLE_MODES},
        },
    }


# --- hostile-upstream mode -----------------------------------------------------------------------
UPSTREAM_REQUEST_TIMEOUT = 6  # server.request_timeout in this mode: it ends a trickling answer
UPSTREAM_TIMEOUTS = "{first_byte: 3, idle: 3}"  # each hostile entry's: bytes without an event end here
UPSTREAM_MODES = ("embed-flood", "chat-flood", "whole-flood", "trickle", "blank-lines", "empty-data", "keepalive",
                  "redirect", "retry-after", "fail-escapes")
UPSTREAM_LISTS = ("list-flood", "list-many", "list-names")
UNSAFE = ("\x1b", "\x07", "\u202e")
GONE_AFTER_LINES = 3  # a streamed client that leaves reads this many lines first


@dataclass(frozen=True)
class UpstreamKind:
    """A request to one hostile entry and the outcomes right for it: ``judge`` reads the answer
    (status, headers, text) into an outcome name; ``leaves``: a streamed client that goes early."""

    name: str
    path: str
    body: dict | None  # None: a GET
    expect: frozenset[str]
    judge: Callable[[int, dict, str], str] | None = None
    leaves: bool = False


def _status(status: int, headers: dict, text: str) -> str:
    return str(status)


def _length_within(chars: int) -> Callable[[int, dict, str], str]:
    """A whole chat answer that ends with "length", its text at most ``chars`` long."""
    def judge(status: int, headers: dict, text: str) -> str:
        if status != 200:
            return str(status)
        choice = json.loads(text)["choices"][0]
        ok = choice["finish_reason"] == "length" and len(choice["message"]["content"] or "") <= chars
        return "200" if ok else "200_unbounded"
    return judge


def _retry_after(status: int, headers: dict, text: str) -> str:
    seconds = headers.get("Retry-After", "")
    return str(status) if seconds.isdigit() and int(seconds) <= wire.MAX_RETRY_AFTER else f"{status}_bad_retry_after"


def _escaped(status: int, headers: dict, text: str) -> str:
    return f"{status}_raw_escapes" if any(c in text for c in UNSAFE) else str(status)


def _listing(status: int, headers: dict, text: str) -> str:
    """/v1/models with the hostile lists in it: each list within MAX_LISTED, the endless one
    not taken, every name printable and free of '..'."""
    if status != 200:
        return str(status)
    ids = [m["id"] for m in json.loads(text)["data"]]
    by_list = collections.Counter(i.split("/", 1)[0] for i in ids if "/" in i)
    ok = all(i.isprintable() and ".." not in i.split("/") and len(i) < 300 for i in ids) and \
        by_list["list-flood"] == 0 and all(by_list[m] <= wire.MAX_LISTED for m in UPSTREAM_LISTS)
    return "200" if ok else "200_bad_listing"


ASK = [{"role": "user", "content": "hi"}]
GONE_OR_TIMED_OUT = frozenset({"502", "503", "504"})  # a timeout marks the upstream down: 503 until its probe
UPSTREAM_KINDS: tuple[UpstreamKind, ...] = (
    UpstreamKind("embed-flood", "/v1/embeddings", {"model": "embed-flood", "input": ["x"] * 4}, frozenset({"502"})),
    UpstreamKind("models", "/v1/models", None, frozenset({"200"}), _listing),
    UpstreamKind("chat-flood/max_tokens", CHAT, {"model": "chat-flood", "messages": ASK, "max_tokens": 32},
                 frozenset({"200"}), _length_within(wire.answer_bounds(GenerationRequest(max_tokens=32)).chunks
                                                    * len(FLOOD_TEXT))),
    UpstreamKind("chat-flood/unbounded", CHAT, {"model": "chat-flood", "messages": ASK}, frozenset({"200"}),
                 _length_within(wire.MAX_ANSWER_BYTES)),
    UpstreamKind("chat-flood/leaves", CHAT, {"model": "chat-flood", "messages": ASK, "stream": True},
                 frozenset({"left"}), leaves=True),
    UpstreamKind("whole-flood", CHAT, {"model": "whole-flood", "messages": ASK}, frozenset({"502"})),
    UpstreamKind("trickle", CHAT, {"model": "trickle", "messages": ASK}, frozenset({"200"}),
                 _length_within(wire.MAX_ANSWER_BYTES)),
    UpstreamKind("blank-lines", CHAT, {"model": "blank-lines", "messages": ASK, "stream": True}, GONE_OR_TIMED_OUT),
    UpstreamKind("empty-data", CHAT, {"model": "empty-data", "messages": ASK}, GONE_OR_TIMED_OUT),
    UpstreamKind("keepalive", CHAT, {"model": "keepalive", "messages": ASK, "stream": True},
                 frozenset({"503", "504"})),
    UpstreamKind("redirect/chat", CHAT, {"model": "redirect", "messages": ASK}, frozenset({"502"})),
    UpstreamKind("redirect/embeddings", "/v1/embeddings", {"model": "redirect", "input": "secret"},
                 frozenset({"502"})),
    UpstreamKind("retry-after", CHAT, {"model": "retry-after", "messages": ASK}, frozenset({"429"}), _retry_after),
    UpstreamKind("fail-escapes", CHAT, {"model": "fail-escapes", "messages": ASK}, frozenset({"503"}), _escaped),
)


@dataclass(frozen=True)
class UpstreamOptions:
    clients: int = len(UPSTREAM_KINDS)
    health_p99_ms: float = 500.0
    health_max_ms: float = 1500.0
    peak_mib: float = 200.0


async def upstream_request(session: aiohttp.ClientSession, url: str, kind: UpstreamKind, hs: HostileStats) -> None:
    hs.sent[kind.name] += 1
    try:
        async with session.request("GET" if kind.body is None else "POST", url + kind.path, json=kind.body) as r:
            if kind.leaves and r.status == 200:
                for _ in range(GONE_AFTER_LINES):
                    await r.content.readline()
                outcome = "left"  # leaving the ``async with`` closes the connection mid-answer
            else:
                outcome = (kind.judge or _status)(r.status, dict(r.headers), await r.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
        outcome = type(e).__name__
    hs.statuses[kind.name][outcome] += 1
    if outcome not in kind.expect:
        hs.unexpected[f"upstream/{kind.name}"][outcome] += 1


async def upstream_client(url: str, hs: HostileStats, deadline: float, offset: int,
                          headers: dict | None = None) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), headers=headers) as session:
        for i in itertools.count(offset):  # each client starts elsewhere in the list
            if time.monotonic() >= deadline:
                return
            await upstream_request(session, url, UPSTREAM_KINDS[i % len(UPSTREAM_KINDS)], hs)


def upstream_entries(upstream) -> str:
    """models.yaml entries: one per hostile way, named after it; the lists discovered under it."""
    return "".join(f'  {m}: {{upstream: "{upstream.url(m)}", model: m, timeouts: {UPSTREAM_TIMEOUTS}}}\n'
                   for m in UPSTREAM_MODES) + "".join(
        f'  {m}: {{upstream: "{upstream.url(m)}", upstream_discover: true, prefix: "{m}/"}}\n' for m in UPSTREAM_LISTS)


def percentile(values: list[float], q: float) -> float | None:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else None


def watch_report(watch, opts: UpstreamOptions) -> dict:
    """/health's latency and the gateway's peak memory over the run, with their bounds."""
    ms = [x * 1000 for x in watch.latencies]
    return {
        "health_latency_ms": {"n": len(ms), "failures": watch.failures,
                              **{k: round(percentile(ms, q) or 0, 1) for k, q in (("p50", 0.5), ("p99", 0.99),
                                                                                  ("max", 1.0))},
                              "p99_bound": opts.health_p99_ms, "max_bound": opts.health_max_ms},
        "gateway_rss_start_mib": round(watch.start / 2**20, 1),
        "gateway_peak_mib": round(watch.peak / 2**20, 1),
        "gateway_peak_growth_mib": round(watch.grew_mib, 1),
        "gateway_peak_bound_mib": opts.peak_mib,
    }


def upstream_report(hs: HostileStats, opts: UpstreamOptions, upstream) -> dict:
    names = {k.name for k in UPSTREAM_KINDS}
    return {
        "upstream_clients": opts.clients,
        "upstream_sent": {k: v for k, v in sorted(hs.sent.items()) if k in names},
        "upstream_statuses": {k: dict(v) for k, v in sorted(hs.statuses.items()) if k in names},
        "upstream_expected": {k.name: sorted(k.expect) for k in UPSTREAM_KINDS},
        "upstream_unexpected": {k: dict(v) for k, v in sorted(hs.unexpected.items()) if k.startswith("upstream/")},
        # answers the hostile upstream was still writing 5 s after the run (the gateway still reading them)
        "upstream_still_read": upstream.wait_closed(timeout=5.0),
        "upstream_redirects_followed": upstream.stats()["sink"],
    }


# --- usage under load ----------------------------------------------------------------------------
# The routes that spend tokens (marked ``spends`` for the access middleware): the gateway records
# each request to one of them that it let in, once the request named a model.
SPENDING_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses",
                            "/v1/embeddings", "/v1/fim/completions", "/infill", "/v1/rerank", "/rerank",
                            "/v1/reranking", "/reranking", "/api/chat", "/api/generate", "/api/embed",
                            "/api/embeddings"})
USAGE_SETTLE_SECONDS = 15.0  # how long the count may take to stop growing after the run


async def read_usage(url: str, headers: dict | None) -> dict:
    """``/usage?group=hour`` summed over its rows: requests, per wire, and whether it is written to
    its file; ``{"error": ...}`` where it cannot be read."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=headers) as session:
            async with session.get(url + "/usage", params={"group": "hour"}) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    return {"error": f"HTTP {r.status}: {json.dumps(body)[:300]}"}
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    by_wire: collections.Counter[str] = collections.Counter()
    for row in body.get("data") or ():
        by_wire[row["wire"]] += row["requests"]
    return {"requests": sum(by_wire.values()), "by_wire": dict(by_wire), "recording": body.get("recording"),
            "reason": body.get("reason")}


async def settled_usage(url: str, headers: dict | None, at_least: int) -> tuple[dict, float]:
    """/usage once its count stopped growing (two reads half a second apart agree) and holds at
    least ``at_least``, or after USAGE_SETTLE_SECONDS: a request whose client left is recorded
    when the gateway sees it go, which may be a moment after the run. With the seconds it took."""
    start, previous = time.monotonic(), None
    while True:
        now = await read_usage(url, headers)
        if "error" in now:
            return now, time.monotonic() - start
        if previous is not None and now["requests"] == previous["requests"] and now["requests"] >= at_least:
            return now, time.monotonic() - start
        if time.monotonic() - start > USAGE_SETTLE_SECONDS:
            return now, time.monotonic() - start
        previous = now
        await asyncio.sleep(0.5)


def _names_spending_route(first: bytes) -> bool:
    parts = first.split(b" ", 2)
    return len(parts) > 1 and parts[1].decode("latin-1") in SPENDING_PATHS


def hostile_spending_sent(hs: HostileStats, hostile: HostileOptions | None, upstream: UpstreamOptions | None) -> int:
    """Requests the hostile actors sent to routes that spend: each may be recorded (it is, where
    the gateway let it in and it named a model), so the most usage may hold past the normal ones."""
    n = 0
    if hostile is not None:
        n += sum(hs.sent[k.name] for k in hostile.kinds if k.method == "POST" and k.path in SPENDING_PATHS)
        n += hs.budget["sent"]  # the budget key's streams
        n += hs.stalled["opened"]  # one streamed completion per connection
        n += sum(hs.idle[mode]["opened"] for mode, (first, _, _) in IDLE_MODES.items() if _names_spending_route(first))
    if upstream is not None:
        n += sum(hs.sent[k.name] for k in UPSTREAM_KINDS if k.body is not None and k.path in SPENDING_PATHS)
    return n


def usage_report(before: dict, after: dict, settle_s: float, stats: Stats, elapsed: float, hostile_sent: int,
                 hostile: bool) -> dict:
    """What the gateway recorded during the run, beside what the clients sent and got answered."""
    answered = stats.done + stats.disconnected  # read to the end, or cut early by the client on purpose
    out = {"normal_started": stats.started, "normal_done": stats.done, "normal_cut_early": stats.disconnected,
           "normal_answered": answered, "hostile_spending_sent": hostile_sent if hostile else None,
           "at_least": answered, "at_most": stats.started + hostile_sent}
    if "error" in before or "error" in after:
        return {**out, "error": before.get("error") or after.get("error")}
    recorded = after["requests"] - before["requests"]
    wires = {w: n - before["by_wire"].get(w, 0) for w, n in sorted(after["by_wire"].items())}
    return {"recording": after["recording"], "reason": after["reason"], "recorded_requests": recorded,
            "recorded_by_wire": {w: n for w, n in wires.items() if n},
            "recorded_per_second": round(recorded / elapsed, 1) if elapsed > 0 else None,
            "run_seconds": round(elapsed, 2), **out, "settle_seconds": round(settle_s, 2)}


async def worker_failures(url: str, headers: dict | None = None) -> int | None:
    """/health's count of worker failures (with keys, told only to a key: ``headers``)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10), headers=headers) as session:
            async with session.get(url + "/health") as r:
                return (await r.json()).get("worker_failures")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def run(url: str, models: list[str], clients: int, seconds: float, pid: int | None,
              hostile: HostileOptions | None = None, upstream=None,
              upstream_opts: UpstreamOptions | None = None, bounds: UpstreamOptions | None = None,
              api_key: str | None = None, foreign: ForeignHost | None = None) -> dict:
    stats, hs = Stats(), HostileStats()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    usage_before = await read_usage(url, headers)
    rss_start = rss_tree(pid) if pid else None
    began = time.monotonic()
    deadline = began + seconds
    samples = []

    async def sample_memory():
        while time.monotonic() < deadline:
            await asyncio.sleep(min(30, seconds / 4))
            if pid:
                samples.append(rss_tree(pid))

    actors = hostile_actors(url, hostile, hs, deadline) if hostile else []
    if upstream_opts is not None:
        actors += [upstream_client(url, hs, deadline, i, headers) for i in range(upstream_opts.clients)]
    watched = upstream_opts is not None or (hostile is not None and hostile.files)
    watch = Watch(url, pid, every=0.1) if watched and pid else None
    if hostile is not None and hostile.files:
        reset_worker_peaks(url)
    with watch or contextlib.nullcontext():
        await asyncio.gather(sample_memory(), *(client_loop(url, models, stats, deadline, i, headers)
                                                for i in range(clients)), *actors)
    elapsed = time.monotonic() - began
    at_least = usage_before.get("requests", 0) + stats.done + stats.disconnected
    usage_after, settle_s = await settled_usage(url, headers, at_least)
    rss_end = rss_tree(pid) if pid else None
    lat = sorted(stats.latencies)
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None  # noqa: E731
    report = {
        "hostile": hostile is not None,
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
        "rss_end_mib": round(rss_end / 2**20, 1) if rss_end else None,
        "worker_failures": await worker_failures(url, headers),
        "usage": usage_report(usage_before, usage_after, settle_s, stats, elapsed,
                              hostile_spending_sent(hs, hostile, upstream_opts), hostile is not None or
                              upstream_opts is not None),
    }
    if hostile:
        report.update(hostile_report(hs, hostile))
        report.update(await round_five_report(url, hs, foreign))
    report["hostile_upstream"] = upstream_opts is not None and watch is not None
    if watch is not None:
        report.update(watch_report(watch, bounds or upstream_opts or UpstreamOptions()))
    if report["hostile_upstream"] and upstream_opts is not None:
        report.update(upstream_report(hs, upstream_opts, upstream))
    if hostile is not None and hostile.files:
        report["worker_peak_mib"] = worker_peaks(url)
        report["worker_peak_bound_mib"] = hostile.worker_peak_mib
    return report


def checks(report: dict, rss_bound_mib: float, own_server: bool) -> dict[str, bool]:
    """What must hold for the exit code to be 0; each by name, so a failure says which."""
    start, end = report["rss_start_mib"], report["rss_end_mib"]
    out = {
        "normal_no_5xx": report["errors_5xx"] == 0,
        "normal_no_lost_streams": report["lost_or_truncated_streams"] == 0,
        "no_server_tracebacks": not report.get("server_tracebacks"),
        # a gateway we did not start may have had failures before this run: reported, not judged
        "no_worker_failures": report["worker_failures"] == 0 or (not own_server and report["worker_failures"] is None),
        "rss_bound_ok": start is None or end is None or end <= start + rss_bound_mib,
        # nothing lost, nothing counted twice: see the module's docstring; a gateway we did not
        # start may not let this key read /usage (reported, not judged)
        "usage_counts_every_request": _usage_ok(report["usage"], own_server),
    }
    if "health_latency_ms" in report:
        health = report["health_latency_ms"]
        out.update({
            "health_latency_ok": health["n"] > 0 and not health["failures"] and
            health["p99"] <= health["p99_bound"] and health["max"] <= health["max_bound"],
            "gateway_peak_ok": report["gateway_peak_growth_mib"] <= report["gateway_peak_bound_mib"],
        })
    if report.get("hostile_upstream"):
        out.update({
            "upstream_all_as_expected": not report["upstream_unexpected"],
            "upstream_reads_end": report["upstream_still_read"] == 0,
            "upstream_redirects_not_followed": report["upstream_redirects_followed"] == 0,
        })
    if "captures" in report:  # the store within its bound, and holding what the run sent
        held = report["captures"]
        out["captures_within_bound"] = 0 < held["count"] and held["bytes"] <= held["max_bytes"]
        if "refused_kept" in held:  # a refused request (401, keyless) is a line, not a capture
            out["captures_keep_no_refused_request"] = held["refused_kept"] == 0
    if "worker_peak_mib" in report:
        out["worker_peak_ok"] = bool(report["worker_peak_mib"]) and \
            max(report["worker_peak_mib"].values()) <= report["worker_peak_bound_mib"]
    if report["hostile"]:
        stalled, idle = report["stalled_readers"], report["idle_sockets"]
        out.update({
            "hostile_no_5xx": report["hostile_5xx"] == 0,
            "hostile_all_as_expected": not report["hostile_unexpected"],
            # none asked for (--stalled 0, --idle 0): nothing to judge
            "stalled_readers_closed_by_server": stalled["overstayed"] == 0 and (
                stalled["closed_mid_answer"] > 0 or not stalled["sockets"]),
            "idle_sockets_closed_by_server": idle["overstayed"] == 0 and (
                idle["closed_by_server"] > 0 or not idle["sockets"]),
            # streams dropped mid-answer were charged what they read at least, and the key was
            # refused once past its budget
            "budget_charges_dropped_streams": (budget := report["budget"])["dropped"] > 0 and
            budget["refused_429"] > 0 and budget["charged"].get("tokens", 0) >= max(budget["frames_read"],
                                                                                   budget["budget_tokens"]),
            # a name of a host the caller chose was never connected to
            "foreign_host_never_reached": report["foreign_host_connections"] == 0,
        })
    return out


def read_captures(url: str, headers: dict[str, str]) -> dict:
    """What the gateway's capture store holds at the end: its count and bytes, and its bound; with
    keys, how many of the captures are of requests refused for want of one."""
    def listing(query: str) -> dict:
        with urllib.request.urlopen(urllib.request.Request(url + "/captures?" + query, headers=headers),
                                    timeout=30) as r:
            return json.loads(r.read())
    whole = listing("limit=1")
    out = {k: whole[k] for k in ("count", "bytes", "max_bytes")}
    if headers:
        out["refused_kept"] = len(listing("status=401&limit=1")["data"])
    return out


def _usage_ok(usage: dict, own_server: bool) -> bool:
    if "error" in usage:
        return not own_server
    return usage["at_least"] <= usage["recorded_requests"] <= usage["at_most"]


def raise_fd_limit(need: int) -> int:
    """The soft limit on open files, raised towards the hard one when ``need`` is more."""
    try:
        import resource
    except ImportError:
        return need  # no such limit to raise (Windows)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return need
    want = need if hard == resource.RLIM_INFINITY else min(hard, max(need, 4096))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    except (ValueError, OSError):
        return soft


def write_config(d: Path, threads: int | None, hostile: HostileOptions | None, upstream=None,
                 extra: list[str] = [], capture: int = 0, closed_port: int = 0) -> Path:  # noqa: B006 (never changed)
    per_model: dict[str, str] = {m: f"    path: {d}/{m}.gguf\n" for m in ("plain", "thinker", "loop")}
    if threads:
        per_model = {m: t + f"    n_threads: {threads}\n" for m, t in per_model.items()}
    server = "server:\n  discover_default_stores: false\n"
    if capture:  # every request kept, within this bound; each body within a sixteenth of it
        server += f"  capture: {{max_bytes: {capture}, max_body_bytes: {max(1024, capture // 16)}}}\n"
    if hostile:
        server += "".join(f"  {k}: {v}\n" for k, v in hostile.limits.items())
        # keys; traces on to a collector that is down; on-demand pulls from the one registry that
        # the environment points at a closed loopback port (HF_ENDPOINT)
        server += keys_config() + f"  otel: {{endpoint: 'http://127.0.0.1:{closed_port}/v1/traces'}}\n"
        server += f"  pull_on_demand: true\n  pull_on_demand_hosts: [{', '.join(ON_DEMAND_HOSTS)}]\n"
        per_model["plain"] += "    n_ctx: 1024\n"  # a 400 KB prompt is then refused by its size
        per_model["loop"] += f"    n_ctx: {LOOP_N_CTX}\n"  # room for a stalled reader's long answer
        if hostile.files:  # the strangers' files found in their folders, and every model kept loaded
            server += f"  models_dirs: [{d}/strangers, {d}/media]\n  max_loaded_models: 0\n"
    entries = "".join(extra)
    if upstream is not None:
        server += f"  request_timeout: {UPSTREAM_REQUEST_TIMEOUT}\n  upstream_check_seconds: 1\n"
        entries += upstream_entries(upstream)
    cfg = d / "models.yaml"
    cfg.write_text(server + "models:\n" + "".join(f"  {m}:\n{t}" for m, t in per_model.items()) + entries)
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running gateway (default: start one on scripted models)")
    p.add_argument("--models", help="comma-separated model names (with --url)")
    p.add_argument("--api-key", help="with --url: sent on every request (Authorization: Bearer), and for /usage")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--threads", type=int, help="n_threads for each scripted model (default: the gateway's)")
    p.add_argument("--json", type=Path, help="write the report here too")
    p.add_argument("--server-log", type=Path, help="write the started gateway's log here")
    p.add_argument("--rss-bound-mib", type=float, default=200, help="most the RSS may grow from start to end")
    p.add_argument("--capture", type=int, default=0, metavar="BYTES",
                   help="the gateway started keeps captures (server.capture) within BYTES; checked at the end")
    p.add_argument("--hostile", action="store_true", help="run hostile actors beside the normal clients")
    p.add_argument("--stalled", type=int, default=4, help="stalled readers at a time (with --hostile)")
    p.add_argument("--idle", type=int, default=200, help="idle and slow sockets at a time (with --hostile)")
    p.add_argument("--hostile-clients", type=int, default=2, help="clients sending hostile bodies (with --hostile)")
    p.add_argument("--hostile-upstream", action="store_true",
                   help="serve a loopback upstream that misbehaves, and run clients against it")
    p.add_argument("--upstream-clients", type=int, default=len(UPSTREAM_KINDS),
                   help="clients of the hostile upstream's entries (default: one to begin with each way)")
    p.add_argument("--no-hostile-files", action="store_true",
                   help="with --hostile: leave out the strangers' model files, templates, pictures and sounds")
    p.add_argument("--health-p99-ms", type=float, default=UpstreamOptions.health_p99_ms,
                   help="/health's p99 bound (with --hostile-upstream, or --hostile and its files)")
    p.add_argument("--health-max-ms", type=float, default=UpstreamOptions.health_max_ms,
                   help="/health's slowest answer's bound (with --hostile-upstream, or --hostile and its files)")
    p.add_argument("--gateway-peak-mib", "--upstream-peak-mib", type=float, default=UpstreamOptions.peak_mib,
                   help="most the gateway process's peak memory may grow (with --hostile-upstream, or --hostile "
                        "and its files)")
    p.add_argument("--worker-peak-mib", type=float, default=HostileOptions.worker_peak_mib,
                   help="most any worker's peak memory may be (with --hostile and its files)")
    args = p.parse_args(argv)
    hostile = None
    if args.hostile_upstream:
        if args.url:
            p.error("--hostile-upstream starts its own gateway (its entries point at the loopback upstream it "
                    "starts, and its peak memory is read from /proc); it cannot be used with --url")
        if not os.path.exists("/proc/self/clear_refs"):
            p.error("--hostile-upstream needs Linux's /proc/<pid>/clear_refs to measure the gateway's peak memory")
    bounds = UpstreamOptions(args.upstream_clients, args.health_p99_ms, args.health_max_ms, args.gateway_peak_mib)
    upstream_opts = bounds if args.hostile_upstream else None
    if args.api_key and not args.url:
        p.error("--api-key is for a gateway given by --url (the one started here has no keys)")
    if args.hostile:
        if args.url:
            p.error("--hostile starts its own gateway (scripted models, short limits, its sockets read from "
                    "/proc); it cannot be used with --url")
        if not os.path.exists("/proc/net/tcp"):
            p.error("--hostile needs Linux's /proc/net/tcp to see the server close a stalled reader")
    # Every socket open at once, with room for aiohttp's pools, the workers' pipes and the log.
    sockets = args.clients * 2 + (args.stalled + args.idle + args.hostile_clients * 2 if args.hostile else 0) + \
        (args.upstream_clients * 2 if args.hostile_upstream else 0)
    if raise_fd_limit(sockets + 64) < sockets + 64:
        p.error(f"needs {sockets + 64} open files; lower --idle or raise `ulimit -n`")
    if args.hostile:
        limits = {**HOSTILE_LIMITS, "max_connections": max(512, sockets + 64)}
        files = not args.no_hostile_files
        hostile = HostileOptions(stalled=args.stalled, idle=args.idle, clients=args.hostile_clients, limits=limits,
                                 worker_peak_mib=args.worker_peak_mib, files=files,
                                 kinds=HOSTILE + (hostile_file_kinds() if files else ()))
    if args.url:
        host = args.url.split("//", 1)[-1].split(":")[0].split("/")[0]
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]") and not host.startswith("127."):
            p.error("--url must be a loopback address")
        report = asyncio.run(run(args.url, args.models.split(","), args.clients, args.seconds, None,
                                 api_key=args.api_key))
    else:
        from helpers import ServerProcess, free_port

        with tempfile.TemporaryDirectory() as tmp, \
                (HostileUpstream() if args.hostile_upstream else contextlib.nullcontext()) as upstream:
            d = Path(tmp)
            tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
            tm.thinking(d / "thinker.gguf", "Let me think about it.", "The answer is 4.")
            tm.endless(d / "loop.gguf", [" tick", " tock"])
            files = hostile is not None and hostile.files
            closed = free_port()  # nothing listens: the collector down, the hub unreachable
            cfg = write_config(d, args.threads, hostile, upstream, write_hostile_files(d) if files else [],
                               args.capture, closed)
            loaded = ["plain", "thinker", "loop", *((*TEMPLATE_BOMBS, *MEDIA_MODELS) if files else ())]
            # usage recorded as by default (usage.db in the state folder), the state folder in tmp;
            # no keys from the environment: the gateway is open and records as key `anonymous`
            env = {"HOME": tmp, "XDG_STATE_HOME": str(d / "state"), "GGUF_GATEWAY_API_KEYS": "",
                   "HF_ENDPOINT": f"http://127.0.0.1:{closed}", "HF_HUB_OFFLINE": ""}
            admin = bearer("admin") if hostile else {}  # with --hostile the gateway holds keys
            with ServerProcess("--config", str(cfg), "--log-level", "warning", env=env) as srv, \
                    (ForeignHost() if hostile else contextlib.nullcontext()) as foreign:
                for m in loaded:  # every model that loads, loaded before memory is measured
                    srv.get("/health")
                    urllib.request.urlopen(urllib.request.Request(
                        srv.url + "/models/load", data=json.dumps({"model": m}).encode(), headers=admin)).read()
                if hostile is not None and foreign is not None:
                    hostile = dataclasses.replace(hostile, kinds=hostile.kinds + round_five_kinds(foreign.port))
                report = asyncio.run(run(srv.url, ["plain", "thinker", "loop"], args.clients, args.seconds,
                                         srv.proc.pid, hostile, upstream, upstream_opts, bounds,
                                         api_key=KEYS["admin"] if hostile else None, foreign=foreign))
                if args.capture:
                    report["captures"] = read_captures(srv.url, admin)
                code, log = srv.stop()
                report["server_exit_code"] = code
                report["server_tracebacks"] = log.count("Traceback")
                if args.server_log:
                    args.server_log.write_text(log)
    report["rss_bound_mib"] = args.rss_bound_mib
    report["checks"] = checks(report, args.rss_bound_mib, own_server=not args.url)
    report["rss_bound_ok"] = report["checks"]["rss_bound_ok"]
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
