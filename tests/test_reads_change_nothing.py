"""No GET loads or unloads a model, against the real server process: a page on another site can
make a browser send any GET (``app.cross_site`` lets reads through, as the browser keeps the
answer from that page), so on a gateway without keys a cross-site ``GET /props?model=X`` once
loaded X and evicted the loaded model. Every GET route the application has is asked, as a
browser asks from another site, naming the model that is not loaded; the loaded one stays, with
the same worker, and the other stays unloaded. /props of a model that is not loaded answers
from its spec and GGUF header, as llama-server's answers while it sleeps."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from helpers import ServerProcess, request

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

pytestmark = pytest.mark.slow

CROSS_SITE = [
    {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"},  # fetch()
    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"},  # <img src=...>
    {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},  # a link
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("reads")
    tm.plain(d / "plain.gguf", ["Hello", ",", " world", "!"])
    tm.endless(d / "loop.gguf", [" tick", " tock"])
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\n  kv_cache_max_bytes: 0\n  max_loaded_models: 1\n"
                   f"models:\n  plain:\n    path: {d}/plain.gguf\n    n_ctx: 1024\n"
                   f"  loop:\n    path: {d}/loop.gguf\n    n_ctx: 2048\n    parallel: 2\n")
    with ServerProcess("--config", str(cfg), env={"HOME": str(d), "XDG_CACHE_HOME": str(d / "cache")}) as srv:
        srv.config = cfg
        yield srv


def get_routes(cfg) -> list[str]:
    """Every GET route of the application, its variable parts filled in."""
    app = create_app(load_config(cfg))
    paths = {route.resource.canonical for route in app.router.routes()
             if route.method in ("GET", "*") and route.resource is not None}
    return sorted(p.replace("{response_id}", "resp_nothing") for p in paths)


def get(srv: ServerProcess, path: str, headers: dict[str, str]) -> int:
    req = urllib.request.Request(srv.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read(1)  # a stream (/dashboard/live) is left after its first byte
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def states(srv: ServerProcess) -> dict[str, str]:
    return {m["id"]: m["state"] for m in srv.get("/models")[1]["data"]}


def test_no_get_from_another_site_loads_or_unloads_a_model(server):
    assert request(server.url + "/models/load", {"model": "plain"})[0] == 200
    pid = server.get("/health")[1]["workers"]["plain"]
    routes = get_routes(server.config)
    assert "/props" in routes and "/api/tags" in routes and "/v1/models" in routes  # the list is the app's own
    for path in routes:
        for headers in CROSS_SITE:
            for query in ("?model=loop&autoload=true", "?name=loop"):
                status = get(server, path + query, headers)
                # 501: Ollama's /api/pull...; 426: /v1/responses is a WebSocket's upgrade
                assert status in (200, 400, 404, 405, 426, 501), (path, headers, status)
    assert states(server) == {"plain": "ready", "loop": "unloaded"}
    assert server.get("/health")[1]["workers"] == {"plain": pid}  # the same worker: never unloaded and reloaded


def test_props_of_a_model_that_is_not_loaded_comes_from_its_spec_and_header(server):
    status, body = server.get("/props?model=loop", CROSS_SITE[0])
    assert status == 200, body
    assert body["model_alias"] == "loop" and body["is_sleeping"] is True
    assert body["default_generation_settings"]["n_ctx"] == 2048 and body["total_slots"] == 2
    assert body["chat_template"] and body["model_path"].endswith("loop.gguf")
    assert "temperature" in body["default_generation_settings"]["params"]
    assert states(server)["loop"] == "unloaded"
    # once a request loads it, its props are what its worker reported
    assert request(server.url + "/v1/completions", {"model": "loop", "prompt": "a", "max_tokens": 2})[0] == 200
    status, body = server.get("/props?model=loop")
    assert status == 200 and body["is_sleeping"] is False and body["default_generation_settings"]["n_ctx"] == 2048
    assert body["build_info"]


def test_a_page_on_another_site_still_cannot_load_with_a_post(server):
    status, body, _ = request(server.url + "/models/load", {"model": "loop"},
                              headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and body["error"]["code"] == "forbidden_origin"
