"""Codex CLI itself (npm's @openai/codex, `codex exec` headless) against the real gateway over
the Responses API: a text turn and a tool round trip whose tool really runs, each request Codex
makes recorded by a logging proxy and none answered with a 4xx or 5xx.

Codex is installed once into the repository's ignored .cache/codex; without npm (or without the
registry) the tests are skipped, saying why."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from helpers import REPO, ServerProcess, free_port
from test_responses_codex_e2e import call_model

from gateway import testmodels as tm

pytestmark = pytest.mark.slow

CODEX_VERSION = "0.169.0"  # the version this tier was written against (issue 35)
CODEX_DIR = REPO / ".cache" / "codex"
PROOF = "codex-was-here"


def codex_binary() -> Path:
    """Codex's launcher, installed on first use; a skip naming the reason where it cannot be."""
    binary = CODEX_DIR / "node_modules" / ".bin" / "codex"
    installed = CODEX_DIR / "node_modules" / "@openai" / "codex" / "package.json"
    if installed.exists() and json.loads(installed.read_text()).get("version") == CODEX_VERSION and binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the Codex CLI tier needs it to install @openai/codex")
    CODEX_DIR.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(CODEX_DIR),
                           f"@openai/codex@{CODEX_VERSION}"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not binary.exists():
        pytest.skip(f"npm could not install @openai/codex@{CODEX_VERSION}: {done.stderr.strip()[-300:]}")
    return binary


class LoggingProxy:
    """A loopback reverse proxy in its own thread: forwards every request to ``target`` as it
    comes (streams included) and records its method, path, status and body."""

    def __init__(self, target: str):
        self.target, self.port = target, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.records: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with aiohttp.ClientSession(auto_decompress=False) as session, \
                session.request(request.method, self.target + request.path_qs, data=body, headers=headers) as up:
            self.records.append({"method": request.method, "path": request.path, "status": up.status,
                                 "body": json.loads(body) if body else None})
            skip = ("content-length", "transfer-encoding")
            response = web.StreamResponse(status=up.status,
                                          headers={k: v for k, v in up.headers.items() if k.lower() not in skip})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> LoggingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture(scope="module")
def codex(tmp_path_factory):
    binary = codex_binary()
    d = tmp_path_factory.mktemp("codex-cli")
    # Codex's prompt is ~40k characters, a token a byte to a scripted model: hence the context
    call_model(d / "agent.gguf", "exec_command", [' {"cmd":', f' "echo {PROOF} > proof.txt"}}'],
               ["Wrote", " proof", ".txt", "."])
    tm.plain(d / "plain.gguf", ["Hello", " from", " the", " gateway", "."])
    tm.thinking(d / "thinker.gguf", "Greeting the user warmly.", "Hi there.")
    # a tool of Codex's own `multi_agent_v1` namespace, called by its flat name
    call_model(d / "spawner.gguf", "multi_agent_v1__close_agent", [' {"target":', ' "agent-nope"}'], ["Closed", "."])
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\nmodels:\n" + "".join(
        f"  {name}: {{path: {d}/{name}.gguf, n_ctx: 65536, parallel: 1}}\n" for name in ("agent", "plain", "thinker", "spawner")))
    home = d / "codex-home"
    home.mkdir()
    with ServerProcess("--config", str(cfg)) as server, LoggingProxy(server.url) as proxy:
        (home / "config.toml").write_text(
            'model = "plain"\nmodel_provider = "gateway"\n\n[model_providers.gateway]\nname = "gguf-gateway"\n'
            f'base_url = "{proxy.url}/v1"\nwire_api = "responses"\n')

        def run(prompt: str, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
            work = Path(d / f"work{len(proxy.records)}")
            work.mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
            done = subprocess.run([str(binary), "exec", "--skip-git-repo-check", *args, prompt], cwd=work,
                                  env={**env, "CODEX_HOME": str(home)}, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=300)
            return done, work

        yield run, proxy


def no_failures(proxy: LoggingProxy) -> None:
    failed = [(r["method"], r["path"], r["status"]) for r in proxy.records if r["status"] >= 400]
    assert proxy.records and not failed


def test_a_text_turn(codex):
    run, proxy = codex
    done, _ = run("Say hello")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Hello from the gateway." in done.stdout
    no_failures(proxy)
    turn = next(r["body"] for r in proxy.records if r["path"] == "/v1/responses")
    kinds = {t["type"] for t in turn["tools"]}
    assert {"namespace", "web_search"} <= kinds  # what issue 35 saw refused: now flattened and dropped


def test_a_tool_round_trip_runs_the_tool(codex):
    run, proxy = codex
    done, work = run("Write proof.txt", "-m", "agent", "--dangerously-bypass-approvals-and-sandbox")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (work / "proof.txt").read_text().strip() == PROOF
    assert "Wrote proof.txt." in done.stdout
    no_failures(proxy)
    last = [r["body"] for r in proxy.records if r["path"] == "/v1/responses"][-1]
    output = next(i for i in last["input"] if i.get("type") == "function_call_output")
    assert "exited with code 0" in json.dumps(output)


def test_the_thinking_shows_as_a_reasoning_summary(codex):
    run, proxy = codex
    done, _ = run("Say hi", "-m", "thinker")
    assert done.returncode == 0, done.stderr[-2000:]
    # `codex exec` writes the answer to stdout and the transcript, the summary included, to stderr
    assert done.stdout.strip() == "Hi there." and "Greeting the user warmly." in done.stderr
    no_failures(proxy)


def test_a_namespaced_call_reaches_its_tool(codex):
    run, proxy = codex
    done, _ = run("Close the agent", "-m", "spawner", "--dangerously-bypass-approvals-and-sandbox")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "Closed."
    no_failures(proxy)
    last = [r["body"] for r in proxy.records if r["path"] == "/v1/responses"][-1]
    call = next(i for i in last["input"] if i.get("type") == "function_call")
    assert (call["name"], call["namespace"]) == ("close_agent", "multi_agent_v1")
    output = next(i for i in last["input"] if i.get("type") == "function_call_output")
    # close_agent's own handler answered (it cannot parse that id); an unrouted call would not get there
    assert "invalid agent id" in json.dumps(output)
