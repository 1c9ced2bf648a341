"""The Responses WebSocket (GET /v1/responses with an upgrade) attacked from outside: a stranger
(no key, a page on another origin, a rebound Host), a user key held to its models and limits,
and a hostile client (huge frames, compressed frames, floods), against the real `gguf-gateway
serve` process with real llama.cpp inference on scripted models. Each threat's safe answer is
asserted, and that the model keeps serving others."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
import urllib.request
import zlib

import aiohttp
import pytest
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ROOT = "attack-root-key"
SCOPED = "attack-scoped-key"  # a user key held to the model "plain"
OTHER = "attack-other-key"  # a user key with every model
PARALLEL = "attack-parallel-key"  # a user key with one response at a time
ONCE = "attack-once-key"  # a user key with one request a minute


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses-socket-attacks")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "endless.gguf")
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\n  responses_store: 64\n  write_timeout: 2\n"
                   f"  api_keys:\n    root: {ROOT}\n"
                   f"    scoped: {{key: {SCOPED}, role: user, models: [plain]}}\n"
                   f"    other: {{key: {OTHER}, role: user}}\n"
                   f"    parallel: {{key: {PARALLEL}, role: user, max_parallel: 1}}\n"
                   f"    once: {{key: {ONCE}, role: user, rpm: 1}}\n"
                   f"models:\n  plain: {d}/plain.gguf\n  endless: {d}/endless.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ended(ws, count: int = 1, timeout: float = 60) -> list[dict]:
    """Events until the ``count``-th response ended (or an error event)."""
    events, n = [], 0
    while n < count:
        event = await ws.receive_json(timeout=timeout)
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            n += 1
    return events


def answers_within(server, seconds: float, model: str = "plain") -> None:
    """A plain POST from another client is answered within ``seconds``."""
    started = time.monotonic()
    req = urllib.request.Request(server.url + "/v1/responses", method="POST", headers={
        **auth(ROOT), "Content-Type": "application/json"},
        data=json.dumps({"model": model, "input": "hi", "max_output_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=seconds + 5) as r:
        assert json.loads(r.read())["status"] in ("completed", "incomplete")
    assert time.monotonic() - started < seconds


async def test_a_page_on_another_origin_cannot_open_a_socket(server):
    """Cross-site WebSocket hijacking: a browser sends its page's Origin (`null` from a sandboxed
    frame); without keys needed, that would be a stranger's socket."""
    async with aiohttp.ClientSession() as s:
        for origin in ("https://evil.example", "null", f"http://127.0.0.1:{server.port + 1}"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await s.ws_connect(ws_url(server), headers={**auth(ROOT), "Origin": origin})
            assert refused.value.status == 403, origin
        async with s.ws_connect(ws_url(server), headers={**auth(ROOT), "Origin": server.url}) as ws:
            await ws.send_json({"type": "response.create", "model": "plain", "input": "hi"})
            assert (await ended(ws))[-1]["type"] == "response.completed"


async def test_a_rebound_host_cannot_open_a_socket(server):
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await s.ws_connect(ws_url(server), headers={**auth(ROOT), "Host": f"evil.example:{server.port}"})
        assert refused.value.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as rebound:  # the page's own origin, as a browser sends it
            await s.ws_connect(ws_url(server), headers={"Host": f"evil.example:{server.port}",
                                                        "Origin": f"http://evil.example:{server.port}"})
        assert rebound.value.status == 403


async def test_an_event_cannot_switch_the_key_or_its_scope(server):
    """The key checked at the upgrade is each event's: a field in the event naming another key,
    or another model, changes nothing."""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(SCOPED)) as ws:
            await ws.send_json({"type": "response.create", "model": "endless", "input": "hi",
                                "authorization": f"Bearer {ROOT}", "headers": auth(ROOT), "api_key": ROOT})
            refused = (await ended(ws))[-1]
            assert refused["type"] == "error" and refused["status"] in (400, 403, 404), refused
            await ws.send_json({"type": "response.create", "model": "plain", "input": "hi"})
            assert (await ended(ws))[-1]["type"] == "response.completed"


