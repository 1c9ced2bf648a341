"""The hosted tools with the real agent programs, headless, on loopback (issue 67): each program
installed from npm on first use (``agents.npm_program``; skipped, saying why, without npm or the
registry), the real `gguf-gateway serve` process, a SearXNG stand-in (``test_hosted_loop``'s, in a
thread of its own here) and the real MCP test server (``tests/mcp_server.py``), through a logging
proxy that records every request the agent makes:

- Claude Code's WebSearch: its main conversation's model calls ``WebSearch`` (a function tool of
  Claude Code's); the tool makes its own request with ``web_search_20250305``, whose model calls
  the gateway's ``web_search``; the gateway asks the stand-in and answers with its
  ``server_tool_use`` and ``web_search_tool_result`` blocks, which Claude Code reads into the
  WebSearch result its main conversation gets;
- Codex with ``web_search = "live"``: its ``{"type": "web_search"}`` tool runs in the gateway,
  whose answer holds a ``web_search_call`` item, and Codex prints the scripted answer;
- ``claude mcp add --transport http`` of the gateway's ``/mcp``: ``claude mcp list`` shows it
  connected, and a ``claude -p`` whose model calls ``mcp__gateway__docs_echo`` gets the real
  MCP server's answer (over stdio, behind the gateway) into its conversation.

One scripted model serves each program's requests (its next token depends only on the prompt's
last token: ``gateway/models/ggufwriter.py``): its template ends a prompt after a tool's result
with "!" (the final answer's trigger) and, in a request that offers the gateway's
``web_search``, with "?" (the search call's trigger), so the same model calls WebSearch in
Claude Code's conversation and web_search in the request WebSearch makes, whatever model name
Claude Code picks for it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from agents import LoggingProxy, call_model
from aiohttp import web
from helpers import REPO, ServerProcess, free_port
from test_claude_code_e2e import claude, environment
from test_hosted_loop import MCP_SERVER, SNIPPET, URL, searxng_app
from test_responses_codex_cli import codex_binary

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

S = tm.Special
TITLE = "Llamas of the Andes"  # the stand-in's result: in no script, so it reaches the agent only by the search
QUERY = "llamas andes"
FINAL = ["Llamas", " live", " in", " the", " Andes", "."]
N_CTX = 65536  # an agent's prompt is tens of thousands of a scripted model's byte tokens


def qwen_template() -> str:
    """Qwen 2.5's real template, then: "!" after a tool's result, else "?" where the gateway's
    ``web_search`` is offered."""
    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", REPO / ".cache" / "templates")
    return qwen.read_text() + (
        "{%- set ns = namespace(search=false) %}"
        "{%- for t in tools or [] %}{%- if (t.function.name if t.function is defined else t.name) == 'web_search' %}"
        "{%- set ns.search = true %}{%- endif %}{%- endfor %}"
        "{%- if messages[-1]['role'] == 'tool' %}!{%- elif ns.search %}?{%- endif %}")


def call(name: str, arguments: str, special: bool = True) -> list:
    """A Qwen 2.5 tool call of ``name`` with the JSON ``arguments``; its markers spelled in bytes
    where ``special`` is false (a special token is used once per scripted model)."""
    body = ["\n", '{"name":', f' "{name}",', ' "arguments":', f" {arguments}", "}", "\n"]
    if special:
        return [S("<tool_call>"), *body, S("</tool_call>")]
    return [b"<tool_call>", *body, b"</tool_call>"]


def searching_model(path: Path, first: str, arguments: str) -> None:
    """Calls ``first`` (an agent's own tool) in a plain turn, ``web_search`` where the gateway
    offers it, and answers ``FINAL`` after a tool's result."""
    tm.write_scripted_model(path, [tm.Script(call(first, arguments)),
                                   tm.Script(call("web_search", json.dumps({"query": QUERY}), special=False),
                                             trigger="?"),
                                   tm.Script(FINAL, trigger="!")], chat_template=qwen_template(),
                            context_length=N_CTX)


@contextmanager
def searxng():
    """``test_hosted_loop``'s SearXNG stand-in on a loopback port, in a thread: (its URL, the
    queries it got)."""
    seen: list[str] = []
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(searxng_app(seen, [{"url": URL, "title": TITLE, "content": SNIPPET,
                                                "engine": "duckduckgo", "publishedDate": None}]))
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def write_config(d: Path, server: str, *models: str) -> Path:
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {d}/events.jsonl\n{server}models:\n"
                   + "".join(f"  {m}: {{path: {d}/{m}.gguf, n_ctx: {N_CTX}, parallel: 1}}\n" for m in models))
    return cfg


