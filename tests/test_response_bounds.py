"""What a caller can make the Responses store keep, and the bound on ``metadata`` (issue 64's
red-team pass: one key emptied every other key's stored responses with 36 requests of 8 MiB of
``metadata``), against the real app on a scripted model.

- ``metadata`` is bounded as OpenAI bounds it (16 pairs, keys of 64 characters, string values of
  512) on Responses and Chat Completions, and Anthropic's (``user_id`` alone, 256 characters):
  anything past it is a 400 in the wire's error shape naming ``metadata``.
- The store is shared out by owner: a user key's flood of stored responses, past the count or
  past the bytes, pushes out its own, never the admin's, and the store holds what it counts."""

from __future__ import annotations

import io
import json

import pytest

from gateway.api.appkeys import RESPONSES
from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config
from gateway.server.response_store import ResponseStore

ADMIN = "sk-respbounds-admin-0123456789abcdef"
USER = "sk-respbounds-user-9876543210fedcba"
OTHER = "sk-respbounds-other-5555555555555555"
MSG = [{"role": "user", "content": "hi"}]
# the most metadata OpenAI allows: what a flood of stores may carry in each
FULL = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("respbounds")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    return d


def app_for(write_config, models, store: int = 1000):
    return create_app(load_config(write_config(
        f"server:\n  discover_default_stores: false\n  responses_store: {store}\n"
        f"  api_keys:\n    ops: {{key: {ADMIN}, role: admin}}\n    alice: {{key: {USER}, role: user}}\n"
        f"    bob: {{key: {OTHER}, role: user}}\n"
        f"models:\n  chat: {models}/plain.gguf\n")))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def post(client, path: str, body: dict, key: str):
    """``body`` as JSON, from a stream: a body of megabytes is not sent as one bytes object."""
    return await client.post(path, data=io.BytesIO(json.dumps(body).encode()),
                             headers={**bearer(key), "Content-Type": "application/json"})


async def respond(client, key: str, **body):
    r = await post(client, "/v1/responses", {"model": "chat", "max_output_tokens": 2, **body}, key)
    return r.status, await r.json()


def true_size(store: ResponseStore) -> int:
    """What the store's entries hold, counted here apart from its own counter: each response's
    JSON and id."""
    return sum(len(data) + len(rid) for owned in store._owned.values() for rid, data in owned.items())


# --- metadata: bounded as the wire's own API bounds it -------------------------------------------

BAD_METADATA = [
    ({f"k{i}": "v" for i in range(17)}, "object_above_max_properties", "at most 16 properties"),
    ({"k" * 65: "v"}, "string_above_max_length", "at most 64 characters"),
    ({"k": "v" * 513}, "string_above_max_length", "maximum length 512"),
    ({"k": "M" * (4 << 20)}, "string_above_max_length", "maximum length 512"),
    ({"M" * (4 << 20): "v"}, "string_above_max_length", "at most 64 characters"),
    ({"k": 1}, "invalid_type", "expected a string"),
    ({"k": {"nested": "v"}}, "invalid_type", "expected a string"),
    ("a string", "invalid_type", "expected an object"),
]


@pytest.mark.parametrize(("metadata", "code", "says"), BAD_METADATA)
async def test_openai_metadata_past_its_bounds_is_a_400_naming_it(aiohttp_client, write_config, models,
                                                                  metadata, code, says):
    client = await aiohttp_client(app_for(write_config, models))
    for path, body in (("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
                       ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2})):
        r = await post(client, path, {"model": "chat", "metadata": metadata, **body}, USER)
        text = await r.text()
        assert r.status == 400, (path, text[:300])
        error = (await r.json())["error"]
        assert error["param"] == "metadata" and error["code"] == code and says in error["message"], error
        assert error["type"] == "invalid_request_error" and len(text) < 1000  # the caller's value quoted bounded


