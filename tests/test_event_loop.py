"""The HTTP server's event loop (``server.event_loop``, ``serve --event-loop``): uvloop where asked
for or, with ``auto``, where installed; asyncio's own otherwise; uvloop asked for by name where it
cannot be imported stops the start with the reason."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from helpers import ServerProcess, run_cli

from gateway.cli import serve
from gateway.models.config import ConfigError, load_config

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
needs_uvloop = pytest.mark.skipif(not HAVE_UVLOOP, reason="uvloop is not installed (the fast extra)")


@pytest.fixture
def no_uvloop(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # ``import uvloop`` raises ImportError


@needs_uvloop
def test_auto_and_uvloop_take_uvloop_where_installed():
    assert serve.event_loop("auto") == "uvloop"
    assert serve.event_loop("uvloop") == "uvloop"
    assert serve.event_loop("asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_and_uvloop_by_name_is_refused_where_missing(no_uvloop):
    assert serve.event_loop("auto") == "asyncio"
    assert serve.event_loop("asyncio") == "asyncio"
    with pytest.raises(ConfigError) as e:
        serve.event_loop("uvloop")
    assert "server.event_loop: uvloop cannot be imported" in str(e.value) and "gguf-gateway[fast]" in str(e.value)


def test_the_key_is_checked(write_config):
    assert load_config(write_config("server:\n  event_loop: asyncio\n")).server.event_loop == "asyncio"
    assert load_config(write_config("server: {}\n")).server.event_loop == "asyncio"  # (uvloop did not pay)
    with pytest.raises(ConfigError, match="event_loop"):
        load_config(write_config("server:\n  event_loop: tokio\n"))


def started(server: ServerProcess) -> str:
    """The server's output once it answered /health and was stopped."""
    with server:  # (started once it answers /health)
        code, out = server.stop()
    assert code == 0, out
    return out


@pytest.mark.slow
@needs_uvloop
@pytest.mark.parametrize("key, flag, runs", [("uvloop", None, "uvloop"), ("auto", None, "uvloop"),
                                             ("asyncio", None, "asyncio"), ("asyncio", "uvloop", "uvloop"),
                                             ("uvloop", "asyncio", "asyncio")])
def test_the_running_server_is_on_the_loop_asked_for(model_dir, write_config, key, flag, runs):
    cfg = write_config(f"server:\n  discover_default_stores: false\n  event_loop: {key}\n"
                       f"models:\n  plain: {model_dir}/plain.gguf\n")
    out = started(ServerProcess("--config", str(cfg), *(["--event-loop", flag] if flag else [])))
    assert f"event loop: {runs})" in out, out


@pytest.mark.slow
def test_uvloop_asked_for_where_it_cannot_be_imported_stops_the_start(model_dir, write_config, tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "uvloop.py").write_text("raise ImportError('No module named uvloop')\n")  # first on the path
    cfg = write_config(f"server:\n  discover_default_stores: false\n  event_loop: uvloop\n"
                       f"models:\n  plain: {model_dir}/plain.gguf\n")
    server = ServerProcess("--config", str(cfg), env={"PYTHONPATH": str(hide)})
    server.proc.wait(120)  # it leaves by itself
    code, out = server.stop()
    assert code == 2, out
    assert "server.event_loop: uvloop cannot be imported" in out and "pip install" in out, out
    assert "Traceback" not in out
    # with auto, the same start goes on on asyncio
    cfg = write_config(f"server:\n  discover_default_stores: false\nmodels:\n  plain: {model_dir}/plain.gguf\n")
    assert "event loop: asyncio)" in started(ServerProcess("--config", str(cfg), env={"PYTHONPATH": str(hide)}))
    # and check-config says so too
    r = run_cli("check-config", "--config", str(write_config("server:\n  event_loop: uvloop\nmodels: {}\n")),
                env={"PYTHONPATH": str(hide)})
    assert r.returncode == 1 and "uvloop cannot be imported" in r.stderr, r.stderr
