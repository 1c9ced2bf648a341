"""The tools the gateway runs itself, in the middle of an answer, on a real llama.cpp worker
running scripted models whose calls are fixed: web search answered by a loopback SearXNG
stand-in (its JSON API), MCP tools by a real MCP server written with the SDK
(``tests/mcp_server.py``). Each wire's own shapes, whole and streamed, read by the official
``anthropic`` and ``openai`` clients; the loop's bounds; the observation of each call."""

from __future__ import annotations

import anthropic
import pytest
from agents import call_model
from aiohttp import web

from gateway.app import create_app
from gateway.models import testmodels as tm
from gateway.models.config import load_config

S = tm.Special
URL = "https://llamas.example.org/andes"
SNIPPET = "Llamas were domesticated in the Andes of South America thousands of years ago."


def searxng_app(seen: list[str], results: list[dict] | None = None) -> web.Application:
    """A stand-in for SearXNG's JSON API (``/search?q=...&format=json``)."""
    async def search(request: web.Request) -> web.Response:
        if request.query.get("format") != "json":
            return web.Response(status=403, text="json format disabled")
        seen.append(request.query.get("q", ""))
        return web.json_response({"query": request.query.get("q"), "number_of_results": 1, "results": results or [
            {"url": URL, "title": "Llamas of the Andes", "content": SNIPPET, "engine": "duckduckgo",
             "publishedDate": None}], "answers": [], "suggestions": [], "unresponsive_engines": []})
    app = web.Application()
    app.router.add_get("/search", search)
    return app


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("hosted-loop")
    call_model(d / "searcher.gguf", "web_search", [' {"query":', ' "llamas"}'],
               ["Llamas", " live", " in", " the", " Andes", " (", URL, ")."])
    return d


async def gateway(aiohttp_client, models, tmp_path, searx_url: str | None, extra: str = ""):
    server = f"  web_search: {{searxng: '{searx_url}'}}\n" if searx_url else ""
    (tmp_path / "models.yaml").write_text(
        f"server:\n  models_dirs: []\n  state_dir: {tmp_path}/state\n{server}{extra}"
        f"models:\n  searcher: {models}/searcher.gguf\n")
    return await aiohttp_client(create_app(load_config(tmp_path / "models.yaml")))


@pytest.fixture
async def searx(aiohttp_server):
    seen: list[str] = []
    server = await aiohttp_server(searxng_app(seen))
    server.seen = seen
    return server


SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}


async def test_anthropic_web_search_runs_and_answers_in_its_own_blocks(aiohttp_client, models, tmp_path, searx):
    client = await gateway(aiohttp_client, models, tmp_path, str(searx.make_url("")).rstrip("/"))
    body = {"model": "searcher", "max_tokens": 60, "messages": [{"role": "user", "content": "Where do llamas live?"}],
            "tools": [SEARCH_TOOL]}
    r = await client.post("/v1/messages", json=body)
    payload = await r.json()
    assert r.status == 200, payload
    assert searx.seen == ["llamas"]
    kinds = [b["type"] for b in payload["content"]]
    assert kinds[:2] == ["server_tool_use", "web_search_tool_result"], kinds
    assert payload["content"][0]["input"] == {"query": "llamas"}
    results = payload["content"][1]["content"]
    assert results[0]["url"] == URL and results[0]["title"] == "Llamas of the Andes"
    text = "".join(b["text"] for b in payload["content"] if b["type"] == "text")
    assert "Andes" in text
    assert payload["usage"]["server_tool_use"]["web_search_requests"] == 1
    assert payload["stop_reason"] == "end_turn"
    # both generations' tokens are in the usage: the second prompt holds the first and the result
    assert payload["usage"]["input_tokens"] > 0 and payload["usage"]["output_tokens"] >= 8
    message = anthropic.types.Message.model_validate(payload)  # the official types read it
    assert message.content[1].type == "web_search_tool_result"


async def test_without_a_backend_web_search_is_dropped_as_before(aiohttp_client, models, tmp_path):
    client = await gateway(aiohttp_client, models, tmp_path, None)
    body = {"model": "searcher", "max_tokens": 30, "messages": [{"role": "user", "content": "hi"}],
            "tools": [SEARCH_TOOL]}
    r = await client.post("/v1/messages", json=body)
    assert r.status == 200, await r.text()
    assert r.headers["X-Gateway-Dropped-Tools"] == "web_search_20250305"
