"""`scripts/bench.py --socket`: an agent-like Responses session (``--socket-turns`` turns, each
continuing the last by ``previous_response_id``, short answers) driven two ways against one
gateway and model: over HTTP, one ``POST /v1/responses`` with ``stream: true`` a turn on a
kept-alive connection (as Codex does over HTTP), and over the Responses WebSocket, one socket
carrying every turn (``GET /v1/responses`` upgraded; ``api/responses_socket``).

Each way by two clients, so the client's own cost shows beside the gateway's:
- **SDK**: the official openai SDK, ``AsyncOpenAI.responses.create(stream=True)`` (httpx, one
  client kept for the whole run, so its connection is warm) against ``responses.connect()``
  (the ``websockets`` package), every event parsed into the SDK's types;
- **raw**: aiohttp's client, the SSE's ``data:`` lines on a kept-alive ``ClientSession``
  against aiohttp's WebSocket client, each event read with ``json.loads`` alone.
A socket is opened per session and its opening is part of the session's time (and reported
alone); the HTTP side pays no connection set-up (its connection outlives the session).

Every round, each of the four runs one whole session, the order rotating; one session of each
first, to warm up. Per turn: the time from sending to the first event (``response.created``)
and to the response's end (``response.completed``, or ``response.incomplete`` where a real
model's answer hits ``max_output_tokens``); per session: its whole time. Ratios socket / SSE
of the same client are taken per round (of that round's median turn, and of the session) and
reported as median [min..max] over rounds.

1. **A scripted model** (``testmodels.plain``: a fixed four-token answer, decoded in
   microseconds): a turn's time is the gateway's per-turn cost on that path plus the client's.
2. **A real model** (``--model``, else Gemma 3 270M where the test cache has it), greedy,
   ``max_output_tokens`` ``--socket-tokens``: the same session with the model's own time in it.

Then compactions on each model (``--socket-compacts`` on the scripted one, one on the real one,
whose summary may run to ``compaction.MAX_SUMMARY_TOKENS``): ``POST /v1/responses/compact``
(``client.responses.compact``) of the last session's ``--socket-turns``-turn history by its
``previous_response_id``, timed, with the tokens it read and wrote (``usage``). llama-server has neither the Responses
WebSocket nor compaction (nor ``/v1/responses`` state by id), so neither figure has a
llama-server column: the report says so rather than inventing one."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchlib import Server

from gateway.models import testmodels as tm

ANSWER = ["Done", ",", " next", "."]
ENDS = ("response.completed", "response.incomplete")
NO_LLAMA_SERVER = ("llama-server: not measured; it has no Responses API state (previous_response_id), no Responses "
                   "WebSocket and no compaction, so there is nothing of its own to set beside these figures")
WAYS = ("SDK, SSE", "SDK, socket", "raw, SSE", "raw, socket")
PAIRS = (("SDK", "SDK, SSE", "SDK, socket"), ("raw", "raw, SSE", "raw, socket"))


def prompt(turn: int) -> str:
    return f"Step {turn + 1} of the task: say what to do next, in a few words."


def body(model: str, turn: int, prev: str | None, opts: dict) -> dict:
    out = {"model": model, "input": prompt(turn), **opts}
    if prev is not None:
        out["previous_response_id"] = prev
    return out


class Turns:
    """One session's stamps: per turn (first event ms, end ms, events), and the last id."""

    def __init__(self) -> None:
        self.turns: list[tuple[float, float, int]] = []
        self.last_id: str | None = None
        self.start = time.perf_counter()
        self.open_ms = 0.0

    def opened(self) -> None:
        self.open_ms = (time.perf_counter() - self.start) * 1e3

    def turn(self, sent: float, first: float, end: float, events: int, end_type: str, rid: str) -> None:
        if end_type not in ENDS:
            raise SystemExit(f"a turn ended with {end_type}, not a response's end")
        self.turns.append(((first - sent) * 1e3, (end - sent) * 1e3, events))
        self.last_id = rid

    def result(self) -> dict:
        return {"session_ms": (time.perf_counter() - self.start) * 1e3, "open_ms": self.open_ms,
                "first_event_ms": [t[0] for t in self.turns], "end_ms": [t[1] for t in self.turns],
                "events": [t[2] for t in self.turns], "last_id": self.last_id}


async def sdk_sse(client, model: str, turns: int, opts: dict) -> dict:
    got = Turns()
    for k in range(turns):
        sent, first, n = time.perf_counter(), 0.0, 0
        end, end_type, rid = 0.0, "the stream's end", None
        stream = await client.responses.create(stream=True, **body(model, k, got.last_id, opts))
        async for event in stream:
            n += 1
            first = first or time.perf_counter()
            if event.type in ENDS or event.type in ("response.failed", "error"):
                end, end_type, rid = time.perf_counter(), event.type, getattr(event, "response", None)
        got.turn(sent, first, end, n, end_type, rid.id if rid is not None else "")
    return got.result()