async def test_another_keys_stored_response_cannot_be_continued(server):
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ROOT)) as ws:
            await ws.send_json({"type": "response.create", "model": "plain", "input": "secret"})
            mine = (await ended(ws))[-1]["response"]["id"]
        async with s.ws_connect(ws_url(server), headers=auth(OTHER)) as ws:
            await ws.send_json({"type": "response.create", "model": "plain", "input": "tell",
                                "previous_response_id": mine})
            refused = (await ended(ws))[-1]
            assert refused["type"] == "error" and refused["status"] == 404, refused
            await ws.send_json({"type": "response.steer", "previous_response_id": mine, "input": "x"})
            steer = await ws.receive_json(timeout=10)
            assert steer["type"] == "response.steer.failed" and steer["error"]["code"] == "response_not_found"


async def test_sockets_do_not_multiply_a_keys_parallel_limit(server):
    """A key with max_parallel 1 and two sockets: the second socket's response waits its turn
    or is refused, never runs beside the first."""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(PARALLEL)) as a, \
                s.ws_connect(ws_url(server), headers=auth(PARALLEL)) as b:
            await a.send_json({"type": "response.create", "model": "endless", "input": "x",
                               "max_output_tokens": 2000})
            assert (await a.receive_json(timeout=30))["type"] == "response.created"
            await b.send_json({"type": "response.create", "model": "plain", "input": "y"})
            second = (await ended(b))[-1]
            assert second["type"] == "error" and second["status"] == 429, second
            assert second["error"]["code"] == "rate_limit_exceeded"


def deflated(text: str) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(text.encode()) + c.flush(zlib.Z_SYNC_FLUSH)[:-4]


async def test_a_compressed_bomb_is_bounded_by_the_body_limit(server):
    """permessage-deflate: a small frame that inflates past server.max_body_bytes closes the
    socket (1009) and the model keeps serving."""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ROOT), compress=15) as ws:
            assert ws.compress, "the server negotiated no compression: nothing to bomb"
            bomb = '{"type": "response.create", "input": "' + "a" * (100 << 20) + '"}'
            await ws.send_str(bomb)
            message = await ws.receive(timeout=30)
            assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
            assert ws.close_code == 1009
    await asyncio.to_thread(answers_within, server, 10.0)