def events(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "events.jsonl").read_text().splitlines()]


def stream_json(out: str) -> list[dict]:
    """``claude -p --output-format stream-json``'s messages, in order; the last is the result."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def tool_results(messages: list[dict]) -> list[str]:
    """The tool results Claude Code gave its model, as its stream-json output shows them."""
    return [json.dumps(block["content"]) for m in messages if m["type"] == "user"
            for block in m["message"]["content"] if isinstance(block, dict) and block.get("type") == "tool_result"]


def refused(proxy: LoggingProxy) -> list[tuple]:
    """The requests the gateway answered with an error; ``GET /mcp`` is left out (405: the
    streamable HTTP transport lets a server offer no stream of its own)."""
    return [(r["method"], r["path"], r["status"], r.get("answer")) for r in proxy.records
            if r["status"] >= 400 and (r["method"], r["path"]) != ("GET", "/mcp")]


def test_claude_codes_websearch_gets_the_backends_results(tmp_path):
    exe = claude()
    searching_model(tmp_path / "agent.gguf", "WebSearch", json.dumps({"query": QUERY}))
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    with searxng() as (searx, seen):
        cfg = write_config(tmp_path, f"  web_search: {{searxng: '{searx}'}}\n", "agent")
        with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as srv, LoggingProxy(srv.url) as proxy:
            done = subprocess.run([exe, "-p", "Where do llamas live? Search the web.", "--output-format",
                                   "stream-json", "--verbose", "--model", "agent", "--max-turns", "3",
                                   "--system-prompt", "You are a test agent.", "--tools", "WebSearch",
                                   "--allowedTools", "WebSearch"], cwd=work, env=environment(proxy.url, home),
                                  capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
            log = srv.output()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], log[-3000:])
    messages = stream_json(done.stdout)
    result = messages[-1]
    assert result["type"] == "result" and not result["is_error"] and result["result"] == "".join(FINAL), result
    assert seen == [QUERY], seen  # the backend was asked what the model asked
    sent = [r for r in proxy.records if r["path"] == "/v1/messages"]
    assert not refused(proxy), refused(proxy)
    # the request Claude Code's WebSearch made: the hosted tool, which the gateway ran
    [search] = [r for r in sent if any(t.get("type") == "web_search_20250305" for t in r["body"].get("tools", []))]
    [event] = [e for e in events(tmp_path) if e["request_id"] == search["request_id"]]
    [ran] = event["hosted_tool_calls"]
    assert ran["kind"] == "web_search" and ran["error"] is None and ran["bytes"] > 0, ran
    # Claude Code read the web_search_tool_result blocks: their title and URL are in the
    # WebSearch result it showed and gave its model, which then answered
    [found] = tool_results(messages)
    assert TITLE in found and URL in found and QUERY in found, found
    last = next(r for r in reversed(sent) if '"WebSearch"' in json.dumps(r["body"].get("tools")))
    assert TITLE in json.dumps(last["body"]["messages"][-1]), last
    # and counted the search from the answer's usage.server_tool_use.web_search_requests
    assert result["modelUsage"]["agent"]["webSearchRequests"] == 1, result


def response_items(capture: dict) -> list[dict]:
    """The output items of a captured Responses stream (its ``response.completed`` event)."""
    for write in capture["response"]["events"]:
        for line in write["data"].splitlines():
            if line.startswith("data: ") and '"response.completed"' in line:
                return json.loads(line[6:])["response"]["output"]
    raise AssertionError(f"no response.completed in {capture['id']}")


def test_codex_with_live_web_search_gets_a_web_search_call_and_its_results(tmp_path):
    exe = codex_binary()
    # Codex offers exec_command too: the script calls web_search, which the gateway offers
    searching_model(tmp_path / "agent.gguf", "exec_command", json.dumps({"cmd": "true"}))
    home = tmp_path / "codex-home"
    home.mkdir()
    with searxng() as (searx, seen):
        cfg = write_config(tmp_path, f"  web_search: {{searxng: '{searx}'}}\n  capture: true\n", "agent")
        with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as srv, LoggingProxy(srv.url) as proxy:
            (home / "config.toml").write_text(
                'model = "agent"\nmodel_provider = "gateway"\nweb_search = "live"\n\n[model_providers.gateway]\n'
                f'name = "gguf-gateway"\nbase_url = "{proxy.url}/v1"\nwire_api = "responses"\n')
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
            done = subprocess.run([str(exe), "exec", "--skip-git-repo-check", "Where do llamas live?"], cwd=tmp_path,
                                  env={**env, "CODEX_HOME": str(home)}, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=600)
            _, listing = srv.get("/captures")
            captures = {row["request_id"]: srv.get(f"/captures/{row['id']}")[1] for row in listing["data"]}
            log = srv.output()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], log[-3000:])
    assert done.stdout.strip() == "".join(FINAL), (done.stdout, done.stderr[-2000:])
    assert f"web search: {QUERY}" in done.stderr  # Codex showed the call it read
    assert seen == [QUERY], seen
    assert not refused(proxy), refused(proxy)
    [turn] = [r for r in proxy.records if r["path"] == "/v1/responses"]
    assert {"type": "web_search", "external_web_access": True} in turn["body"]["tools"]  # live
    items = response_items(captures[turn["request_id"]])
    assert [i["type"] for i in items] == ["web_search_call", "message"], items
    assert items[0]["status"] == "completed" and items[0]["action"]["query"] == QUERY, items[0]
    assert items[1]["content"][0]["text"] == "".join(FINAL)
    [event] = [e for e in events(tmp_path) if e["request_id"] == turn["request_id"]]
    assert [c["kind"] for c in event["hosted_tool_calls"]] == ["web_search"], event["hosted_tool_calls"]


ECHO = "mcp-through-the-gateway"


def test_claude_code_adds_the_gateways_mcp_endpoint_and_calls_a_servers_tool(tmp_path):
    exe = claude()
    call_model(tmp_path / "agent.gguf", "mcp__gateway__docs_echo", [" " + json.dumps({"text": ECHO})], FINAL)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    server = f"  mcp_servers:\n    docs: {{command: {sys.executable}, args: ['{MCP_SERVER}', stdio]}}\n"
    cfg = write_config(tmp_path, server, "agent")
    with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as srv, LoggingProxy(srv.url) as proxy:
        env = environment(proxy.url, home)

        def run(*args: str) -> subprocess.CompletedProcess:
            """``claude`` in ``work`` (``mcp add``'s default scope is the project: that folder)."""
            return subprocess.run([exe, *args], cwd=work, env=env, capture_output=True, text=True, timeout=600,
                                  stdin=subprocess.DEVNULL)

        added = run("mcp", "add", "--transport", "http", "gateway", f"{proxy.url}/mcp")
        listed = run("mcp", "list")
        done = run("-p", "Echo it.", "--output-format", "stream-json", "--verbose", "--model", "agent",
                   "--max-turns", "3", "--system-prompt", "You are a test agent.", "--tools", "",
                   "--allowedTools", "mcp__gateway__docs_echo")
        log = srv.output()
    assert added.returncode == 0, (added.stdout, added.stderr)
    assert json.loads((home / ".claude.json").read_text())["projects"][str(work)]["mcpServers"]["gateway"] == {
        "type": "http", "url": f"{proxy.url}/mcp"}  # written under the temporary HOME
    assert listed.returncode == 0 and f"gateway: {proxy.url}/mcp (HTTP)" in listed.stdout, listed.stdout
    assert "Connected" in listed.stdout and "Failed" not in listed.stdout, listed.stdout
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], log[-3000:])
    messages = stream_json(done.stdout)
    init = messages[0]
    assert init["mcp_servers"] == [{"name": "gateway", "status": "connected"}], init
    # every tool of the configured server, as Claude Code names a tool of the server it added
    assert {f"mcp__gateway__docs_{t}" for t in ("echo", "fail", "hang", "big", "search")} <= set(init["tools"])
    calls = [r["body"]["params"] for r in proxy.records
             if r["path"] == "/mcp" and r["body"] and r["body"].get("method") == "tools/call"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("docs_echo", {"text": ECHO})], calls
    [echoed] = tool_results(messages)
    assert json.loads(echoed) == [{"type": "text", "text": ECHO}], echoed  # the MCP server's answer
    assert messages[-1]["result"] == "".join(FINAL) and not messages[-1]["is_error"], messages[-1]
    assert not refused(proxy), refused(proxy)
