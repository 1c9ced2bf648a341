"""Helpers for tests that run the real `gguf-gateway` process."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# Debian's chromium, headless, for the page's tests and its screenshots: nothing downloads a browser
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str | None:
    """The system Chromium: ``$GGUF_GATEWAY_CHROMIUM``, else ``chromium`` on PATH."""
    for candidate in (os.environ.get("GGUF_GATEWAY_CHROMIUM"), "chromium", "chromium-browser"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@contextlib.contextmanager
def headless_chromium():
    """Debian's Chromium driven by Playwright, for a module's ``browser`` fixture; the test is
    skipped, saying why, where Playwright or a Chromium is missing (nothing downloads one)."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the test extra has it)")
    binary = chromium()
    if binary is None:
        pytest.skip("no Chromium installed (Debian/Ubuntu: apt-get install chromium); "
                    "./scripts/test installs it where it may")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def gateway_command() -> list[str]:
    script = Path(sys.executable).parent / "gguf-gateway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body=None, *, raw: bytes | None = None, headers: dict | None = None,
            timeout: float = 60) -> tuple[int, dict, dict]:
    """POST a JSON body (or ``raw`` bytes): (status, answer's JSON, headers), whatever the status."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), dict(e.headers)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            input_text: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*gateway_command(), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, input=input_text,
                          stdin=subprocess.DEVNULL if input_text is None else None)


class ServerProcess:
    """`gguf-gateway serve` on a free loopback port, as a user would start it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Output goes to a file, not a pipe: a pipe nobody reads fills up (64 KiB of log lines)
        # and then blocks the server's writes to its log.
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self.proc = subprocess.Popen(
            [*gateway_command(), "serve", "--port", str(self.port), *args],
            env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=subprocess.STDOUT, text=True,
        )

    def output(self) -> str:
        if self.log.closed:
            return self._final
        self.log.seek(0)
        return self.log.read()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.output()}")
            try:
                self.get("/health")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        raise TimeoutError("server did not answer /health")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str]:
        """Send ``sig`` and return (exit code, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self._final = self.output()
            self.log.close()
        return self.proc.returncode, self._final

    def __enter__(self) -> ServerProcess:
        try:
            self.wait_ready()
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_QUIET_LOG = None  # llama.cpp keeps the log callback's address: it must live as long as the process


@contextlib.contextmanager
def vocab_only(vocab: str):
    """llama.cpp's real ``vocab`` vocabulary (a vocab-only GGUF) loaded in this process, for
    grammar tests, with llama.cpp's log quiet (a grammar's debug lines cut UTF-8, which the
    binding's logger cannot print). Yields the ``llama_vocab`` handle."""
    import ctypes

    import llama_cpp as L

    from gateway.models import testmodels as tm

    global _QUIET_LOG
    if _QUIET_LOG is None:
        _QUIET_LOG = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(_QUIET_LOG, ctypes.c_void_p(0))
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(tm.find_vocab(vocab, cache_dir=REPO / ".cache" / "vocab")).encode(),
                                         params)
    assert model
    try:
        yield L.llama_model_get_vocab(model)
    finally:
        L.llama_model_free(model)


def tiny_random_model(vocab: str, seed: int) -> Path:
    """A one-layer random-weight llama with llama.cpp's real ``vocab`` vocabulary, written once
    into the repository's cache and kept between runs."""
    from gateway.models import testmodels as tm

    path = REPO / ".cache" / "models" / f"random-{vocab}-tiny.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        vocab_file = tm.find_vocab(vocab, cache_dir=REPO / ".cache" / "vocab")
        tm.write_random_model(path.with_suffix(".part"), vocab_file, n_embd=64, n_layer=1, n_head=2, n_ff=64, seed=seed)
        path.with_suffix(".part").replace(path)
    return path


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = ["<tool_call>", "\n", '{"name":', ' "get_weather",', ' "arguments":', ' {"city":', ' "Paris"}}', "\n",
        "</tool_call>"]


def agent_model(path: Path, final: list[str] = ["It", " is", " 18", " C", "."], call: list[str] = CALL,  # noqa: B006
                context_length: int = 4096) -> Path:
    """A scripted model under Qwen 2.5's real chat template that makes ``call`` (by default
    get_weather(city="Paris"); its first and last pieces are the special tokens), and answers
    ``final`` once the tool's result is in: one line is added at the template's end, so after a
    tool result the prompt ends in "!" instead of a newline, and a scripted model's next token
    depends only on the prompt's last token."""
    from gateway.models import testmodels as tm

    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", REPO / ".cache" / "templates")
    template = qwen.read_text() + "{%- if messages[-1]['role'] == 'tool' %}!{% endif %}"
    tm.write_scripted_model(path, [tm.Script([tm.Special(call[0]), *call[1:-1], tm.Special(call[-1])]),
                                   tm.Script(final, trigger="!")], chat_template=template, context_length=context_length)
    return path
