"""What was generated is charged, however the request ends (issue 64, HIGH 2), in process
against real scripted models and a fake upstream:

- a stream its client reads for a while and then drops, in every wire that streams: the key's
  budget is charged (its next request is a 429 naming the budget), and ``/usage``, the limits'
  ``spent`` and the per-key metrics all hold the same tokens: the prompt's, and at least every
  token the client read, at most what the worker made;
- a whole answer whose client leaves mid-way;
- a batch of prompts streamed and dropped while its second prompt runs unread: both prompts and
  what the second generated are charged;
- a worker killed mid-stream, and an upstream that breaks off mid-answer (streamed and whole):
  what arrived is charged.

Each test waits on events (the worker's own done event, the usage store's row), never on a
clock; the bounds are only how long before a test fails."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time

import pytest
from aiohttp import web
from helpers import WEATHER
from workerevents import record_events, until

from gateway.app import REGISTRY, create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

ROOT = "root-key"
BUDGET = 50  # tokens a day: less than what each test's key is made to spend
READ = 60  # tokens the client reads before it leaves: past the budget on their own
TOKEN = re.compile(r"\b(tick|tock)\b")  # the loop model's tokens, one each, as a stream's frames carry them


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("charge")
    tm.endless(d / "loop.gguf")
    tm.plain(d / "emb.gguf", ["x"])
    return d


def config(write_config, files, upstream: str = ""):
    keys = "".join(f"    {name}: {{key: {name}-key, budget: {BUDGET}, budget_period: day}}\n"
                   for name in ("chat", "completions", "responses", "messages", "ollama", "whole", "batch", "killed",
                                "far", "calls"))
    far = "".join(f"  far-{how}: {{upstream: '{upstream}/{how}/v1', model: m}}\n" for how in ("cut", "clean", "calls")) \
        if upstream else ""
    return load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n{keys}"
        f"models:\n  loop:\n    path: {files}/loop.gguf\n    parallel: 4\n    n_ctx: 16384\n{far}"))


# each wire that streams: its route and a body that asks the loop model for a long answer
STREAMS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go"}], "max_tokens": 16000}),
    "completions": ("/v1/completions", {"prompt": "go\n", "max_tokens": 16000}),  # a scripted model answers after a newline
    "responses": ("/v1/responses", {"input": "go", "max_output_tokens": 16000}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "go"}], "max_tokens": 16000}),
    "ollama": ("/api/chat", {"messages": [{"role": "user", "content": "go"}], "options": {"num_predict": 16000}}),
}


async def usage(client, name: str, requests: int) -> dict:
    """Key ``name``'s usage once ``requests`` of its requests have ended and been recorded, with
    its limits' state as ``limits``."""
    async def recorded():
        body = await (await client.get(f"/usage?key={name}", headers=auth(ROOT))).json()
        rows = [r for r in body["data"] if r["key"] == name]
        if sum(r["requests"] for r in rows) < requests:
            return None
        total = {k: sum(r[k] for r in rows) for k in ("requests", "prompt_tokens", "completion_tokens", "total_tokens")}
        return {**total, "limits": body["limits"][name]}

    deadline = time.monotonic() + 120
    while (got := await recorded()) is None:  # each request is recorded as its handler ends
        assert time.monotonic() < deadline, f"{requests} request(s) of {name!r} never recorded"
        await asyncio.sleep(0.02)
    return got


async def refused_by_budget(client, name: str) -> None:
    """The key's next request is refused: its budget is spent."""
    path, body = STREAMS["chat"]
    r = await client.post(path, headers=auth(f"{name}-key"), json={**body, "model": "loop", "max_tokens": 2})
    text = await r.text()
    assert r.status == 429, text
    assert r.headers["X-Gateway-Limit"] == "budget" and "budget" in text


async def read_tokens(resp, at_least: int) -> int:
    """Read ``resp``'s stream until it has carried ``at_least`` of the loop model's tokens."""
    read = 0
    while read < at_least:
        line = await resp.content.readline()
        assert line, f"the stream ended after {read} tokens"
        read += len(TOKEN.findall(line.decode()))
    return read


def key_metrics(text: str, name: str) -> dict[str, float]:
    found = re.findall(rf'gguf_gateway_key_tokens_total{{key="{name}",kind="(\w+)"}} ([0-9.e+]+)', text)
    return {kind: float(n) for kind, n in found}