async def test_metadata_within_openais_bounds_is_answered_and_repeated(aiohttp_client, write_config, models):
    client = await aiohttp_client(app_for(write_config, models))
    status, body = await respond(client, USER, input="hi", metadata=FULL)
    assert status == 200 and body["metadata"] == FULL
    r = await client.post("/v1/chat/completions", json={"model": "chat", "messages": MSG, "max_tokens": 2,
                                                        "metadata": FULL, "store": True}, headers=bearer(USER))
    assert r.status == 200


async def test_a_text_format_repeats_its_own_fields_only(aiohttp_client, write_config, models):
    client = await aiohttp_client(app_for(write_config, models))
    status, body = await respond(client, USER, input="hi", text={"format": {"type": "text", "junk": "M" * 100_000}})
    assert status == 200 and body["text"]["format"] == {"type": "text"}
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    status, body = await respond(client, USER, input="hi", text={"format": {
        "type": "json_schema", "name": "s", "schema": schema, "strict": True, "junk": "M" * 100_000}})
    assert status == 200 and body["text"]["format"] == {"type": "json_schema", "name": "s", "schema": schema,
                                                        "strict": True}


@pytest.mark.parametrize(("metadata", "says"), [
    ({"user_id": "u" * 257}, "at most 256 characters"),
    ({"user_id": "u", "other": "M" * (4 << 20)}, "Extra inputs are not permitted"),
    ({"user_id": 5}, "must be a string"),
    ([], "must be an object"),
])
async def test_anthropic_metadata_past_its_bounds_is_a_400(aiohttp_client, write_config, models, metadata, says):
    client = await aiohttp_client(app_for(write_config, models))
    body = {"model": "chat", "max_tokens": 2, "messages": MSG, "metadata": metadata}
    r = await post(client, "/v1/messages", body, USER)
    text = await r.text()
    assert r.status == 400, text[:300]
    answer = await r.json()
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"].startswith("metadata") and says in answer["error"]["message"]
    assert len(text) < 1000
    r = await client.post("/v1/messages", json={**body, "metadata": {"user_id": "u" * 256}}, headers=bearer(USER))
    assert r.status == 200


# --- the store: shared out by owner -----------------------------------------------------------------

async def test_a_flood_of_stores_past_the_count_pushes_out_the_flooders_own(aiohttp_client, write_config, models):
    app = app_for(write_config, models, store=6)
    client = await aiohttp_client(app)
    status, kept = await respond(client, ADMIN, input="remember 42")
    assert status == 200
    status, bobs = await respond(client, OTHER, input="bob's")
    assert status == 200
    flood = []
    for _ in range(20):
        status, body = await respond(client, USER, input="x", metadata=FULL)
        assert status == 200
        flood.append(body["id"])
    for key, rid in ((ADMIN, kept["id"]), (OTHER, bobs["id"])):  # each continues its own
        status, body = await respond(client, key, input="and?", previous_response_id=rid)
        assert status == 200, body
    assert len(app[RESPONSES]) <= 6
    assert (await client.get(f"/v1/responses/{flood[-1]}", headers=bearer(USER))).status == 200
    assert (await client.get(f"/v1/responses/{flood[0]}", headers=bearer(USER))).status == 404  # its own went


async def test_a_flood_of_stores_past_the_bytes_keeps_another_keys_and_the_bound(aiohttp_client, write_config,
                                                                                 models):
    app = app_for(write_config, models)
    bound = 128 * 1024
    app[RESPONSES].max_bytes = bound  # the flood below sends about 3 times as much
    client = await aiohttp_client(app)
    status, kept = await respond(client, ADMIN, input="remember 42")
    assert status == 200
    for _ in range(40):
        status, body = await respond(client, USER, input="x", metadata=FULL, instructions="i" * 2000)
        assert status == 200
    assert (await client.get(f"/v1/responses/{kept['id']}", headers=bearer(ADMIN))).status == 200
    status, body = await respond(client, ADMIN, input="and?", previous_response_id=kept["id"])
    assert status == 200, body
    store = app[RESPONSES]
    assert true_size(store) <= store.bytes <= bound, (true_size(store), store.bytes)
    assert store.bytes >= bound // 2  # the flood filled it
