"""The gateway as one MCP endpoint (``POST /mcp``), in-process, driven by the official ``mcp``
SDK's streamable HTTP client and by raw HTTP: the configured servers' tools listed as
``<server>_<tool>`` for the keys that may use them, a call that answers, one that fails (a
result marked isError), a key kept from a server, a missing key, a body too large, a client
that leaves mid-call.

The servers behind it are the gateway's own seam (``tools/hosted.McpTools``), here a small class
whose tools really run (``Servers``); the gateway's connections to real MCP servers are tested
with ``tools/mcpservers``."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Any

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from gateway.api.appkeys import MCP_SERVERS
from gateway.api.mcpserver import resolve
from gateway.app import create_app
from gateway.models.config import load_config
from gateway.tools.hosted import CallOutcome, ToolError, ToolInfo

ADMIN, ALICE = "admin-key", "alice-key"
SCHEMA = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}


class Servers:
    """Three configured servers: ``math`` (``add``, ``fail``, ``slow``), ``files-ro`` (``read_note``),
    whose name holds a ``-`` and its tool a ``_``, and ``down``, whose list fails."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.slow_started = asyncio.Event()
        self.slow_cancelled = asyncio.Event()
        self.notes = {"todo": "buy milk"}

    @property
    def names(self) -> list[str]:
        return ["math", "files-ro", "down"]

    def status(self) -> list[dict[str, Any]]:
        return [{"name": "math", "transport": "stdio", "state": "ready", "tools": ["add", "fail", "slow"],
                 "error": None, "calls": sum(1 for c in self.calls if c[0] == "math")},
                {"name": "files-ro", "transport": "http", "state": "idle", "tools": [], "error": None, "calls": 0},
                {"name": "down", "transport": "stdio", "state": "failed", "tools": [],
                 "error": "the program exited with 1", "calls": 0}]

    async def tools(self, server: str) -> list[ToolInfo]:
        if server == "math":
            return [ToolInfo("add", "Add two numbers", SCHEMA), ToolInfo("fail", "Always fails"),
                    ToolInfo("slow", "Takes its time")]
        if server == "files-ro":
            return [ToolInfo("read_note", "A note by name",
                             {"type": "object", "properties": {"name": {"type": "string"}}})]
        raise ToolError("the program exited with 1")

    async def call(self, server: str, tool: str, arguments: dict, *, timeout: float | None = None) -> CallOutcome:
        self.calls.append((server, tool, arguments))
        if (server, tool) == ("math", "add"):
            total = arguments["a"] + arguments["b"]
            return CallOutcome(str(total), bytes=len(str(total)))
        if (server, tool) == ("math", "fail"):
            raise ToolError("the tool said no", "error")
        if (server, tool) == ("math", "slow"):
            self.slow_started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.slow_cancelled.set()
                raise
            return CallOutcome("late")
        if (server, tool) == ("files-ro", "read_note"):
            name = arguments.get("name", "")
            if name not in self.notes:
                return CallOutcome(f"no note {name!r}", is_error=True)
            return CallOutcome(self.notes[name])
        raise ToolError(f"unknown tool {tool!r}")


@pytest.fixture
def servers() -> Servers:
    return Servers()


@pytest.fixture
async def gateway(aiohttp_client, write_config, servers):
    cfg = load_config(write_config(
        "server:\n  models_dirs: []\n  discover_default_stores: false\n  max_body_bytes: 65536\n"
        f"  api_keys:\n    root: {{key: {ADMIN}, role: admin}}\n"
        f"    alice: {{key: {ALICE}, role: user, mcp: [math]}}\n"))
    app = create_app(cfg)
    app[MCP_SERVERS] = servers
    return await aiohttp_client(app)


