"""The scheduler attacked from outside, in process against real worker processes and scripted
models: loads that wait for room together, clients that leave at each stage of a swap, and what
each leaves behind (``/admin/queues`` empty, a new request served at once)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

ROOT = "root-key"
HEADERS = {"Authorization": f"Bearer {ROOT}"}


def chat(model: str, n: int = 2, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": n, **kw}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("scheduler")
    for name in "abc":
        tm.endless(d / f"{name}.gguf", context_length=8192)
    return d


def swap_config(write_config, files, extra: str = ""):
    return load_config(write_config(
        f"server:\n  discover_default_stores: false\n  api_keys:\n    root: {ROOT}\n"
        f"  max_loaded_models: 1\n  swap_hold_seconds: 0.2\n  max_swap_wait: 2\n  load_timeout: 20\n{extra}"
        "models:\n" + "".join(f"  {n}:\n    path: {files}/{n}.gguf\n" for n in "abc")))


async def post(client, body):
    began = time.monotonic()
    r = await client.post("/v1/chat/completions", json=body, headers=HEADERS)
    return r.status, time.monotonic() - began, await r.text()


async def test_two_loads_waiting_for_one_place_do_not_wait_for_each_other(aiohttp_client, write_config, files):
    """Room for one model, one loaded, and requests for two others at once: each load is one swap
    after the other, not both waiting (each counting the other's load under way as a loaded
    model) until the load timeout."""
    client = await aiohttp_client(create_app(swap_config(write_config, files)))
    assert (await post(client, chat("a")))[0] == 200
    answers = await asyncio.gather(post(client, chat("b")), post(client, chat("c")))
    for status, seconds, text in answers:
        assert status == 200, text
        assert seconds < 15, seconds
    queues = await (await client.get("/admin/queues", headers=HEADERS)).json()
    assert queues == {"queues": []}
