"""The Responses WebSocket (GET /v1/responses with an upgrade) on the real `gguf-gateway serve`
process, driven by the official openai SDK's `client.responses.connect()`, with real llama.cpp
inference on scripted models; the hostile cases with aiohttp's own WebSocket client and a raw
socket.

The steering model answers " tick tock ..." without end, and "Turning now." once the last user
message holds STEER: its chat template adds "!" to the prompt then, the trigger of its second
script; so the successor of a steered response says whether the steer reached its prompt."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
import urllib.request

import aiohttp
import openai
import pytest
import websockets
from helpers import ServerProcess, agent_model

from gateway.models import testmodels as tm
from gateway.text.chat_template import CHATML

pytestmark = pytest.mark.slow

KEY = "socket-key-e2e"
ONCE = "socket-rpm-key"  # one request a minute
STEERED = CHATML + "{%- if 'STEER' in (messages[-1]['content'] | string) %}!{% endif %}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses-socket")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.write_scripted_model(d / "steer.gguf", [tm.Script([" tick", " tock"], loop=True),
                                               tm.Script(["Turning", " now", "."], trigger="!")],
                            chat_template=STEERED, context_length=8192)
    agent_model(d / "agent.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  responses_store: 16\n  write_timeout: 2\n"
                   f"  max_body_bytes: 1048576\n  capture: true\n  api_keys:\n    root: {KEY}\n"
                   f"    once: {{key: {ONCE}, role: user, rpm: 1}}\n"
                   f"models:\n  plain: {d}/plain.gguf\n  steer: {d}/steer.gguf\n  agent: {d}/agent.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


@pytest.fixture
async def client(server):
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


async def until_done(conn, responses: int = 1) -> list:
    """Events until the ``responses``-th response ended."""
    events, ended = [], 0
    async for event in conn:
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            ended += 1
            if ended == responses:
                return events
    raise AssertionError("the socket closed first")


def captured(server, text: str) -> bool:
    """Whether one of the last captured requests holds ``text``."""
    auth = {"Authorization": f"Bearer {KEY}"}
    listed = server.get("/captures?limit=4", auth)[1]["data"]
    return any(text in json.dumps(server.get(f"/captures/{c['id']}", auth)[1]["request"]) for c in listed)


async def test_a_create_gives_the_events_of_the_sse_stream(client):
    streamed = [e async for e in await client.responses.create(model="plain", input="hi", stream=True)]
    async with client.responses.connect() as conn:
        await conn.response.create(model="plain", input="hi")
        events = await until_done(conn)
    assert [e.type for e in events] == [e.type for e in streamed]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.status == "completed" and final.output_text == "Hello, world!"
    assert (await client.responses.retrieve(final.id)).output_text == "Hello, world!"  # stored as a POST's is


async def test_one_socket_carries_responses_in_turn(client):
    async with client.responses.connect() as conn:
        await conn.response.create(model="plain", input="one")
        await conn.response.create(model="plain", input="two")  # asked while the first runs: it waits
        events = await until_done(conn, 2)
        first = [e for e in events if e.type == "response.completed"][0].response
        await conn.response.create(model="plain", input="three", previous_response_id=first.id)
        third = (await until_done(conn))[-1].response
    ids = [e.response.id for e in events if e.type in ("response.created", "response.completed")]
    assert len(set(ids)) == 2 and ids[0] == ids[1] and ids[2] == ids[3]  # the first ended before the second began
    assert third.status == "completed" and third.previous_response_id == first.id


async def test_each_response_on_a_socket_is_a_request_of_its_keys(server):
    """Limits, usage and events count each response.create, not the socket."""
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=ONCE, max_retries=0) as once:
        async with once.responses.connect() as conn:
            await conn.response.create(model="plain", input="one")
            assert (await until_done(conn))[-1].type == "response.completed"
            await conn.response.create(model="plain", input="two")
            refused = (await until_done(conn))[-1]
    assert refused.type == "error" and refused.status == 429 and refused.error.code == "rate_limit_exceeded"
    assert refused.error.headers["Retry-After"]
    events = [json.loads(line[line.index("{"):]) for line in server.output().splitlines()
              if '"event":"inference"' in line and '"principal":"once"' in line]
    assert [(e["endpoint"], e["status"]) for e in events if e["status"] != 101] == [("/v1/responses", 200),
                                                                                   ("/v1/responses", 429)]
    assert [e for e in events if e["status"] == 200][0]["completion_tokens"] == 4


async def test_a_steer_reaches_the_running_response_through_its_successor(client, server):
    async with client.responses.connect() as conn:
        await conn.response.create(model="steer", input="count", max_output_tokens=200)
        events, first, sent = [], None, False
        async for event in conn:
            events.append(event)
            if event.type == "response.created" and first is None:
                first = event.response.id
            if event.type == "response.output_text.delta" and not sent:
                await conn.response.steer(input="STEER: stop counting", previous_response_id=first)
                sent = True
            if event.type in ("response.completed", "error"):
                break
    kinds = [e.type for e in events]
    accepted = next(e for e in events if e.type == "response.steer.accepted")
    assert accepted.steer.previous_response_id == first and accepted.steer.id
    assert kinds.count("response.created") == 2
    ended = next(e for e in events if e.type == "response.incomplete")  # the steered one ran to its own end
    assert ended.response.id == first and kinds.index("response.steer.accepted") < kinds.index("response.incomplete")
    successor = events[-1].response
    assert successor.previous_response_id == first and successor.output_text == "Turning now."
    assert captured(server, "STEER: stop counting")  # the successor was a request of its own, its input the steer


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


async def test_a_steer_waits_for_the_output_of_the_call_the_response_made(client, server):
    async with client.responses.connect() as conn:
        await conn.response.create(model="agent", input="Weather in Paris?", tools=[WEATHER])
        events = []
        async for event in conn:
            events.append(event)
            if event.type == "response.created":
                await conn.response.steer(input="STEER: in Celsius", previous_response_id=event.response.id)
            if event.type in ("response.steer.pending", "response.steer.failed", "error"):
                break
        call = next(e for e in events if e.type == "response.completed").response
        pending = events[-1]
        assert pending.type == "response.steer.pending", [e.type for e in events]
        (stub,) = pending.required_input
        assert stub.type == "function_call_output" and stub.call_id == call.output[0].call_id
        assert stub.name == "get_weather" and pending.steer.previous_response_id == call.id
        await conn.response.create(model="agent", previous_response_id=call.id, tools=[WEATHER], input=[
            {"type": "function_call_output", "call_id": stub.call_id, "output": "18 C"}])
        final = (await until_done(conn))[-1].response
    assert final.status == "completed" and final.output_text == "It is 18 C."
    assert captured(server, "STEER: in Celsius")  # the continuation carried the queued input


async def test_steering_with_nothing_running_fails_with_its_code(client):
    async with client.responses.connect() as conn:
        await conn.response.steer(input="hello", previous_response_id="resp_nothing")
        failed = await conn.recv()
        assert failed.type == "response.steer.failed" and failed.error.code == "response_not_found"
        assert failed.steer.previous_response_id == "resp_nothing" and failed.steer.input == "hello"
        await conn.response.create(model="plain", input="hi")
        done = (await until_done(conn))[-1].response
        await conn.response.steer(input="late", previous_response_id=done.id)
        late = await conn.recv()
        assert late.type == "response.steer.failed" and late.error.code == "response_already_completed"
        await conn.send({"type": "response.steer", "previous_response_id": done.id,
                         "input": [{"type": "message", "role": "assistant", "content": "x"}]})
        invalid = await conn.recv()
        assert invalid.type == "response.steer.failed" and invalid.error.code == "invalid_input"


def plain_answers_within(server, seconds: float) -> None:
    started = time.monotonic()
    req = urllib.request.Request(server.url + "/v1/responses", method="POST", headers={
        "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        data=json.dumps({"model": "steer", "input": "hi", "max_output_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=seconds) as r:
        assert json.loads(r.read())["status"] == "incomplete"
    assert time.monotonic() - started < seconds


async def test_a_closed_socket_cancels_its_running_response(client, server):
    async with client.responses.connect() as conn:
        await conn.response.create(model="steer", input="count", max_output_tokens=4000)
        async for event in conn:
            if event.type == "response.output_text.delta":
                break
    await asyncio.to_thread(plain_answers_within, server, 5.0)  # its slot was freed: not 4000 tokens later


async def test_the_upgrade_needs_a_key(server):
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with bad.responses.connect():
                pass
    assert refused.value.response.status_code == 401
    async with aiohttp.ClientSession() as s:
        async with s.get(server.url + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 426 and (await r.json())["error"]["code"] == "upgrade_required"
        with pytest.raises(aiohttp.WSServerHandshakeError) as foreign:
            await s.ws_connect(ws_url(server), headers={"Authorization": f"Bearer {KEY}",
                                                        "Origin": "https://evil.example"})
        assert foreign.value.status == 403


@pytest.fixture
async def raw(server):
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers={"Authorization": f"Bearer {KEY}"}) as ws:
            yield ws


async def test_bad_events_get_error_events_in_the_api_shape(raw):
    await raw.send_str("{not json")
    bad = await raw.receive_json(timeout=10)
    assert bad["type"] == "error" and bad["status"] == 400 and bad["error"]["code"] == "invalid_json"
    await raw.send_str(json.dumps({"type": "session.update"}))
    unknown = await raw.receive_json(timeout=10)
    assert unknown["error"]["code"] == "unknown_event_type" and unknown["error"]["param"] == "type"
    await raw.send_str(json.dumps({"type": "response.create", "model": "nope", "input": "hi"}))
    missing = await raw.receive_json(timeout=10)
    assert missing["type"] == "error" and missing["status"] == 404
    await raw.send_str(json.dumps({"type": "response.create", "model": "plain", "input": "hi"}))
    kinds = []
    while not kinds or kinds[-1] != "response.completed":
        kinds.append((await raw.receive_json(timeout=30))["type"])
    assert kinds[0] == "response.created"


def test_a_frame_past_the_body_bound_closes_with_1009(server):
    """A frame that says it is 100 MB: the socket closes on its header, nothing of it is read."""
    sock = upgraded(server)
    try:
        sock.sendall(bytes([0x81, 0x80 | 127]) + (100 << 20).to_bytes(8, "big") + os.urandom(4) + b"x" * 65536)
    except OSError:
        pass  # the server may close before the rest went
    sock.settimeout(10)
    seen = b""
    try:
        while chunk := sock.recv(65536):
            seen += chunk
    except OSError:
        pass
    sock.close()
    assert bytes([0x88]) in seen and (1009).to_bytes(2, "big") in seen[seen.index(bytes([0x88])):]
    plain_answers_within(server, 10.0)


async def test_a_flood_of_events_is_refused_and_closed(raw, server):
    for _ in range(10_000):
        await raw.send_str('{"type": "response.steer"}')
    seen = []
    async for message in raw:
        seen.append(json.loads(message.data))
    assert seen[-1]["type"] == "error" and seen[-1]["error"]["code"] == "rate_limit_exceeded"
    assert len(seen) <= 101 and raw.close_code == 1008
    await asyncio.to_thread(plain_answers_within, server, 10.0)


def frame(text: str) -> bytes:
    """A masked client text frame."""
    data, mask = text.encode(), os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def upgraded(server, rcvbuf: int = 0) -> socket.socket:
    """A raw socket through the WebSocket upgrade (its 101 read)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Bearer {KEY}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101")
    return sock


def test_a_client_that_never_reads_is_cut_off_and_the_model_keeps_serving(server):
    sock = upgraded(server, rcvbuf=4096)
    for _ in range(12):  # more than the socket's buffers hold
        sock.sendall(frame(json.dumps({"type": "response.create", "model": "steer", "input": "count",
                                       "max_output_tokens": 4000})))
    try:
        time.sleep(1.0)  # it writes until the buffers are full, then waits write_timeout (2 s) and cuts it off
        plain_answers_within(server, 5.0)
        deadline, cut = time.monotonic() + 60, []  # the socket still open: cut off by the server, not closed
        while not any(e["client_disconnected"] for e in cut) and time.monotonic() < deadline:
            time.sleep(0.2)
            cut = [json.loads(line[line.index("{"):]) for line in server.output().splitlines()
                   if '"event":"inference"' in line]
        # the response it stalled ended as a disconnect, the ones queued behind it never ran
        assert any(e["client_disconnected"] for e in cut) and sum(e["completion_tokens"] == 4000 for e in cut) < 12
    finally:
        sock.close()