@pytest.mark.parametrize("wire", list(STREAMS))
async def test_a_stream_read_then_dropped_is_charged_what_was_generated(aiohttp_client, write_config, files,
                                                                        monkeypatch, wire):
    seen = record_events(monkeypatch)
    client = await aiohttp_client(create_app(config(write_config, files)))
    path, body = STREAMS[wire]
    resp = await client.post(path, headers=auth(f"{wire}-key"), json={**body, "model": "loop", "stream": True})
    assert resp.status == 200
    read = await read_tokens(resp, READ)
    resp.close()  # the client leaves mid-answer
    done = await seen.finished()
    assert done.finish_reason == "cancelled"  # it was left before its end
    spent = await usage(client, wire, 1)
    assert spent["prompt_tokens"] == done.prompt_tokens
    assert read <= spent["completion_tokens"] <= done.completion_tokens
    assert spent["limits"]["spent"] == spent["total_tokens"]
    metrics = key_metrics(await (await client.get("/metrics", headers=auth(ROOT))).text(), wire)
    assert metrics == {"prompt": spent["prompt_tokens"], "completion": spent["completion_tokens"]}
    await refused_by_budget(client, wire)


async def test_a_whole_answer_whose_client_leaves_is_charged(aiohttp_client, write_config, files, monkeypatch):
    seen = record_events(monkeypatch)
    client = await aiohttp_client(create_app(config(write_config, files)))
    path, body = STREAMS["chat"]
    task = asyncio.create_task(client.post(path, headers=auth("whole-key"), json={**body, "model": "loop"}))
    await seen.until(lambda: max(seen.made.values(), default=0) >= READ, "the answer never got under way")
    task.cancel()  # the client leaves before the answer is whole
    with pytest.raises(asyncio.CancelledError):
        await task
    done = await seen.finished()
    assert done.finish_reason == "cancelled"
    spent = await usage(client, "whole", 1)
    assert spent["prompt_tokens"] == done.prompt_tokens
    assert READ <= spent["completion_tokens"] <= done.completion_tokens
    await refused_by_budget(client, "whole")


async def test_a_dropped_batch_charges_the_prompt_it_had_not_reached(aiohttp_client, write_config, files,
                                                                    monkeypatch):
    """Two prompts in one streamed request run side by side in the worker; the stream writes the
    first's answer, then the second's. Dropped during the first, the second was generating all
    the same, unread: its prompt and tokens are charged too."""
    seen = record_events(monkeypatch)
    client = await aiohttp_client(create_app(config(write_config, files)))
    resp = await client.post("/v1/completions", headers=auth("batch-key"),
                             json={"model": "loop", "prompt": ["go\n", "on\n"], "max_tokens": 16000, "stream": True})
    assert resp.status == 200
    await read_tokens(resp, 1)
    await seen.until(lambda: len(seen.made) == 2, "the second prompt never began")
    resp.close()
    first, second = await seen.finished(1), await seen.finished(2)
    assert first.finish_reason == second.finish_reason == "cancelled"
    spent = await usage(client, "batch", 1)
    assert spent["prompt_tokens"] == first.prompt_tokens + second.prompt_tokens
    assert 2 <= spent["completion_tokens"] <= first.completion_tokens + second.completion_tokens


async def test_a_worker_killed_mid_stream_is_charged_what_it_made(aiohttp_client, write_config, files, monkeypatch):
    seen = record_events(monkeypatch)
    client = await aiohttp_client(create_app(config(write_config, files)))
    path, body = STREAMS["chat"]
    resp = await client.post(path, headers=auth("killed-key"), json={**body, "model": "loop", "stream": True})
    read = await read_tokens(resp, READ)
    os.kill(client.app[REGISTRY].loaded()["loop"].proc.pid, signal.SIGKILL)
    rest = (await resp.read()).decode()
    assert '"worker_crashed"' in rest  # the stream ended by the worker's failure, in-band
    spent = await usage(client, "killed", 1)
    assert spent["prompt_tokens"] > 0
    assert read <= spent["completion_tokens"] <= max(seen.made.values())
    await refused_by_budget(client, "killed")


def cancelled_handler() -> bool:
    """Whether aiohttp has cancelled a request's handler (its client went: handler_cancellation)."""
    return any(t.get_coro().__qualname__ == "RequestHandler.start" and t.cancelling()  # type: ignore[union-attr]
               for t in asyncio.all_tasks())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11's")
