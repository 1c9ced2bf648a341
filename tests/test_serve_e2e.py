"""`gguf-gateway serve` as a real process, as a newcomer starts it."""

import signal
import socket

import pytest
from helpers import ServerProcess, run_cli
from openapi import validate

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_fresh_home_serves_the_demo_model_and_stops_cleanly(_isolated_home, sig):
    server = ServerProcess()
    with server:
        status, health = server.get("/health")
        assert status == 200 and health["status"] == "ok"
        status, models = server.get("/v1/models")
        assert status == 200
        validate(models, "ListModelsResponse")
        assert [m["id"] for m in models["data"]] == ["demo"]
        code, err = server.stop(sig)
    assert code == 0, err
    assert "Traceback" not in err
    assert "serving the built-in demo model as 'demo'" in err
    assert (_isolated_home / ".local" / "share" / "gguf-gateway" / "demo.gguf").is_file()


def test_configured_models_replace_the_demo(write_config, model_dir):
    path = write_config(f"server:\n  models_dirs: [{model_dir}]\n")
    with ServerProcess("--config", str(path)) as server:
        _, models = server.get("/v1/models")
        assert sorted(m["id"] for m in models["data"]) == ["loop", "plain", "thinker"]


def test_a_port_in_use_is_a_clear_error(_isolated_home):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_cli("serve", "--port", str(port), timeout=30)
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr


def test_sighup_reloads_a_good_file_and_keeps_the_old_one_when_broken(write_config, model_dir):
    import time

    path = write_config(f"server:\n  discover_default_stores: false\nmodels:\n  one: {model_dir}/plain.gguf\n")
    with ServerProcess("--config", str(path)) as server:
        def ids():
            return sorted(m["id"] for m in server.get("/v1/models")[1]["data"])

        def wait_for(expected):
            for _ in range(200):
                if ids() == expected:
                    return True
                time.sleep(0.05)
            return False

        assert ids() == ["one"]
        path.write_text(f"server:\n  discover_default_stores: false\nmodels:\n  one: {model_dir}/plain.gguf\n"
                        f"  two: {model_dir}/loop.gguf\n")
        server.proc.send_signal(signal.SIGHUP)
        assert wait_for(["one", "two"])
        path.write_text("models:\n  three: [not, a, path\n")
        server.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert ids() == ["one", "two"]
        code, err = server.stop()
    assert code == 0
    assert "reload refused, keeping the running configuration" in err and "invalid YAML" in err
