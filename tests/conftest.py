from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import free_port, headless_chromium

from gateway.models import testmodels


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """No test reads the developer's own ~/.config, ~/models or data directory."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "GGUF_GATEWAY_CONFIG", "LLAMA_CACHE", "HF_HOME", "HF_HUB_CACHE",
                "HF_ENDPOINT", "HF_HUB_OFFLINE", "GGUF_GATEWAY_URL", "GGUF_GATEWAY_API_KEYS", "GGUF_GATEWAY_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.startswith("OTEL_")]:  # no test exports to the developer's collector
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(home / ".ollama" / "models"))  # never the system-wide store
    return home


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A directory of scripted models, written once per test session."""
    d = tmp_path_factory.mktemp("models")
    testmodels.plain(d / "plain.gguf")
    testmodels.thinking(d / "thinker.gguf")
    testmodels.endless(d / "loop.gguf")
    return d


@pytest.fixture
def write_config(tmp_path):
    def write(text: str, name: str = "models.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path
    return write



@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright, one per test module, for the page's tests; the test
    is skipped, saying why, where Playwright or a Chromium is missing (``helpers.headless_chromium``)."""
    with headless_chromium() as b:
        yield b


@pytest.fixture(scope="module")
def http_mcp():
    """The SDK's test server (``tests/mcp_server.py``) over streamable HTTP, on loopback: its URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("mcp_server.py")), "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)