@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
async def test_an_embedding_whose_client_leaves_is_charged_its_prompt(aiohttp_client, write_config, files,
                                                                      monkeypatch, path):
    """The worker is held still (SIGSTOP) while it has the embedding and the client leaves; once
    the gateway has seen the client go, it goes on: the inputs it read are charged."""
    seen = record_events(monkeypatch)
    client = await aiohttp_client(create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n"
        f"    embed: {{key: embed-key, budget: 1, budget_period: day}}\n"
        f"models:\n  emb:\n    path: {files}/emb.gguf\n    embeddings: true\n"))))
    assert (await client.post("/models/load", headers=auth(ROOT), json={"model": "emb"})).status == 200
    pid = client.app[REGISTRY].loaded()["emb"].proc.pid
    body = {"model": "emb", "input": ["some words for the model to read"] * 4}
    os.kill(pid, signal.SIGSTOP)
    try:
        task = asyncio.create_task(client.post(path, headers=auth("embed-key"), json=body))
        await seen.until(lambda: seen.embeds, "the embedding never reached its worker")
        task.cancel()  # the client leaves while the worker holds its inputs
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(cancelled_handler, "the gateway never saw its client go")
    finally:
        os.kill(pid, signal.SIGCONT)
    spent = await usage(client, "embed", 1)
    assert spent["prompt_tokens"] > 0 and spent["limits"]["spent"] == spent["total_tokens"]
    r = await client.post(path, headers=auth("embed-key"), json=body)
    assert r.status == 429 and r.headers["X-Gateway-Limit"] == "budget", await r.text()


SENT = 20  # the chunks of text the breaking upstream sends before it breaks off


def breaking_upstream(cut: asyncio.Event) -> web.Application:
    """An OpenAI-compatible server whose every answer is ``SENT`` chunks of text (each one
    token, as llama.cpp's server sends them), then no ``[DONE]``: under ``/clean/v1`` the
    answer's body just ends; under ``/cut/v1`` the connection is cut once ``cut`` is set; under
    ``/calls/v1`` the chunks are a tool call's pieces, and the body ends."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        how = request.match_info["how"]
        for i in range(SENT):
            delta: dict = {"content": f" zq{i}"}
            if how == "calls":  # the call's name, then its arguments a piece at a time
                piece = {"id": "call_1", "function": {"name": "get_weather", "arguments": ""}} if i == 0 \
                    else {"function": {"arguments": "{" if i == 1 else " "}}
                delta = {"tool_calls": [{"index": 0, **piece}]}
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if how == "cut":
            await cut.wait()
            assert request.transport is not None
            request.transport.close()
        else:
            await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/{how}/v1/models", models)
    app.router.add_post("/{how}/v1/chat/completions", chat)
    return app


async def test_an_upstream_that_breaks_off_is_charged_what_arrived(aiohttp_client, aiohttp_server, write_config,
                                                                   files):
    cut = asyncio.Event()
    upstream = await aiohttp_server(breaking_upstream(cut))
    client = await aiohttp_client(create_app(config(write_config, files, str(upstream.make_url("")).rstrip("/"))))
    path, body = STREAMS["chat"]
    # the connection cut once the client has had every chunk
    resp = await client.post(path, headers=auth("far-key"), json={**body, "model": "far-cut", "stream": True})
    got = ""
    while got.count(" zq") < SENT:
        line = await resp.content.readline()
        assert line, got
        got += line.decode()
    cut.set()
    assert '"upstream_unavailable"' in (await resp.read()).decode()  # the failure, in-band
    assert (await usage(client, "far", 1))["completion_tokens"] == SENT
    # an answer that stops before its end, streamed and whole
    resp = await client.post(path, headers=auth("far-key"), json={**body, "model": "far-clean", "stream": True})
    streamed = (await resp.read()).decode()
    assert streamed.count(" zq") == SENT and '"upstream_malformed"' in streamed
    assert (await usage(client, "far", 2))["completion_tokens"] == 2 * SENT
    whole = await client.post(path, headers=auth("far-key"), json={**body, "model": "far-clean"})
    assert whole.status == 502
    assert (await usage(client, "far", 3))["completion_tokens"] == 3 * SENT
    await refused_by_budget(client, "far")


async def test_an_upstream_that_breaks_off_in_a_tool_call_is_charged_its_pieces(aiohttp_client, aiohttp_server,
                                                                                write_config, files):
    upstream = await aiohttp_server(breaking_upstream(asyncio.Event()))
    client = await aiohttp_client(create_app(config(write_config, files, str(upstream.make_url("")).rstrip("/"))))
    path, body = STREAMS["chat"]
    ask = {**body, "model": "far-calls", "tools": [WEATHER]}
    for n, stream in enumerate((True, False, True), 1):  # till the budget is spent
        resp = await client.post(path, headers=auth("calls-key"), json={**ask, "stream": stream})
        if stream:
            streamed = (await resp.read()).decode()
            assert '"get_weather"' in streamed and '"upstream_malformed"' in streamed
        else:
            assert resp.status == 502
        assert (await usage(client, "calls", n))["completion_tokens"] == n * SENT
    await refused_by_budget(client, "calls")