async def sdk_socket(client, model: str, turns: int, opts: dict) -> dict:
    got = Turns()
    async with client.responses.connect() as conn:
        got.opened()
        for k in range(turns):
            sent, first, n = time.perf_counter(), 0.0, 0
            await conn.response.create(**body(model, k, got.last_id, opts))
            while True:
                event = await conn.recv()
                n += 1
                first = first or time.perf_counter()
                if event.type in ENDS or event.type in ("response.failed", "error"):
                    rid = getattr(event, "response", None)
                    got.turn(sent, first, time.perf_counter(), n, event.type, rid.id if rid is not None else "")
                    break
        result = got.result()  # before the close handshake
    return result


async def raw_sse(session, url: str, model: str, turns: int, opts: dict) -> dict:
    got = Turns()
    for k in range(turns):
        sent, first, n = time.perf_counter(), 0.0, 0
        end, end_type, rid = 0.0, "the stream's end", None
        async with session.post(f"{url}/v1/responses", json={"stream": True, **body(model, k, got.last_id, opts)},
                                headers={"Authorization": "Bearer bench"}) as r:
            if r.status != 200:
                raise SystemExit(f"POST /v1/responses: HTTP {r.status}: {(await r.read())[:300]!r}")
            async for line in r.content:
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                n += 1
                first = first or time.perf_counter()
                if event["type"] in ENDS or event["type"] in ("response.failed", "error"):
                    end, end_type, rid = time.perf_counter(), event["type"], (event.get("response") or {}).get("id")
        got.turn(sent, first, end, n, end_type, rid or "")
    return got.result()


async def raw_socket(session, url: str, model: str, turns: int, opts: dict) -> dict:
    got = Turns()
    async with session.ws_connect(f"{url.replace('http://', 'ws://')}/v1/responses",
                                  headers={"Authorization": "Bearer bench"}) as ws:
        got.opened()
        for k in range(turns):
            sent, first, n = time.perf_counter(), 0.0, 0
            await ws.send_str(json.dumps({"type": "response.create", **body(model, k, got.last_id, opts)}))
            while True:
                event = json.loads(await ws.receive_str())
                n += 1
                first = first or time.perf_counter()
                if event["type"] in ENDS or event["type"] in ("response.failed", "error"):
                    got.turn(sent, first, time.perf_counter(), n, event["type"],
                             (event.get("response") or {}).get("id") or "")
                    break
        result = got.result()
    return result


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def compare(srv: Server, rounds: int, turns: int, opts: dict, compacts: int) -> dict:
    """``rounds`` rounds of one session each way, the order rotating, after one of each to warm up;
    then ``compacts`` compactions of the last session's history."""
    import aiohttp
    import openai

    url = f"http://127.0.0.1:{srv.port}"
    model = srv.model_name
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="bench", max_retries=0) as client, \
            aiohttp.ClientSession() as session:
        ways: dict[str, Callable[[], Awaitable[dict]]] = {
            "SDK, SSE": lambda: sdk_sse(client, model, turns, opts),
            "SDK, socket": lambda: sdk_socket(client, model, turns, opts),
            "raw, SSE": lambda: raw_sse(session, url, model, turns, opts),
            "raw, socket": lambda: raw_socket(session, url, model, turns, opts)}
        for way in WAYS:
            await ways[way]()
        runs: dict[str, list[dict]] = {w: [] for w in WAYS}
        for r in range(rounds):
            for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
                runs[way].append(await ways[way]())
        last = runs["SDK, socket"][-1]["last_id"]
        compacted = []
        for _ in range(compacts):
            t0 = time.perf_counter()
            got = await client.responses.compact(model=model, previous_response_id=last)
            compacted.append({"ms": (time.perf_counter() - t0) * 1e3, "input_tokens": got.usage.input_tokens,
                              "output_tokens": got.usage.output_tokens, "items": len(got.output)})
    out: dict = {"rounds": rounds, "turns": turns, "ways": {}}
    for way, sessions in runs.items():
        first = [x for s in sessions for x in s["first_event_ms"]]
        end = [x for s in sessions for x in s["end_ms"]]
        out["ways"][way] = {"first_event_ms": spread(first), "end_ms": spread(end),
                            "first_turn_end_ms": spread([s["end_ms"][0] for s in sessions]),
                            "last_turn_end_ms": spread([s["end_ms"][-1] for s in sessions]),
                            "session_ms": spread([s["session_ms"] for s in sessions]),
                            "events_per_turn": statistics.median(n for s in sessions for n in s["events"]),
                            "rounds": {k: [s[k] for s in sessions] for k in ("session_ms", "first_event_ms",
                                                                              "end_ms")}}
        if way.endswith("socket"):
            out["ways"][way]["open_ms"] = spread([s["open_ms"] for s in sessions])
    out["ratios"] = {}
    med = statistics.median
    for client_name, sse, sock in PAIRS:
        a, b = runs[sse], runs[sock]
        out["ratios"][client_name] = {
            "first_event": spread([med(y["first_event_ms"]) / med(x["first_event_ms"]) for x, y in zip(a, b)]),
            "end": spread([med(y["end_ms"]) / med(x["end_ms"]) for x, y in zip(a, b)]),
            "session": spread([y["session_ms"] / x["session_ms"] for x, y in zip(a, b)]),
            "turn_saved_ms": spread([med(x["end_ms"]) - med(y["end_ms"]) for x, y in zip(a, b)])}
    if compacted:
        out["compact"] = {"ms": spread([c["ms"] for c in compacted]), **{k: compacted[-1][k] for k in (
            "input_tokens", "output_tokens", "items")}, "times": len(compacted)}
    return out