async def test_a_big_frame_does_not_stall_other_clients(server):
    """A frame just under the body bound, full of tiny JSON values, is parsed off the event
    loop and once, as a POST's body is: another client waits at most what the C parser holds the
    interpreter's lock (under a second here), not the seconds of walking and re-encoding it."""
    body = '{"type": "response.create", "model": "plain", "input": "hi", "metadata": {"x": [' + \
           ",".join(["0"] * 15_000_000) + "]}}"
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ROOT), max_msg_size=0) as ws:
            await ws.send_str(body)
            await asyncio.sleep(0.2)  # the frame arrived; parsing it takes seconds
            worst = 0.0
            for _ in range(10):
                started = time.monotonic()
                await asyncio.to_thread(server.get, "/health")
                worst = max(worst, time.monotonic() - started)
            await ended(ws)
    assert worst < 2.5, f"/health waited {worst:.1f} s behind one frame"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A gateway whose bodies are at most 1 MiB; its endless model's context long enough that a
    response on it outlasts what a test sends while it runs (a busy CI machine included)."""
    d = tmp_path_factory.mktemp("responses-socket-small")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "endless.gguf")
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\n  max_body_bytes: 1048576\n"
                   f"models:\n  plain: {d}/plain.gguf\n  endless:\n    path: {d}/endless.gguf\n    n_ctx: 65536\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


def rss(server) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


EMPTIES = ",".join(["{}"] * 130_000)  # 390 KB of JSON that is tens of MB once parsed


async def test_what_waits_on_a_socket_is_bounded_by_the_body_limit(small):
    """Sixteen queued creates (and sixteen steers) of frames that are small as bytes and huge as
    Python objects: what waits on a socket is at most server.max_body_bytes of frames."""
    before = rss(small)
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(small)) as ws:
            await ws.send_json({"type": "response.create", "model": "endless", "input": "x",
                                "max_output_tokens": 60000})  # running throughout: the creates wait behind it
            running = (await ws.receive_json(timeout=30))["response"]["id"]
            for _ in range(16):
                await ws.send_str('{"type": "response.create", "model": "plain", "input": "hi", '
                                  '"metadata": {"x": [' + EMPTIES + "]}}")
            for _ in range(16):
                await ws.send_str(json.dumps({"type": "response.steer", "previous_response_id": running,
                                              "input": [{"role": "user", "content": "y" * 300_000}]}))
            refused, steers = 0, []
            while len(steers) < 16 or refused < 14:
                event = await ws.receive_json(timeout=30)
                if event["type"] == "error":
                    assert event["status"] == 429 and event["error"]["code"] == "queue_full", event
                    refused += 1
                elif event["type"].startswith("response.steer."):
                    steers.append(event)
            grown = rss(small) - before
    assert refused == 14  # two frames of 390 KB fit 1 MiB
    assert all(e["type"] == "response.steer.failed" and e["error"]["code"] == "too_many_pending_steers"
               for e in steers)  # the queue holds the bound already
    assert grown < 400 << 20, f"the server grew {grown >> 20} MiB"
    await asyncio.to_thread(answers_within, small, 10.0)


async def test_a_steers_successor_is_a_request_its_key_pays_for(server):
    """The response a steer makes by itself is held to the key's limits as a create is: with
    one request a minute spent, it is refused, and the steer fails as never applied."""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ONCE)) as ws:
            await ws.send_json({"type": "response.create", "model": "endless", "input": "x",
                                "max_output_tokens": 1000})  # still running when the steer comes
            first = (await ws.receive_json(timeout=30))["response"]["id"]
            await ws.send_json({"type": "response.steer", "previous_response_id": first, "input": "more"})
            events = []
            while not events or events[-1]["type"] != "response.steer.failed":
                events.append(await ws.receive_json(timeout=30))
    kinds = [e["type"] for e in events]
    assert "response.steer.accepted" in kinds and "response.incomplete" in kinds
    refused = next(e for e in events if e["type"] == "error")
    assert refused["status"] == 429 and refused["error"]["code"] == "rate_limit_exceeded"
    assert events[-1]["error"]["code"] == "successor_creation_failed"
    assert "response.created" not in kinds  # the first one's was read above: no successor was made


BAD_CREATES = [
    ({"model": "plain", "input": 5}, 400),
    ({"model": "plain", "input": "hi", "tools": "x"}, 400),
    ({"model": "plain", "input": "hi", "previous_response_id": {"a": 1}}, 400),
    ({"model": ["plain"], "input": "hi"}, 400),
    ({"input": "hi"}, 400),
    ({"model": "plain", "input": "hi", "background": True}, 400),
    ({"model": "plain", "input": "hi", "max_output_tokens": -1}, 400),
    ({"model": "plain", "input": [{"type": "function_call_output", "call_id": "x", "output": "y"}],
      "previous_response_id": "resp_unknown"}, 404),
]


async def test_bad_creates_get_error_events_and_the_socket_serves_on(server):
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ROOT)) as ws:
            for body, status in BAD_CREATES:
                await ws.send_json({"type": "response.create", **body})
                event = (await ended(ws))[-1]
                assert event["type"] == "error" and event["status"] == status, (body, event)
                assert set(event["error"]) >= {"message", "type", "code", "param"}
                assert "Traceback" not in event["error"]["message"]
            await ws.send_bytes(b'\xff{"type": "response.create"}')
            assert (await ws.receive_json(timeout=10))["error"]["code"] == "invalid_json"
            await ws.send_str(json.dumps({"type": ["response.create"]}))
            assert (await ws.receive_json(timeout=10))["error"]["code"] == "unknown_event_type"
            await ws.send_str(json.dumps({"type": "response.steer", "previous_response_id": ["x"], "input": "y"}))
            assert (await ws.receive_json(timeout=10))["error"]["code"] == "invalid_input"
            await ws.send_json({"type": "response.create", "model": "plain", "input": "hi"})
            assert (await ended(ws))[-1]["type"] == "response.completed"
    assert "Traceback" not in server.output()


async def test_a_ping_flood_is_answered_and_the_socket_serves_on(server):
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ROOT), autoping=True) as ws:
            for _ in range(5000):
                await ws.ping(b"x" * 100)
            await ws.send_json({"type": "response.create", "model": "plain", "input": "hi"})
            assert (await ended(ws))[-1]["type"] == "response.completed"


def test_a_half_closed_socket_frees_its_models_slot(server):
    """The client shuts its side of the TCP connection mid-generation, without a close frame."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Bearer {ROOT}\r\n\r\n").encode())
    data = json.dumps({"type": "response.create", "model": "endless", "input": "x",
                       "max_output_tokens": 3900}).encode()
    mask = os.urandom(4)
    sock.sendall(bytes([0x81, 0x80 | 126]) + len(data).to_bytes(2, "big") + mask
                 + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    seen = b""
    while b"output_text.delta" not in seen:
        seen += sock.recv(65536)
    sock.shutdown(socket.SHUT_WR)
    try:
        answers_within(server, 8.0, model="endless")  # its slot was freed: not 3900 tokens later
    finally:
        sock.close()


async def test_a_key_revoked_while_its_socket_is_open_creates_nothing_more(tmp_path):
    tm.plain(tmp_path / "plain.gguf", ["Hello", ",", " world", "!"])
    cfg = tmp_path / "models.yaml"
    keys = f"  api_keys:\n    root: {ROOT}\n"
    models = f"models:\n  plain: {tmp_path}/plain.gguf\n"
    cfg.write_text(f"server:\n  discover_default_stores: false\n{keys}    victim: {{key: {OTHER}, role: user}}\n"
                   + models)
    with ServerProcess("--config", str(cfg)) as srv:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(ws_url(srv), headers=auth(OTHER)) as ws:
                await ws.send_json({"type": "response.create", "model": "plain", "input": "hi"})
                assert (await ended(ws))[-1]["type"] == "response.completed"
                cfg.write_text(f"server:\n  discover_default_stores: false\n{keys}" + models)
                async with s.post(srv.url + "/config/reload", headers=auth(ROOT)) as r:
                    assert r.status == 200, await r.text()
                await ws.send_json({"type": "response.create", "model": "plain", "input": "hi"})
                refused = (await ended(ws))[-1]
        assert refused["type"] == "error" and refused["status"] == 401, refused
        assert refused["error"]["code"] == "invalid_api_key"


async def test_closing_with_responses_queued_frees_the_model(server):
    """Closed while one response runs, two wait and a steer is held: nothing of it runs on."""
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(server), headers=auth(ROOT)) as ws:
            await ws.send_json({"type": "response.create", "model": "endless", "input": "x", "max_output_tokens": 3900})
            running = (await ws.receive_json(timeout=30))["response"]["id"]
            for _ in range(2):
                await ws.send_json({"type": "response.create", "model": "endless", "input": "y",
                                    "max_output_tokens": 3900})
            await ws.send_json({"type": "response.steer", "previous_response_id": running, "input": "z"})
            while (await ws.receive_json(timeout=30))["type"] != "response.steer.accepted":
                pass
    await asyncio.to_thread(answers_within, server, 8.0, "endless")


