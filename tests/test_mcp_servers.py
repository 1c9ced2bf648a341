"""``tools/mcpservers``: the gateway's MCP client against a real MCP server written with the SDK
(``tests/mcp_server.py``), over stdio and over streamable HTTP on loopback, and against its
hostile modes: a flood of notifications, 100,000 tools, a gigabyte answer, a server that dies
mid-call, one that hangs. Each ends in a bounded result or a ``ToolError``, and the server is
used again afterwards."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from helpers import free_port

from gateway.models.config.specs import McpServerConfig, SecretRef
from gateway.tools.hosted import ToolError
from gateway.tools.mcpservers import McpServers

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def stdio(name: str = "s", hostile: str | None = None, **kw) -> McpServerConfig:
    args = (SERVER, "stdio") + (("--hostile", hostile) if hostile else ())
    return McpServerConfig(name=name, command=sys.executable, args=args, **kw)


def servers(tmp_path: Path, **configs: McpServerConfig) -> McpServers:
    return McpServers(configs, tmp_path, tool_timeout=10, max_result_bytes=64 * 1024)


@pytest.fixture
def http_server():
    """Start ``mcp_server.py http PORT [--hostile MODE]``; yields the URL of each started."""
    started = []

    def start(hostile: str | None = None) -> str:
        port = free_port()
        argv = [sys.executable, SERVER, "http", str(port)] + (["--hostile", hostile] if hostile else [])
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        import socket
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return f"http://127.0.0.1:{port}/mcp"
            time.sleep(0.1)
        raise RuntimeError("the test MCP server did not start")

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


async def test_stdio_tools_and_calls(tmp_path):
    m = servers(tmp_path, s=stdio())
    try:
        assert m.status()[0]["state"] == "idle"
        names = [t.name for t in await m.tools("s")]
        assert names == ["echo", "fail", "hang", "big", "search"]
        echo = (await m.tools("s"))[0]
        assert echo.input_schema["type"] == "object" and "text" in echo.input_schema["properties"]
        assert (await m.call("s", "echo", {"text": "hi"})).text == "hi"
        failed = await m.call("s", "fail", {"message": "no such page"})
        assert failed.is_error and "no such page" in failed.text
        big = await m.call("s", "big", {})
        assert big.truncated and big.bytes == 10_000_000 and len(big.text.encode()) == 64 * 1024
        results = await m.call("s", "search", {"query": "llamas"})
        assert "llamas result 1" in results.text
        status = m.status()[0]
        assert (status["transport"], status["state"], status["calls"], status["connects"]) == ("stdio", "ready", 4, 1)
    finally:
        await m.close()
    assert m.status()[0]["state"] == "idle"


async def test_single_flight_connect(tmp_path):
    m = servers(tmp_path, s=stdio())
    try:
        lists = await asyncio.gather(*(m.tools("s") for _ in range(5)))
        assert all(len(x) == 5 for x in lists)
        assert m.status()[0]["connects"] == 1
    finally:
        await m.close()


async def test_hang_times_out_and_a_cancelled_call_leaves_the_connection(tmp_path):
    m = servers(tmp_path, s=stdio())
    try:
        with pytest.raises(ToolError) as e:
            await m.call("s", "hang", {}, timeout=0.5)
        assert e.value.outcome == "timeout"
        task = asyncio.create_task(m.call("s", "hang", {}))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await m.call("s", "echo", {"text": "still"})).text == "still"
        assert m.status()[0]["connects"] == 1
    finally:
        await m.close()


async def test_unknown_server_and_missing_secret(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_SECRET_VAR", raising=False)
    m = servers(tmp_path, a=stdio("a", env={"TOKEN": SecretRef(env="NO_SUCH_SECRET_VAR")}),
                b=stdio("b", env={"TOKEN": SecretRef(file="nope")}))
    try:
        with pytest.raises(ToolError):
            await m.tools("zzz")
        with pytest.raises(ToolError, match="NO_SUCH_SECRET_VAR"):
            await m.tools("a")
        with pytest.raises(ToolError, match="secrets/nope"):
            await m.tools("b")
        assert [s["state"] for s in m.status()] == ["failed", "failed"]
    finally:
        await m.close()


async def test_secret_file_reaches_the_server(tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "tok").write_text("  s3cret\n")
    m = servers(tmp_path, s=stdio(env={"MCP_SECRET_PROBE": SecretRef(file="tok")}))
    try:
        assert len(await m.tools("s")) == 5
    finally:
        await m.close()


async def test_server_dies_mid_call_and_is_connected_again(tmp_path, monkeypatch):
    monkeypatch.setattr("gateway.tools.mcpservers.BACKOFF", (0.2, 1.0))
    m = servers(tmp_path, s=stdio(hostile="die"))
    try:
        assert len(await m.tools("s")) == 5
        with pytest.raises(ToolError, match="exited"):
            await m.call("s", "echo", {"text": "x"})
        status = m.status()[0]
        assert status["state"] == "failed" and "exited" in status["error"]
        with pytest.raises(ToolError):
            await m.call("s", "echo", {"text": "x"})  # after the backoff: connected again, and dies again
        assert m.status()[0]["connects"] == 2
    finally:
        await m.close()


async def test_flood_of_notifications(tmp_path):
    m = servers(tmp_path, s=stdio(hostile="flood"))
    try:
        await m.tools("s")
        tracemalloc.start()
        try:
            assert (await m.call("s", "echo", {"text": "through"})).text == "through"
            with pytest.raises(ToolError) as e:
                await m.call("s", "hang", {}, timeout=2)
            assert e.value.outcome == "timeout"
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 << 20
    finally:
        await m.close()


async def test_a_hundred_thousand_tools(tmp_path):
    m = servers(tmp_path, s=stdio(hostile="many", max_tools=50))
    try:
        started = time.monotonic()
        tools = await m.tools("s")
        assert len(tools) == 50 and tools[0].name == "t0"
        assert time.monotonic() - started < 30
    finally:
        await m.close()


async def test_a_gigabyte_answer_over_stdio(tmp_path):
    m = servers(tmp_path, s=stdio(hostile="huge"))
    try:
        await m.tools("s")
        with pytest.raises(ToolError) as e:
            await m.call("s", "big", {})
        assert e.value.outcome == "too_large"
        assert m.status()[0]["state"] == "failed"
    finally:
        await m.close()


async def test_http_tools_and_calls(tmp_path, http_server):
    url = http_server()
    m = servers(tmp_path, h=McpServerConfig(name="h", url=url))
    try:
        assert len(await m.tools("h")) == 5  # a configured server may be on loopback
        assert (await m.call("h", "echo", {"text": "over http"})).text == "over http"
        assert (await m.call("h", "fail", {})).is_error
        assert (await m.call("h", "big", {})).truncated
        with pytest.raises(ToolError) as e:
            await m.call("h", "hang", {}, timeout=0.5)
        assert e.value.outcome == "timeout"
        assert (await m.call("h", "echo", {"text": "again"})).text == "again"
        assert m.status()[0]["transport"] == "http"
    finally:
        await m.close()


async def test_http_gigabyte_answer(tmp_path, http_server):
    url = http_server("huge")
    m = servers(tmp_path, h=McpServerConfig(name="h", url=url))
    try:
        await m.tools("h")
        with pytest.raises(ToolError) as e:
            await m.call("h", "big", {})
        assert e.value.outcome == "too_large"
    finally:
        await m.close()


async def test_adhoc_refuses_loopback(tmp_path, http_server):
    url = http_server()
    m = servers(tmp_path)
    for target in (url, url.replace("127.0.0.1", "localhost"), "http://10.1.2.3:9/mcp", "ftp://example.com/"):
        with pytest.raises(ToolError) as e:
            async with m.adhoc(target, {}):
                pass
        assert e.value.outcome == "refused", (target, e.value.reason)