def main(args, tmp: Path, gateway: Callable[[Path, str], Server], real: Path | None) -> dict:
    """``gateway(model, label)``: bench.py's gateway; ``real``: the real model, or None."""
    out: dict = {"turns": args.socket_turns}
    scripted = tm.plain(tmp / "session.gguf", ANSWER).path
    print(f"  the scripted model: {args.socket_rounds} rounds of {args.socket_turns}-turn sessions, four ways ...",
          file=sys.stderr)
    with gateway(scripted, "gateway") as srv:
        out["scripted"] = asyncio.run(compare(srv, args.socket_rounds, args.socket_turns, {}, args.socket_compacts))
    if real is not None and args.socket_real_rounds > 0:
        print(f"  {real.name}: {args.socket_real_rounds} rounds ...", file=sys.stderr)
        opts = {"max_output_tokens": args.socket_tokens, "temperature": 0}
        with gateway(real, "gateway") as srv:
            out["real"] = {"model": real.name, "max_output_tokens": args.socket_tokens,
                           **asyncio.run(compare(srv, args.socket_real_rounds, args.socket_turns, opts,
                                                 min(1, args.socket_compacts)))}
    return out


def _ms(s: dict, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}..{fmt.format(s['max'])}]"


def report(res: dict) -> str:
    lines = []
    for key in ("scripted", "real"):
        r = res.get(key)
        if r is None:
            continue
        title = ("the scripted model (testmodels.plain, a 4-token answer)" if key == "scripted"
                 else f"{r['model']}, greedy, max_output_tokens {r['max_output_tokens']}")
        lines += [f"\n{r['turns']}-turn Responses sessions (each turn continues the last by previous_response_id) "
                  f"on {title}, {r['rounds']} alternating rounds; ms, medians [min..max] over every turn or session",
                  f"| {'':<30} |" + "".join(f" {w:>24} |" for w in WAYS), "|" + "-" * 32 + "|" + "-" * 26 * 4 + "|"]
        for label, k in (("turn: to the first event", "first_event_ms"), ("turn: to response.completed", "end_ms"),
                         ("first turn: to completed", "first_turn_end_ms"),
                         ("last turn: to completed", "last_turn_end_ms"),
                         ("whole session", "session_ms"), ("of which the socket's open", "open_ms")):
            cells = [_ms(r["ways"][w][k]) if k in r["ways"][w] else "-" for w in WAYS]
            lines.append(f"| {label:<30} |" + "".join(f" {c:>24} |" for c in cells))
        per = ", ".join(f"{w} {r['ways'][w]['events_per_turn']:g}" for w in WAYS)
        lines.append(f"events a turn: {per}")
        lines.append("socket / SSE, the same client, per round (of the round's median turn; of the session): "
                     "median [min..max]")
        for name, x in r["ratios"].items():
            lines.append(f"  {name:<4} first event {_ms(x['first_event'], '{:.2f}')}x, completed "
                         f"{_ms(x['end'], '{:.2f}')}x, session {_ms(x['session'], '{:.2f}')}x; "
                         f"a turn's time saved {_ms(x['turn_saved_ms'], '{:.2f}')} ms")
        c = r.get("compact")
        if c:
            lines.append(f"compaction of the {r['turns']}-turn history (POST /v1/responses/compact by "
                         f"previous_response_id, {c['times']} times): {_ms(c['ms'])} ms; read {c['input_tokens']} "
                         f"tokens, wrote {c['output_tokens']}; {c['items']} items out")
    lines.append(NO_LLAMA_SERVER)
    return "\n".join(lines)