async def test_each_socket_counts_against_the_connection_limit(tmp_path):
    """Thousands of sockets cannot get past server.max_connections: each one is a connection,
    and once they hold them all, the next is refused with a 503 (and freed when they close)."""
    tm.plain(tmp_path / "plain.gguf", ["Hello", ",", " world", "!"])
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  max_connections: 3\n"
                   f"models:\n  plain: {tmp_path}/plain.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        async with aiohttp.ClientSession() as s:
            sockets = [await s.ws_connect(ws_url(srv)) for _ in range(3)]
            with pytest.raises((aiohttp.WSServerHandshakeError, aiohttp.ServerDisconnectedError,
                                aiohttp.ClientOSError)) as refused:
                await s.ws_connect(ws_url(srv))
            if isinstance(refused.value, aiohttp.WSServerHandshakeError):
                assert refused.value.status == 503
            for ws in sockets:
                await ws.close()
        await asyncio.sleep(0.5)
        assert srv.get("/health")[0] == 200


def test_a_client_that_never_reads_leaves_no_traceback(server):
    """Cut off by write_timeout mid-stream, with responses queued and a steer sent: an ordinary
    disconnect in the log, never an unhandled error."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Bearer {ROOT}\r\n\r\n").encode())
    for text in [json.dumps({"type": "response.create", "model": "endless", "input": "x",
                             "max_output_tokens": 3900})] * 3 + ['{"type": "nope"}'] * 50:
        data, mask = text.encode(), os.urandom(4)
        sock.sendall(bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
    try:
        before = server.output().count('"client_disconnected":true')
        deadline = time.monotonic() + 90
        while server.output().count('"client_disconnected":true') == before and time.monotonic() < deadline:
            time.sleep(0.2)  # it writes until the buffers are full, then waits write_timeout (2 s)
        assert server.output().count('"client_disconnected":true') > before, "never cut off"
        answers_within(server, 8.0, "endless")
    finally:
        sock.close()
    time.sleep(0.5)
    assert "Traceback" not in server.output() and "unhandled error" not in server.output()
