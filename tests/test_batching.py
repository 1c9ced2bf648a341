"""Continuous batching and prefix reuse, on real workers decoding scripted models.

Timing here is only ever an order of events (which token arrived before which), never a
speed: speed is scripts/bench.py's business."""

import asyncio
import json
import random
import re
import time

import aiohttp
import pytest
from openapi import validate
from workerevents import record_events, under_way

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

SCRIPTS = [tm.Script(["The", " first", " answer", "."], trigger="\n"),
           tm.Script(["Second", " reply", " here", "!"], trigger="?"),
           tm.Script([" third", " words", " only"], trigger=":")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("batching")
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    written = tm.write_scripted_model(d / "scripts.gguf", SCRIPTS)
    return d, written


@pytest.fixture
async def client(aiohttp_client, files, write_config):
    async def make(loop: str = "", scripts: str = "", server: str = ""):
        d, _ = files
        cfg = write_config(f"server:\n  discover_default_stores: false\n  max_queue: 100\n{server}models:\n"
                           f"  loop:\n    path: {d}/loop.gguf\n    n_ctx: 8192\n{loop}"
                           f"  scripts:\n    path: {d}/scripts.gguf\n{scripts}")
        return await aiohttp_client(create_app(load_config(cfg)), server_kwargs={"handler_cancellation": True})
    return make


async def stream_times(response) -> list[float]:
    """Arrival times of the chunks that carry text, until the stream ends."""
    times = []
    try:
        while line := await response.content.readline():
            if line.startswith(b"data: {"):
                choices = json.loads(line[6:])["choices"]
                if choices and (choices[0].get("text") or choices[0].get("delta", {}).get("content")):
                    times.append(time.monotonic())
    except (aiohttp.ClientConnectionError, RuntimeError):  # we closed it
        pass
    return times


def chat(max_tokens: int, stream: bool = True, content: str = "hi") -> dict:
    return {"model": "loop", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": stream}


@pytest.mark.parametrize("parallel", [2, 1])
async def test_two_streams_on_one_model_progress_together(client, parallel, monkeypatch):
    seen = record_events(monkeypatch)
    c = await client(loop=f"    parallel: {parallel}\n")
    long = await c.post("/v1/chat/completions", json=chat(4000))
    while not (line := await long.content.readline()).startswith(b'data: {"'):  # the long answer is under way
        assert line, "the long answer's stream ended before its first chunk"
    short = await c.post("/v1/chat/completions", json=chat(20))
    assert len(await stream_times(short)) == 20
    long.close()  # the long answer is cancelled (if it has not finished yet)
    await seen.finished(2)
    # the worker's own done events, in the order the answers ended
    (first, second) = [(d.completion_tokens, d.finish_reason) for d in seen.done]
    if parallel == 2:
        # each decode step advanced both: the short answer ended first, and the long one had
        # gone on meanwhile (by at least the short one's 20 tokens), to its cancel or its end
        assert first == (20, "length") and second[0] > 20 and second[1] in ("cancelled", "length"), (first, second)
    else:  # one slot: the second request waited for the whole first answer
        assert first == (4000, "length") and second == (20, "length")


async def test_exact_outputs_are_unchanged_by_batching(client, files):
    _, written = files
    c = await client(scripts="    parallel: 3\n")
    prompts = {"\n": "Say it\n", "?": "Why?", ":": "Words:"}
    expected = {trig: written.text(trig) for trig in prompts}

    async def complete(trig: str, stream: bool, sampled: bool) -> str:
        body = {"model": "scripts", "prompt": prompts[trig], "max_tokens": 20, "stream": stream,
                **({"temperature": 1.5, "seed": random.randrange(1 << 30)} if sampled else {"temperature": 0})}
        r = await c.post("/v1/completions", json=body)
        assert r.status == 200
        if not stream:
            out = await r.json()
            validate(out, "CreateCompletionResponse")
            return out["choices"][0]["text"]
        text = []
        while line := await r.content.readline():
            if line.startswith(b"data: {"):
                text += [ch["text"] for ch in json.loads(line[6:])["choices"]]
        return "".join(text)

    alone = {trig: await complete(trig, False, False) for trig in prompts}
    assert alone == expected
    # 18 requests at once on 3 slots: decoded in shared batches, the rest queued, the order mixed
    jobs = [(trig, stream, sampled) for trig in prompts for stream in (False, True) for sampled in (False, True, True)]
    random.Random(7).shuffle(jobs)
    together = await asyncio.gather(*(complete(*job) for job in jobs))
    assert [expected[job[0]] for job in jobs] == together


async def test_a_fast_models_tokens_go_out_in_groups_within_the_stream_interval(client):
    # an interval long beside what a busy machine's scheduler delays a process by (tens of
    # milliseconds), so the gaps told apart below are the interval's, not the machine's; and one
    # decoding thread: beside other busy processes, two threads meeting at llama.cpp's barrier
    # each step waited for each other's time slices (a token every 100-200 ms, then nothing to group)
    interval = 0.3
    c = await client(loop="    n_threads: 1\n", server=f"  stream_interval_ms: {int(interval * 1000)}\n")
    r = await c.post("/v1/chat/completions", json=chat(3000))
    times = await stream_times(r)
    assert len(times) == 3000  # every token is still its own chunk
    gaps = [b - a for a, b in zip(times, times[1:])]
    # the first token is never held; the next ones wait for the tokens of the following steps
    # (this model decodes a token in about a millisecond)
    assert gaps[0] > interval / 2, gaps[:5]
    bursts = 1 + sum(g > interval / 3 for g in gaps)
    assert bursts >= 2 and len(times) / bursts >= 5, (bursts, len(times))


async def test_a_long_prompt_is_prefilled_in_chunks_while_streams_flow(client):
    c = await client(loop="    parallel: 2\n    n_batch: 8\n")
    running = await c.post("/v1/chat/completions", json=chat(3000))
    await under_way(running)
    times = asyncio.create_task(stream_times(running))
    t0 = time.monotonic()
    r = await c.post("/v1/completions", json={"model": "loop", "prompt": "x" * 1200 + "\n", "max_tokens": 1})
    body = await r.json()
    t1 = time.monotonic()
    assert r.status == 200 and body["usage"]["prompt_tokens"] > 1000, body
    running.close()
    flowed = [t for t in await times if t0 < t < t1]
    # ~1,200 prompt tokens in steps of 8 (the running stream's token among them): the stream
    # got a token at nearly every step; a prompt decoded in one go would have left it ~none
    assert len(flowed) >= 50, len(flowed)


async def test_prefix_reuse_each_conversation_keeps_its_slot(client, files):
    _, written = files
    c = await client(scripts="    parallel: 2\n")
    answer = written.text("\n")

    async def turn(messages: list[dict]) -> dict:
        r = await c.post("/v1/chat/completions", json={"model": "scripts", "messages": messages})
        out = await r.json()
        assert r.status == 200, out
        validate(out, "CreateChatCompletionResponse")
        assert out["choices"][0]["message"]["content"] == answer
        return out["usage"]

    a1 = [{"role": "user", "content": "Tell me about rivers " * 20}]
    b1 = [{"role": "user", "content": "Tell me about mountains " * 20}]
    ua1, ub1 = await turn(a1), await turn(b1)
    assert ua1["prompt_tokens_details"]["cached_tokens"] == 0
    # B shares an opening with A's cache, but takes the empty slot rather than evict A's history
    assert ub1["prompt_tokens_details"]["cached_tokens"] == 0
    # second turns, interleaved: each finds its whole first turn cached in its own slot
    for first, usage in ((a1, ua1), (b1, ub1)):
        messages = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        u2 = await turn(messages)
        cached = u2["prompt_tokens_details"]["cached_tokens"]
        # so only the answer and the new message were decoded
        assert usage["prompt_tokens"] <= cached < u2["prompt_tokens"], (cached, usage)
    metrics = await (await c.get("/metrics")).text()
    m = re.search(r'gguf_gateway_cached_prompt_tokens_total\{model="scripts"\} (\d+)', metrics)
    assert m and int(m.group(1)) >= ua1["prompt_tokens"] + ub1["prompt_tokens"]


async def test_a_repeated_prompt_is_read_from_the_cache_in_both_wire_shapes(client):
    c = await client()
    body = {"model": "scripts", "max_tokens": 5, "messages": [{"role": "user", "content": "Same question " * 30}]}
    first = await (await c.post("/v1/messages", json=body)).json()
    again = await (await c.post("/v1/messages", json=body)).json()
    total = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
    assert first["usage"]["cache_read_input_tokens"] == 0 and total > 60
    # all but the last prompt token, which is decoded again for fresh logits
    assert again["usage"]["cache_read_input_tokens"] == total - 1 and again["usage"]["input_tokens"] == 1
    assert again["content"] == first["content"]
    r = await c.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    usage = None
    while line := await r.content.readline():
        if line.startswith(b"data: {") and (chunk := json.loads(line[6:])).get("usage"):
            usage = chunk["usage"]
    assert usage["prompt_tokens"] == total and usage["prompt_tokens_details"]["cached_tokens"] == total - 1
