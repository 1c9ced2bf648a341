"""The capture store's bounds and its secrets, and the bounds on a model's name as a caller
gives it (issue 64: HIGH 3, 4 and 5), against the real app on scripted models.

- The store counts every byte it keeps: many keyless requests, each with 60 long headers, keep
  what it holds (measured from the records themselves, not its own counter) within
  ``capture.max_bytes``.
- A request refused at the door (401, 429) is kept as a line, not a capture, and requests from
  nobody never push out a key's captures.
- The key a request presented leaves no copy in a streamed capture (a Responses stream repeats
  ``instructions`` and ``metadata``), nor in ``/captures/{id}``, the kept file or a replay, nor
  across two writes of a stream.
- A model's name of megabytes is answered with a 404 of a bounded message, on every wire.
- Each finding of the red team's pass after the fix: a key the model spells in pieces, one
  token a write, is in no capture, read-back, page detail or kept file (the stream's writes are
  withheld, the answer kept with the key cut); a key escaped in a JSON body (``\\u0073k-...``)
  and a key sent as a header's name are cut; refusals, however many, never push out a key's
  captures (their lines are a fixed count apart)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import itertools
import json
import time

import pytest

from gateway.api.appkeys import CAPTURES
from gateway.app import create_app
from gateway.base.errors import MAX_MODEL_NAME
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.models.config.specs import CaptureConfig
from gateway.server import redaction
from gateway.server.captures import MAX_REFUSALS, CaptureStore, Record
from gateway.wire.readback import read_answer

ADMIN = "sk-bounds-admin-key-0123456789abcdef"
USER = "sk-bounds-user-key-9876543210fedcba"
LIMITED = "sk-bounds-limited-key-5555555555"
MSG = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}
FLOOD_HEADERS = {f"X-Flood-{i}": f"{i}-" + "v" * 1000 for i in range(60)}
SPELLED = [USER[:6], USER[6:13], USER[13:21], USER[21:]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("boundmodels")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.plain(d / "keyecho.gguf", ["Your key is ", *SPELLED, " - keep it."])  # a configured key, a token at a time
    return d


def app_for(write_config, models, capture: str, keys: bool = False, extra: str = ""):
    keys_yaml = (f"  api_keys:\n    ops: {{key: {ADMIN}, role: admin}}\n    alice: {{key: {USER}, role: user}}\n"
                 f"    slow: {{key: {LIMITED}, role: user, rpm: 1}}\n") if keys else ""
    return create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\n  capture: {capture}\n{keys_yaml}{extra}"
        f"models:\n  chat: {models}/plain.gguf\n  keyecho: {models}/keyecho.gguf\n")))


def held(value) -> int:
    """The bytes a value holds, counted here apart from the store's own counting: every
    string's UTF-8 and every byte string, in every field, header and frame."""
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return len(value.encode("utf-8", errors="surrogatepass"))
    if isinstance(value, dict):
        return sum(held(k) + held(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(held(v) for v in value)
    return 0


def true_size(store: CaptureStore) -> int:
    """What the captures hold (the refusals' lines are a fixed count apart: ``MAX_REFUSALS``)."""
    return sum(held(getattr(e, f.name)) for e in store.records.values() for f in dataclasses.fields(e))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# --- HIGH 3: the store is bounded by what it holds ------------------------------------------------

async def test_keyless_requests_with_long_headers_keep_the_store_within_max_bytes(aiohttp_client, write_config,
                                                                                 models):
    bound = 256 * 1024
    app = app_for(write_config, models, "{max_bytes: 256KiB}")
    client = await aiohttp_client(app)
    for _ in range(40):  # each with 60 KiB of headers: 2.4 MiB sent against a 256 KiB bound
        r = await client.post("/v1/chat/completions", json={"model": "chat", "max_tokens": 4, "messages": MSG},
                              headers=FLOOD_HEADERS)
        assert r.status == 200
        await r.read()
    store = app[CAPTURES]
    assert true_size(store) <= bound, f"the store holds {true_size(store)} bytes against a bound of {bound}"
    assert store.bytes <= bound and store.bytes >= true_size(store)  # its counter covers what it holds
    listing = await (await client.get("/captures")).json()
    assert 1 <= listing["count"] < 40 and listing["bytes"] <= listing["max_bytes"] == bound
    newest = await (await client.get(f"/captures/{listing['data'][0]['id']}")).json()
    assert newest["request"]["headers"]["X-Flood-0"] == FLOOD_HEADERS["X-Flood-0"]  # kept, within their bound


async def test_a_refused_request_is_a_line_not_a_capture(aiohttp_client, write_config, models):
    app = app_for(write_config, models, "true", keys=True)
    client = await aiohttp_client(app)
    body = {"model": "chat", "max_tokens": 4, "messages": MSG}
    r = await client.post("/v1/chat/completions", json=body, headers=FLOOD_HEADERS)  # no key
    assert r.status == 401
    r = await client.post("/v1/chat/completions", json=body, headers={**FLOOD_HEADERS, **bearer("sk-wrong-key")})
    assert r.status == 401
    for _ in range(2):  # rpm 1: the second is refused with 429
        r = await client.post("/v1/chat/completions", json=body, headers=bearer(LIMITED))
        await r.read()
    assert r.status == 429
    listing = await (await client.get("/captures", headers=bearer(ADMIN))).json()
    assert [row["status"] for row in listing["data"]] == [200]  # the one that was answered
    refused = listing["refused"]
    assert refused["count"] == 3 and [line["status"] for line in refused["recent"]] == [429, 401, 401]
    assert refused["recent"][0]["key"] == "slow" and refused["recent"][0]["code"] == "rate_limit_exceeded"
    assert refused["recent"][1]["key"] == "anonymous" and refused["recent"][1]["code"] == "invalid_api_key"
    for line in refused["recent"]:  # a line: no headers, no body
        assert set(line) == {"time", "status", "route", "key", "code", "request_id"}
        assert len(json.dumps(line)) < 300
    assert "X-Flood" not in json.dumps(listing)


async def test_requests_from_nobody_never_push_out_a_keys_captures(aiohttp_client, write_config, models):
    app = app_for(write_config, models, "{max_bytes: 64KiB}", keys=True)
    client = await aiohttp_client(app)
    r = await client.post("/v1/chat/completions", json={"model": "chat", "max_tokens": 4, "messages": MSG},
                          headers=bearer(USER))
    assert r.status == 200
    await r.read()
    mine = (await (await client.get("/captures", headers=bearer(ADMIN))).json())["data"][0]
    for _ in range(60):  # 3.6 MiB of headers from nobody against a 64 KiB store
        r = await client.post("/v1/chat/completions", json={"model": "chat", "messages": MSG},
                              headers={**FLOOD_HEADERS, **bearer("sk-nobody-at-all")})
        assert r.status == 401
    r = await client.get(f"/captures/{mine['id']}", headers=bearer(ADMIN))
    assert r.status == 200 and (await r.json())["key"] == "alice"
    store = app[CAPTURES]
    assert true_size(store) <= store.bytes <= 64 * 1024
    assert len(store.refusals) <= MAX_REFUSALS


_ids = itertools.count(1)


def _record(owner: str | None, size: int) -> Record:
    body = b"x" * size
    return Record(f"r{next(_ids)}", time.time(), "POST", "/v1/chat/completions", "/v1/chat/completions", "",
                  "rid", "chat", owner or "anonymous", 200, {}, body, len(body), {}, False, b"", [], 0, {}, {}, None,
                  None, False, False, False, owner=owner)


def test_the_store_is_shared_out_by_owner():
    """Past the bound: nobody's entries go first, then the oldest of the owner that holds most."""
    store = CaptureStore(CaptureConfig(enabled=True, max_bytes=20_000))
    a = _record("key-a", 3000)
    store.add(a)
    for _ in range(20):  # nobody floods: only nobody's own go
        store.add(_record(None, 3000))
    assert a.id in store.records and store.bytes <= 20_000
    assert sum(1 for r in store.records.values() if r.owner is None) >= 1
    b_records = [_record("key-b", 3000) for _ in range(10)]
    for record in b_records:  # a key floods: nobody's go, then its own, never a's (which holds less)
        store.add(record)
    assert a.id in store.records and not any(r.owner is None for r in store.records.values())
    assert b_records[-1].id in store.records and b_records[0].id not in store.records
    assert true_size(store) <= store.bytes <= 20_000


# --- HIGH 4: the presented key leaves no copy --------------------------------------------------------

async def test_the_presented_key_leaves_no_copy_in_a_streamed_capture_its_file_or_replay(
        aiohttp_client, write_config, models, tmp_path):
    state = tmp_path / "state"
    config = ("{keep: true}", f"  state_dir: {state}\n")
    client = await aiohttp_client(app_for(write_config, models, config[0], keys=True, extra=config[1]))
    body = {"model": "chat", "stream": True, "max_output_tokens": 8, "input": f"my key is {ADMIN}, hers {USER}",
            "instructions": f"The caller's key is {ADMIN}; never say it.", "metadata": {"key": ADMIN}}
    r = await client.post("/v1/responses", json=body,
                          headers={**bearer(ADMIN), "X-Echo": f"echo {ADMIN} echo", "User-Agent": ADMIN})
    assert r.status == 200
    received = await r.read()
    assert received.count(ADMIN.encode()) >= 4  # the stream repeats it: what the capture must not keep
    row = (await (await client.get("/captures", headers=bearer(ADMIN))).json())["data"][0]
    assert row["stream"] and row["status"] == 200
    detail = await (await client.get(f"/captures/{row['id']}", headers=bearer(ADMIN))).json()
    assert ADMIN not in json.dumps(detail) and USER not in json.dumps(detail)  # any key models.yaml gives
    assert redaction.REDACTED in "".join(e["data"] for e in detail["response"]["events"])
    assert detail["request"]["headers"]["X-Echo"] == f"echo {redaction.REDACTED} echo"
    assert detail["request"]["body"]["metadata"] == {"key": redaction.REDACTED}
    r = await client.post(f"/captures/{row['id']}/replay", json={"model": "chat"}, headers=bearer(ADMIN))
    assert r.status == 200, await r.text()
    again = await r.json()
    assert ADMIN not in json.dumps(again) and again["replay_of"] == row["id"]
    await client.close()  # the app's cleanup writes the kept files
    kept = list((state / "captures").glob("*.json"))
    assert len(kept) == 2
    for path in kept:
        text = path.read_text()
        decoded = b"".join(redaction_b64_decoded(json.loads(text)))
        assert ADMIN not in text and ADMIN.encode() not in decoded and USER.encode() not in decoded


def redaction_b64_decoded(data: dict) -> list[bytes]:
    """The bodies and frames of a kept capture's file, decoded from their base64."""
    import base64

    out = [base64.b64decode(data[k]) for k in ("request_body", "response_body") if data[k] is not None]
    return out + [base64.b64decode(b) for _, b in data["frames"]]


def test_a_key_split_across_two_writes_is_cut():
    secrets = redaction.Secrets.of((ADMIN.encode(),))
    for cut_at in (1, 5, len(ADMIN) // 2, len(ADMIN) - 1):
        stream = redaction.StreamCut(secrets)
        writes = [b'data: {"text": "a ' + ADMIN[:cut_at].encode(), ADMIN[cut_at:].encode() + b' b"}\n\n']
        out = b"".join(stream.feed(w) for w in writes) + stream.flush()
        assert out == b'data: {"text": "a [redacted] b"}\n\n'
    # a stream that ends inside the key leaves no part of it long enough to matter
    stream = redaction.StreamCut(secrets)
    out = stream.feed(b"tail " + ADMIN[:20].encode()) + stream.flush()
    assert ADMIN[:20].encode() not in out
    # a body cut by the bound in the middle of the key keeps no part of it
    assert ADMIN[:10].encode() not in secrets.bounded(b"x" * 90 + ADMIN.encode(), 100)
    # the key as a JSON string writes it (escaped) is cut too
    odd = 'sk-"quoted"\\key'
    assert odd.encode() not in redaction.Secrets.of((odd.encode(),)).cut(json.dumps({"k": odd}).encode())
    assert b'sk-\\"quoted\\"\\\\key' not in redaction.Secrets.of((odd.encode(),)).cut(json.dumps({"k": odd}).encode())


# --- HIGH 5: a model's name is bounded at the wire's edge ---------------------------------------------

LONG_NAME_ROUTES = [
    ("/v1/chat/completions", {"messages": MSG}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/messages", {"max_tokens": 8, "messages": MSG}),
    ("/v1/responses", {"input": "hi"}),
    ("/api/chat", {"messages": MSG}),
    ("/api/generate", {"prompt": "hi"}),
    ("/api/show", {}),
    ("/v1/embeddings", {"input": "hi"}),
]


@pytest.mark.parametrize("route, body", LONG_NAME_ROUTES, ids=[r for r, _ in LONG_NAME_ROUTES])
async def test_a_model_name_of_megabytes_gets_a_bounded_404(aiohttp_client, write_config, models, route, body):
    client = await aiohttp_client(app_for(write_config, models, "false"))
    name = "m" * (3 * 2**20)
    r = await client.post(route, data=io.BytesIO(json.dumps({**body, "model": name}).encode()), headers=JSON)
    text = await r.text()
    assert r.status == 404, text[:300]
    assert len(text) < 2 * MAX_MODEL_NAME + 400, f"a {len(text)}-byte answer to a name"
    assert "m" * 100 in text  # it still says which name: its beginning


async def test_a_long_name_in_a_query_is_bounded_too(aiohttp_client, write_config, models):
    client = await aiohttp_client(app_for(write_config, models, "false"))
    r = await client.get("/props", params={"model": "q" * 6000})
    text = await r.text()
    assert r.status == 404 and len(text) < 2 * MAX_MODEL_NAME + 400, text[:300]


# --- after the fix: what the red team's pass still found --------------------------------------------

SPELLING_ROUTES = [
    ("/v1/chat/completions", {"messages": MSG}),
    ("/v1/completions", {"prompt": "hi\n"}),  # the scripted model answers after a line's end
    ("/v1/messages", {"max_tokens": 32, "messages": MSG}),
    ("/v1/responses", {"input": "hi"}),
    ("/api/chat", {"messages": MSG}),
    ("/api/generate", {"prompt": "hi"}),
]


def strings(value) -> list[str]:
    """Every string in a JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def spells_no_key(text: str) -> bool:
    """Neither the key nor any of the pieces the model spelled it in."""
    return USER not in text and not any(piece in text for piece in SPELLED)


async def listed(client, n: int) -> list[dict]:
    """``GET /captures``' rows once it lists ``n`` (each request is kept as its handler ends,
    which may come a moment after its client read the answer's last byte)."""
    deadline = time.monotonic() + 120
    while len(rows := (await (await client.get("/captures", headers=bearer(ADMIN))).json())["data"]) < n:
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.02)
    return rows


@pytest.mark.parametrize("route, body", SPELLING_ROUTES, ids=[r for r, _ in SPELLING_ROUTES])
async def test_a_key_the_model_spells_in_pieces_is_in_no_capture_nor_its_file(aiohttp_client, write_config, models,
                                                                             tmp_path, route, body):
    state = tmp_path / "state"
    client = await aiohttp_client(app_for(write_config, models, "{keep: true}", keys=True,
                                          extra=f"  state_dir: {state}\n"))
    ask = {**body, "model": "keyecho"}
    if not route.startswith("/api/"):
        ask["stream"] = True
    r = await client.post(route, json=ask, headers=bearer(ADMIN))
    assert r.status == 200
    received = await r.read()
    # what the client read: the key in pieces, one a write, that the read-back joins (a
    # Responses stream also repeats the whole text at its end: that copy is cut as it is written)
    assert received.count(SPELLED[1].encode()) > received.count(USER.encode())
    assert USER in read_answer(route, True, received)["content"]
    # a stream that spells no key is kept as its writes (the control: nothing withheld needlessly)
    plain = await client.post(route, json={**ask, "model": "chat"}, headers=bearer(ADMIN))
    assert plain.status == 200
    await plain.read()
    rows = await listed(client, 2)
    assert [(row["model"], row["withheld"]) for row in rows] == [("chat", False), ("keyecho", True)]
    control = await (await client.get(f"/captures/{rows[0]['id']}", headers=bearer(ADMIN))).json()
    assert control["response"]["events"] and not control["response"]["withheld"]
    r = await client.get(f"/captures/{rows[1]['id']}", headers=bearer(ADMIN))
    detail = await r.json()
    assert spells_no_key(json.dumps(detail)) and spells_no_key("".join(strings(detail)))
    assert detail["withheld"] and detail["response"]["withheld"] and detail["response"]["events"] == []
    assert detail["answer"]["content"] == f"Your key is {redaction.REDACTED} - keep it."
    await client.close()  # the app's cleanup writes the kept files
    kept = list((state / "captures").glob("*.json"))
    assert len(kept) == 2
    for path in kept:
        text = path.read_text()
        decoded = b"".join(redaction_b64_decoded(json.loads(text))).decode("utf-8", errors="replace")
        assert spells_no_key(text) and spells_no_key(decoded)


async def test_a_key_escaped_in_a_json_body_is_cut(aiohttp_client, write_config, models):
    app = app_for(write_config, models, "true", keys=True)
    client = await aiohttp_client(app)
    escapes = ["\\u0073" + USER[1:], USER[:2] + "\\u002D" + USER[3:], "".join(f"\\u{ord(c):04X}" for c in USER)]
    raw = '{"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "mine: %s"}]}'
    for escaped in escapes:
        r = await client.post("/v1/chat/completions", data=raw % escaped, headers={**JSON, **bearer(ADMIN)})
        assert r.status == 200, await r.text()
        assert json.loads(raw % escaped)["messages"][0]["content"] == f"mine: {USER}"  # what the gateway read
    rows = (await (await client.get("/captures", headers=bearer(ADMIN))).json())["data"]
    assert len(rows) == len(escapes)
    for row in rows:
        detail = await (await client.get(f"/captures/{row['id']}", headers=bearer(ADMIN))).json()
        assert detail["request"]["body"]["messages"][0]["content"] == f"mine: {redaction.REDACTED}"
        assert USER not in json.dumps(detail, ensure_ascii=False) and USER not in detail["curl"]
    for record in app[CAPTURES].records.values():
        assert USER not in json.dumps(json.loads(record.request_body), ensure_ascii=False)


async def test_a_key_sent_as_a_headers_name_is_cut(aiohttp_client, write_config, models):
    client = await aiohttp_client(app_for(write_config, models, "true", keys=True))
    r = await client.post("/v1/chat/completions", json={"model": "chat", "max_tokens": 2, "messages": MSG},
                          headers={**bearer(ADMIN), USER: "1", f"X-{ADMIN}-Name": "v"})
    assert r.status == 200
    row = (await (await client.get("/captures", headers=bearer(ADMIN))).json())["data"][0]
    detail = await (await client.get(f"/captures/{row['id']}", headers=bearer(ADMIN))).json()
    names = list(detail["request"]["headers"])
    assert not any(USER in n or ADMIN in n for n in names), names
    assert redaction.REDACTED in names and f"X-{redaction.REDACTED}-Name" in names
    assert USER not in json.dumps(detail) and ADMIN not in json.dumps(detail)


async def test_refusals_however_many_never_push_out_a_keys_captures(aiohttp_client, write_config, models):
    bound = 64 * 1024
    app = app_for(write_config, models, "{max_bytes: 64KiB}", keys=True)
    client = await aiohttp_client(app)
    store = app[CAPTURES]
    body = {"model": "chat", "max_tokens": 4, "messages": MSG}
    for _ in range(200):  # alice fills most of the store, within it
        r = await client.post("/v1/chat/completions", json=body, headers=bearer(USER))
        assert r.status == 200
        await r.read()
        if store.bytes > bound * 0.6:
            break
    mine = {row["id"] for row in (await (await client.get("/captures?limit=1000", headers=bearer(ADMIN))).json())["data"]}
    assert store.bytes > bound * 0.6 and len(mine) == len(store.records)
    floods = MAX_REFUSALS + 150
    statuses = []
    for _ in range(floods + 1):  # rpm 1: the first is answered, every other refused with 429
        r = await client.post("/v1/chat/completions", json=body, headers=bearer(LIMITED))
        await r.read()
        statuses.append(r.status)
    assert statuses == [200] + [429] * floods
    listing = await (await client.get("/captures?limit=1000", headers=bearer(ADMIN))).json()
    assert mine <= {row["id"] for row in listing["data"]}  # not one of alice's pushed out
    refused = listing["refused"]
    assert refused["count"] == floods and refused["kept"] == len(refused["recent"]) == MAX_REFUSALS
    assert refused["by"] == [{"status": 429, "key": "slow", "count": floods}]
    assert true_size(store) <= store.bytes <= bound
