"""What the real agent programs' test tier shares: each program installed from npm or PyPI on
first use (``npm_program``, ``pip_program``), the scripted model that makes Codex's calls
(``call_model``), and a logging proxy that records every request an agent makes (each tier
asserts none got a 4xx or 5xx)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from helpers import REPO, free_port

from gateway.models import testmodels as tm


def call_model(path, name: str, arguments: list[str], final: list[str]):
    """A scripted model under Qwen 2.5's real template that calls ``name`` with the JSON
    ``arguments`` (its pieces), then answers ``final`` once the tool's result is in (the template
    ends a prompt after a tool result with "!", the final script's trigger)."""
    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", REPO / ".cache" / "templates")
    template = qwen.read_text() + "{%- if messages[-1]['role'] == 'tool' %}!{% endif %}"
    call = [tm.Special("<tool_call>"), "\n", '{"name":', f' "{name}",', ' "arguments":', *arguments, "}", "\n",
            tm.Special("</tool_call>")]
    tm.write_scripted_model(path, [tm.Script(call), tm.Script(final, trigger="!")], chat_template=template)


def npm_program(package: str, version: str, binary: str, folder: str, env_version: str | None = None) -> Path:
    """``binary`` of npm's ``package`` at ``version`` (or the one ``$env_version`` names),
    installed on first use into the repository's ignored ``.cache/folder``; the test is skipped,
    saying why, where npm or the registry is not to be had."""
    version = os.environ.get(env_version, version) if env_version else version
    prefix = REPO / ".cache" / folder
    exe = prefix / "node_modules" / ".bin" / binary
    installed = prefix / "node_modules" / package / "package.json"
    if installed.exists() and json.loads(installed.read_text()).get("version") == version and exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: cannot install {package}")
    prefix.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([npm, "install", "--no-save", "--no-audit", "--no-fund", "--prefix", str(prefix),
                               f"{package}@{version}"], capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install {package}@{version} timed out (no registry?)")
    if done.returncode != 0 or not exe.exists():
        pytest.skip(f"npm could not install {package}@{version}: {done.stderr.strip()[-300:]}")
    return exe


def pip_program(package: str, version: str, binary: str, folder: str, env_version: str | None = None) -> Path:
    """``binary`` of PyPI's ``package`` at ``version`` (or the one ``$env_version`` names), installed
    on first use into a virtual environment of its own in the repository's ignored
    ``.cache/folder`` (a program such as aider pins its own versions of what the gateway uses);
    pip's wheel cache is left alone. The test is skipped, saying why, where the index is not to
    be had."""
    version = os.environ.get(env_version, version) if env_version else version
    prefix = REPO / ".cache" / folder
    exe, python = prefix / "bin" / binary, prefix / "bin" / "python"
    stamp = prefix / "installed.txt"
    if exe.exists() and stamp.exists() and stamp.read_text() == f"{package}=={version}":
        return exe
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(prefix)], check=True, capture_output=True,
                       timeout=120)
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               f"{package}=={version}"], capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
        pytest.skip(f"could not install {package}=={version}: {e}")
    if done.returncode != 0 or not exe.exists():
        pytest.skip(f"pip could not install {package}=={version}: {done.stderr.strip()[-300:]}")
    stamp.write_text(f"{package}=={version}")
    return exe


class LoggingProxy:
    """A loopback reverse proxy in its own thread: forwards every request to ``target`` as it
    comes (streams included) and records its method, path, status and body, its request id (the
    agent's ``X-Request-Id``, else one the proxy gives it: the gateway's inference event's
    ``request_id``) and, for a refusal (4xx, 5xx), the answer's text (``answer``)."""

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
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        headers["X-Request-Id"] = rid
        async with aiohttp.ClientSession(auto_decompress=False) as session, \
                session.request(request.method, self.target + request.path_qs, data=body, headers=headers,
                                # forwarded as sent: no Content-Type where the agent wrote none
                                skip_auto_headers=() if "Content-Type" in request.headers else ("Content-Type",)) as up:
            record = {"method": request.method, "path": request.path, "status": up.status,
                      "body": json.loads(body) if body else None, "request_id": rid}
            self.records.append(record)
            skip = ("content-length", "transfer-encoding")
            response = web.StreamResponse(status=up.status,
                                          headers={k: v for k, v in up.headers.items() if k.lower() not in skip})
            await response.prepare(request)
            refusal = bytearray() if up.status >= 400 else None
            async for chunk in up.content.iter_any():
                if refusal is not None:
                    refusal += chunk
                await response.write(chunk)
            await response.write_eof()
            if refusal is not None:
                record["answer"] = refusal.decode(errors="replace")
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