@asynccontextmanager
async def connected(gateway, key: str | None, mode: str = "auto"):
    """The SDK's client on /mcp with ``key``: ``auto`` speaks the newest protocol (one request
    per exchange), ``legacy`` the initialize handshake of 2025's (as Claude Code and Codex do)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(str(gateway.make_url("/mcp")), http_client=http),
                          mode=mode) as client:
            yield client


def text_of(result) -> str:
    return "".join(part.text for part in result.content)


def test_a_name_is_split_by_the_longest_server_that_prefixes_it():
    assert resolve("files-ro_read_note", ["files", "files-ro"]) == ("files-ro", "read_note")
    assert resolve("a_b_c", ["a", "a_b"]) == ("a_b", "c")
    assert resolve("a_b_c", ["a"]) == ("a", "b_c")
    assert resolve("math_", ["math"]) is None and resolve("other_add", ["math"]) is None


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_sdk_client_lists_every_servers_tools_and_calls_them(gateway, servers, mode):
    async with connected(gateway, ADMIN, mode) as client:
        listed = await client.list_tools()
        tools = {t.name: t for t in listed.tools}
        # the server whose list fails is left out; the others are listed
        assert set(tools) == {"math_add", "math_fail", "math_slow", "files-ro_read_note"}
        assert tools["math_add"].description == "Add two numbers" and tools["math_add"].input_schema == SCHEMA

        result = await client.call_tool("math_add", {"a": 2, "b": 40})
        assert result.is_error is False and text_of(result) == "42"
        result = await client.call_tool("files-ro_read_note", {"name": "todo"})
        assert result.is_error is False and text_of(result) == "buy milk"
        assert servers.calls[-2:] == [("math", "add", {"a": 2, "b": 40}), ("files-ro", "read_note", {"name": "todo"})]

        failed = await client.call_tool("math_fail", {})  # a ToolError: a result the model reads
        assert failed.is_error is True and text_of(failed) == "the tool said no"
        refused = await client.call_tool("files-ro_read_note", {"name": "nope"})  # the server said it failed
        assert refused.is_error is True and "no note" in text_of(refused)

        with pytest.raises(MCPError) as err:  # no such server: the protocol's error
            await client.call_tool("nothing_here", {})
        assert err.value.code == -32602 and "Unknown tool" in err.value.message


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_user_key_sees_and_calls_only_its_servers(gateway, servers, mode):
    async with connected(gateway, ALICE, mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"math_add", "math_fail", "math_slow"}
        assert text_of(await client.call_tool("math_add", {"a": 1, "b": 2})) == "3"
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("files-ro_read_note", {"name": "todo"})
    assert not any(c[0] == "files-ro" for c in servers.calls)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def rpc(method: str, params: dict | None = None, id_: int = 2) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params is not None else {})}


async def test_raw_http_needs_a_key_and_a_body_within_bounds(gateway):
    r = await gateway.post("/mcp", json=INIT, headers=ACCEPT)
    assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    r = await gateway.post("/mcp", json=INIT, headers={**ACCEPT, "Authorization": "Bearer wrong"})
    assert r.status == 401

    auth = {**ACCEPT, "Authorization": f"Bearer {ALICE}"}  # a user key may use it: not an admin's route
    r = await gateway.post("/mcp", json=INIT, headers=auth)
    assert r.status == 200 and r.content_type == "application/json"
    answer = await r.json()
    assert answer["result"]["serverInfo"]["name"] == "gguf-gateway" and "tools" in answer["result"]["capabilities"]
    assert "Mcp-Session-Id" not in r.headers  # stateless: no session kept

    # each POST stands alone: a list with no session before it
    r = await gateway.post("/mcp", json=rpc("tools/list"), headers={**auth, "MCP-Protocol-Version": "2025-06-18"})
    assert r.status == 200
    assert {t["name"] for t in (await r.json())["result"]["tools"]} == {"math_add", "math_fail", "math_slow"}

    huge = json.dumps(rpc("tools/call", {"name": "math_add", "arguments": {"pad": "x" * 100_000}})).encode()
    r = await gateway.post("/mcp", data=huge, headers=auth)
    assert r.status == 413 and (await r.json())["error"]["code"] == "request_too_large"

    for bad in (b"{", b"[]", b'{"a": NaN}', b"[" * 10_000):  # the gateway's strict JSON, before the SDK sees it
        r = await gateway.post("/mcp", data=bad, headers=auth)
        assert r.status == 400 and (await r.json())["error"]["code"] in ("invalid_json", "invalid_request_error"), bad

    for method in ("GET", "DELETE"):  # no stream pushed, no session to end
        r = await gateway.request(method, "/mcp", headers=auth)
        assert r.status == 405, method


async def test_a_page_on_another_site_cannot_post_to_it(gateway):
    r = await gateway.post("/mcp", json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {ADMIN}",
                                                      "Origin": "http://evil.example"})
    assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden_origin"
    r = await gateway.post("/mcp", json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {ADMIN}",
                                                      "Host": "evil.example"})
    assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden_host"


async def test_it_keeps_serving_after_a_client_leaves_mid_call(gateway, servers):
    auth = {**ACCEPT, "Authorization": f"Bearer {ADMIN}", "MCP-Protocol-Version": "2025-06-18"}
    call = asyncio.ensure_future(gateway.post("/mcp", json=rpc("tools/call", {"name": "math_slow", "arguments": {}}),
                                              headers=auth))
    await asyncio.wait_for(servers.slow_started.wait(), 10)
    call.cancel()  # the client leaves: its connection closes
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(servers.slow_cancelled.wait(), 10)  # the call in flight is cancelled with it
    async with connected(gateway, ADMIN) as client:
        assert text_of(await client.call_tool("math_add", {"a": 5, "b": 5})) == "10"


async def test_without_servers_the_list_is_empty(aiohttp_client, write_config):
    app = create_app(load_config(write_config("server:\n  models_dirs: []\n  discover_default_stores: false\n")))
    gateway = await aiohttp_client(app)
    async with connected(gateway, None) as client:
        assert (await client.list_tools()).tools == []


async def test_the_pages_list_of_servers_is_the_keys_own(gateway):
    r = await gateway.get("/dashboard/mcp")
    assert r.status == 401
    r = await gateway.get("/dashboard/mcp", headers={"Authorization": f"Bearer {ADMIN}"})
    body = await r.json()
    assert body["endpoint"] == "/mcp"
    assert [(s["name"], s["transport"], s["state"]) for s in body["servers"]] == [
        ("math", "stdio", "ready"), ("files-ro", "http", "idle"), ("down", "stdio", "failed")]
    assert body["servers"][2]["error"] == "the program exited with 1"
    r = await gateway.get("/dashboard/mcp", headers={"Authorization": f"Bearer {ALICE}"})
    assert [s["name"] for s in (await r.json())["servers"]] == ["math"]


async def test_an_answer_past_its_bound_is_a_clear_error(gateway, monkeypatch):
    from gateway.api import mcp
    monkeypatch.setattr(mcp, "MAX_ANSWER_BYTES", 300)
    auth = {**ACCEPT, "Authorization": f"Bearer {ADMIN}", "MCP-Protocol-Version": "2025-06-18"}
    r = await gateway.post("/mcp", json=rpc("tools/list"), headers=auth)
    assert r.status == 502 and (await r.json())["error"]["code"] == "answer_too_large"
    r = await gateway.post("/mcp", json=rpc("tools/call", {"name": "math_add", "arguments": {"a": 1, "b": 1}}),
                           headers=auth)
    assert r.status == 200 and (await r.json())["result"]["content"][0]["text"] == "2"


async def test_a_page_the_operator_allows_may_use_it(aiohttp_client, write_config, servers):
    """With ``server.cors_origins``, a browser's MCP client on that origin gets its answers, with
    the CORS headers the middleware adds to a whole answer."""
    app = create_app(load_config(write_config(
        "server:\n  models_dirs: []\n  discover_default_stores: false\n  cors_origins: [http://tool.example]\n")))
    app[MCP_SERVERS] = servers
    gateway = await aiohttp_client(app)
    headers = {**ACCEPT, "Origin": "http://tool.example"}
    pre = await gateway.options("/mcp", headers={"Origin": "http://tool.example", "Access-Control-Request-Method": "POST",
                                                 "Access-Control-Request-Headers": "content-type, mcp-protocol-version"})
    assert pre.status == 204 and "mcp-protocol-version" in pre.headers["Access-Control-Allow-Headers"]
    r = await gateway.post("/mcp", json=INIT, headers=headers)
    assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "http://tool.example"
    assert "X-Request-Id" in r.headers
