"""Fair queues across keys, priorities and ``may_load``, through the gateway's app with real
workers decoding scripted models (``ggufwriter.write_scripted_model``).

The scenes (``fairqueues.Gateway``) hold a model's two slots with long streams the test ends
itself, queue short requests behind them in a known arrival order, then free one slot: every
assertion is on the order the scheduler let them in (or a status), never on a time."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from fairqueues import BOUND, HOLD, ROOT, SLOTS, Gateway, auth

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fair")
    tm.endless(d / "loop.gguf", [" tick", " tock"], context_length=HOLD + 512)
    tm.plain(d / "plain.gguf", ["Hello", "!"])
    tm.plain(d / "emb.gguf", ["x", "y"])
    tm.plain(d / "pinned.gguf", ["Pinned", "."])
    return d


@pytest.fixture
async def gateway(aiohttp_client, files):
    """``make(keys, server="", models="")``: the app over ``loop`` (two slots) and any other
    models, the keys file (``server.api_keys_file``) holding ``keys`` beside an admin, ``ROOT``."""

    async def make(keys: str, server: str = "", models: str = "") -> Gateway:
        keys_file = files / "keys.yaml"
        keys_file.write_text(f"root: {{key: {ROOT}, role: admin}}\n{keys}")
        cfg = files / "models.yaml"
        cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys_file: {keys_file}\n"
                       f"  usage_db: ':memory:'\n{server}models:\n"
                       f"  loop:\n    path: {files}/loop.gguf\n    parallel: {SLOTS}\n    n_ctx: {HOLD + 256}\n"
                       f"{models}")
        app = create_app(load_config(cfg))
        client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
        return Gateway(client, app, keys_file)

    return make


USERS = "a: {key: a-key, role: user}\nb: {key: b-key, role: user}\n"


# --- two keys on one model ---------------------------------------------------------------------
async def test_a_second_keys_request_goes_before_the_first_keys_queue(gateway):
    gw = await gateway(USERS)
    await gw.hold("a-key")  # key A's first two answers fill both slots
    tasks = await gw.queue(*[(f"a{i}", "a-key", {}) for i in range(10)])
    tasks += await gw.queue(("b", "b-key", {}))
    order = await gw.drain(tasks)
    # B waited for at most one of A's answers, never for A's queue (first come would put it last)
    assert order.index("b") <= 1, order
    assert [n for n in order if n != "b"] == [f"a{i}" for i in range(10)]  # A's own, in its order


# --- priorities --------------------------------------------------------------------------------
PRIORITY_KEYS = ("bulk: {key: bulk-key, role: user, priority: batch}\n"
                 "norm: {key: norm-key, role: user}\n"
                 "fast: {key: fast-key, role: user, priority: interactive}\n")


async def test_interactive_first_a_lowered_request_waits_as_batch_and_a_raise_is_clamped(gateway):
    gw = await gateway(PRIORITY_KEYS)
    await gw.hold("bulk-key")  # batch work fills both slots...
    tasks = await gw.queue(("bulk1", "bulk-key", {}), ("bulk2", "bulk-key", {}),  # ...and queues more
                           ("fast-lowered", "fast-key", {"priority": "batch"}),
                           ("bulk-raised", "bulk-key", {"priority": "interactive"}),
                           ("norm", "norm-key", {}),
                           ("fast", "fast-key", {}))
    order = await gw.drain(tasks)
    # interactive into the next free slot, then normal; everything batch (the lowered interactive
    # request, the batch key's that asked for interactive) only once nothing else waits
    assert order[:2] == ["fast", "norm"], order
    assert set(order[2:]) == {"bulk1", "bulk2", "fast-lowered", "bulk-raised"}, order
    metrics = await gw.metrics()
    assert re.search(r'gguf_gateway_queue_wait_seconds_count\{key="fast",model="loop",priority="interactive"\} 1\.0',
                     metrics), metrics
    assert 'key="fast",model="loop",priority="batch"' in metrics  # its lowered request waited as batch
    assert 'key="bulk",model="loop",priority="interactive"' not in metrics


# --- a reload changes the terms of requests already waiting -----------------------------------
async def test_a_reload_that_raises_a_keys_priority_reorders_its_waiting_request(gateway):
    gw = await gateway(USERS + "h: {key: h-key, role: user}\n")
    await gw.hold("h-key")
    tasks = await gw.queue(("a", "a-key", {}), ("b", "b-key", {}))  # same terms: a first, as it came first
    r = await gw.reload(USERS.replace("b: {key: b-key, role: user}", "b: {key: b-key, role: user, priority: interactive}")
                        + "h: {key: h-key, role: user}\n")
    assert r.status == 200, await r.text()
    assert await gw.drain(tasks) == ["b", "a"]


async def test_a_reload_that_lowers_a_keys_weight_sends_its_waiting_requests_behind(gateway):
    gw = await gateway(USERS + "h: {key: h-key, role: user}\n")
    await gw.hold("h-key")
    tasks = await gw.queue(("a1", "a-key", {}), ("a2", "a-key", {}), ("b1", "b-key", {}), ("b2", "b-key", {}))
    # equal weights take turns (a1 b1 a2 b2); at a thousandth of b's weight, A's one answer weighs
    # as much as a thousand of B's
    r = await gw.reload(USERS.replace("a: {key: a-key, role: user}", "a: {key: a-key, role: user, weight: 0.001}")
                        + "h: {key: h-key, role: user}\n")
    assert r.status == 200, await r.text()
    assert await gw.drain(tasks) == ["a1", "b1", "b2", "a2"]


# --- may_load ----------------------------------------------------------------------------------
WIRES: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "chat": ("/v1/chat/completions", lambda m: {"model": m, "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 2}),
    "completions": ("/v1/completions", lambda m: {"model": m, "prompt": "hi", "max_tokens": 2}),
    "embeddings": ("/v1/embeddings", lambda m: {"model": m, "input": "hi"}),
    "responses": ("/v1/responses", lambda m: {"model": m, "input": "hi", "max_output_tokens": 2}),
    "messages": ("/v1/messages", lambda m: {"model": m, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    "ollama-chat": ("/api/chat", lambda m: {"model": m, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                                            "options": {"num_predict": 2}}),
    "ollama-generate": ("/api/generate", lambda m: {"model": m, "prompt": "hi", "stream": False,
                                                    "options": {"num_predict": 2}}),
}


def error_message(wire: str, body: dict[str, Any], code: str | None, param: str) -> str:
    """The message of an error answer, its shape checked as the wire has it (OpenAI's: its
    ``param`` and, unless None, its ``code``)."""
    if wire.startswith("ollama"):
        assert set(body) == {"error"} and isinstance(body["error"], str), body
        return body["error"]
    if wire == "messages":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        return body["error"]["message"]
    assert body["error"]["param"] == param and code in (None, body["error"]["code"]), body
    return body["error"]["message"]


async def test_a_key_that_may_not_load_gets_503_in_every_wire_until_an_admin_loads(gateway, files):
    models = (f"  plain: {files}/plain.gguf\n  emb:\n    path: {files}/emb.gguf\n    embeddings: true\n"
              f"  pinned:\n    path: {files}/pinned.gguf\n    pin: true\n")
    gw = await gateway("viewer: {key: viewer-key, may_load: false}\n", models=models)
    c = gw.client
    for wire, (path, body) in WIRES.items():
        model = "emb" if wire == "embeddings" else "plain"
        r = await c.post(path, headers=auth("viewer-key"), json=body(model))
        answer = await r.json()
        assert r.status == 503 and r.headers.get("Retry-After"), (wire, r.status, answer)
        message = error_message(wire, answer, "model_not_loaded", "model")
        assert repr(model) in message and "may_load: false" in message, (wire, message)
        if wire == "messages":
            assert answer["error"]["type"] in ("overloaded_error", "api_error"), answer
    # nothing was loaded by those requests
    states = {m["id"]: m["state"] for m in (await (await c.get("/models", headers=auth(ROOT))).json())["data"]}
    assert states["plain"] != "ready" and states["emb"] != "ready", states
    # a pinned model is usable without an admin loading it
    path, body = WIRES["chat"]
    assert (await c.post(path, headers=auth("viewer-key"), json=body("pinned"))).status == 200
    # an admin loads them; then the same requests are answered, in every wire
    for model in ("plain", "emb"):
        r = await c.post("/models/load", headers=auth(ROOT), json={"model": model})
        assert r.status == 200, await r.text()
    for wire, (path, body) in WIRES.items():
        r = await c.post(path, headers=auth("viewer-key"), json=body("emb" if wire == "embeddings" else "plain"))
        assert r.status == 200, (wire, await r.text())


# --- swaps: loads waiting for the same room ---------------------------------------------------
async def test_two_models_waiting_for_one_room_each_load_in_turn_and_take_the_room_made_for_them(gateway, files,
                                                                                               caplog):
    caplog.set_level("INFO")
    models = "".join(f"  {name}: {files}/plain.gguf\n" for name in ("one", "two", "three"))
    gw = await gateway(USERS, server="  max_loaded_models: 1\n  swap_hold_seconds: 0\n", models=models)
    path, body = WIRES["chat"]
    assert (await gw.client.post(path, headers=auth("a-key"), json=body("one"))).status == 200
    # both wait for the one room, each counting as loaded for the other until it leaves its wait
    answers = await asyncio.wait_for(asyncio.gather(*(gw.client.post(path, headers=auth(key), json=body(model))
                                                      for key, model in (("a-key", "two"), ("b-key", "three")))), BOUND)
    assert [r.status for r in answers] == [200, 200], [await r.text() for r in answers]
    lines = [r.getMessage() for r in caplog.records]
    swaps = [m.group(1) for line in lines if (m := re.match(r"swap: unloading '\w+' to load '(\w+)'", line))]
    loads = [m.group(1) for line in lines if (m := re.match(r"model '(\w+)' loaded", line))]
    assert sorted(swaps) == ["three", "two"], lines
    assert loads[1:] == swaps, lines  # each swap's room went to the model it was made for


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("priority", ["urgent", 7])
async def test_a_priority_that_is_not_one_is_400_naming_it_in_every_wire(gateway, files, priority):
    gw = await gateway(USERS, models=f"  emb:\n    path: {files}/emb.gguf\n    embeddings: true\n")
    for wire, (path, body) in WIRES.items():
        r = await gw.client.post(path, headers=auth("a-key"),
                                 json={**body("emb" if wire == "embeddings" else "loop"), "priority": priority})
        answer = await r.json()
        assert r.status == 400, (wire, answer)
        message = error_message(wire, answer, None, "priority")
        assert "priority" in message and "interactive" in message, (wire, message)
    assert gw.waiting() == [] and await gw.queued() == 0


# YAML's own spellings of the numbers (PyYAML reads a bare 1e308 as a string, refused as well)
@pytest.mark.parametrize("weight", ["0", "1.0e+308", "1e308", "-1", ".nan", ".inf"])
async def test_a_reload_with_a_weight_out_of_bounds_is_refused_and_the_keys_stay(gateway, weight, caplog):
    gw = await gateway("a: {key: a-key, role: user, priority: interactive}\nb: {key: b-key, role: user}\n")
    r = await gw.reload(f"a: {{key: a-key, role: user, weight: {weight}}}\nb: {{key: b-key, role: user}}\n")
    assert r.status == 409, await r.text()
    assert any("a.weight: must be a number >= 0.001 and <= 1000" in rec.getMessage() for rec in caplog.records)
    # the keys in force stay, with their terms: a's interactive request still goes first
    await gw.hold("b-key")
    tasks = await gw.queue(("b", "b-key", {}), ("a", "a-key", {}))
    assert await gw.drain(tasks) == ["a", "b"]


async def test_max_queue_bounds_a_keys_queue_and_leaves_it_empty(gateway):
    gw = await gateway(USERS, server="  max_queue: 3\n")
    await gw.hold("a-key")
    tasks = await gw.queue(*[(f"a{i}", "a-key", {}) for i in range(3)])
    over = await asyncio.gather(*(gw.client.post("/v1/chat/completions", headers=auth("a-key"), json={
        "model": "loop", "messages": [{"role": "user", "content": "more"}], "max_tokens": 3}) for _ in range(20)))
    for r in over:  # the key with the most waiting: its own newcomers are turned away
        body = await r.json()
        assert r.status == 429 and body["error"]["code"] == "queue_full" and r.headers.get("Retry-After"), body
    # another key's request takes the place of a's newest waiting one, which is turned away instead
    b = gw.short("b", "b-key")
    pushed = await asyncio.wait_for(tasks[2], 30)
    assert pushed == 429 and gw.ended == ["a2"]
    gw.ended.clear()
    assert sorted(await gw.drain([*tasks[:2], b])) == ["a0", "a1", "b"]
    assert await gw.queued() == 0 and gw.waiting() == []
    metrics = await gw.metrics()
    # each request let in told its wait once: a's two holders and two queued, and b's
    assert re.search(r'gguf_gateway_queue_wait_seconds_count\{key="a",model="loop",priority="normal"\} 4\.0',
                     metrics), metrics
    assert re.search(r'gguf_gateway_queue_wait_seconds_count\{key="b",model="loop",priority="normal"\} 1\.0', metrics)
    assert re.search(r'gguf_gateway_requests_queued\{model="loop"\} 0\.0', metrics)


async def test_a_client_that_leaves_while_queued_leaves_no_ghost(gateway):
    gw = await gateway(USERS)
    await gw.hold("a-key")
    leaving = await gw.queue(*[(f"gone{i}", "b-key", {}) for i in range(3)])
    for task in leaving:
        task.cancel()  # its connection closes while it waits
    await gw.until_queued(0)
    assert gw.waiting() == []
    gw.free()
    # the freed slot goes to the next request at once, not to a ghost: it is answered while the
    # other holder still runs
    r = await asyncio.wait_for(gw.client.post("/v1/chat/completions", headers=auth("b-key"), json={
        "model": "loop", "messages": [{"role": "user", "content": "next"}], "max_tokens": 3}), BOUND)
    assert r.status == 200 and gw.holders, await r.text()
    body = json.loads(await r.text())
    assert body["choices"][0]["finish_reason"] == "length"
    gw.free()
    assert await gw.queued() == 0 and gw.waiting() == []
