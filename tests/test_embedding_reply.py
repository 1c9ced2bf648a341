"""An embedding reply's JSON (thousands of numbers: milliseconds to write) is made off the event
loop, in every wire that returns vectors, and is the same JSON the loop would have written."""

from __future__ import annotations

import json
import threading
import types

import pytest

from gateway.api import common
from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

ROUTES = {"/v1/embeddings": {"input": ["one", "two", "three"]}, "/api/embed": {"input": ["one", "two", "three"]},
          "/api/embeddings": {"prompt": "one"}}


@pytest.mark.parametrize("path", list(ROUTES))
async def test_vectors_are_written_as_json_off_the_event_loop(aiohttp_client, write_config, tmp_path, monkeypatch,
                                                             path):
    tm.plain(tmp_path / "emb.gguf", ["x"])
    cfg = load_config(write_config(f"server:\n  discover_default_stores: false\n"
                                   f"models:\n  emb:\n    path: {tmp_path}/emb.gguf\n    embeddings: true\n"))
    made: list[tuple[bool, str]] = []  # (on the loop's thread, the JSON made)

    def dumps(body):
        made.append((threading.current_thread() is threading.main_thread(), out := json.dumps(body)))
        return out

    monkeypatch.setattr(common, "json", types.SimpleNamespace(dumps=dumps))
    client = await aiohttp_client(create_app(cfg))
    try:
        r = await client.post(path, json={"model": "emb", **ROUTES[path]})
        assert r.status == 200, await r.text()
        text = await r.text()
        assert r.content_type == "application/json"
        (on_loop, written), = made
        assert not on_loop and text == written
        body = json.loads(text)
        vectors = [d["embedding"] for d in body["data"]] if "data" in body else body.get("embeddings") \
            or [body["embedding"]]
        assert len(vectors) == len(ROUTES[path].get("input", [0])) and all(len(v) > 8 for v in vectors)
    finally:
        await client.close()
