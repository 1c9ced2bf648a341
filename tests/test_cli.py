import json

import pytest
from helpers import run_cli

from gateway.models import testprojector


@pytest.mark.parametrize("body, needle", [
    ("models:\n  llama3:\n    path: x.gguf\n    n_ctx: big\n", 'models.llama3.n_ctx: must be a positive integer, got "big"'),
    ("server:\n  prot: 1\n", "server.prot: unknown key"),
    ("models:\n  gone: nowhere.gguf\n", "models.gone: model file not found: "),
    ("models: {a: [\n", "invalid YAML: line "),
])
def test_check_config_prints_one_clear_line_per_problem(write_config, body, needle):
    path = write_config(body)
    r = run_cli("check-config", "--config", str(path))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {path}: ") and needle in lines[0]
    assert "Traceback" not in r.stderr


def test_check_config_rejects_a_file_that_is_not_gguf(write_config, tmp_path):
    (tmp_path / "fake.gguf").write_bytes(b"not a model at all")
    r = run_cli("check-config", "--config", str(write_config("models:\n  fake: fake.gguf\n")))
    assert r.returncode == 1
    assert "models.fake: " in r.stderr and "not a GGUF file" in r.stderr


def test_check_config_ok(write_config, model_dir):
    r = run_cli("check-config", "--config", str(write_config(f"models:\n  p: {model_dir}/plain.gguf\n")))
    assert r.returncode == 0, r.stderr
    assert "1 model(s)" in r.stdout


def test_check_config_uses_the_environment_variable(write_config):
    path = write_config("server:\n  port: nope\n")
    r = run_cli("check-config", env={"GGUF_GATEWAY_CONFIG": str(path)})
    assert r.returncode == 1 and "server.port" in r.stderr


def test_models_lists_names_with_header_metadata(write_config, model_dir, tmp_path):
    projector = testprojector.write_random_projector(tmp_path / "mmproj.gguf", 64, audio=True)
    path = write_config(f"""
        server:
          models_dirs: [{model_dir}]
        models:
          chat:
            path: {model_dir}/plain.gguf
            aliases: [chat:latest]
          toolless:
            path: {model_dir}/loop.gguf
            tool_format: none
            mmproj: {projector}
            draft: {model_dir}/plain.gguf
    """)
    r = run_cli("models", "--config", str(path), "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert set(rows) == {"chat", "thinker", "toolless"}  # chat is plain.gguf, found on disk too: one model (toolless loop.gguf)
    assert rows["chat"]["aliases"] == ["chat:latest", "plain"] and rows["chat"]["source"] == "models.yaml"
    assert rows["thinker"]["source"] == "discovered"
    for row in rows.values():
        assert row["architecture"] == "llama" and row["quantization"] == "F16"
        assert row["size"] > 0 and row["error"] is None
        assert row["memory_estimate"]["total"] > row["memory_estimate"]["weights"] > 0  # what it should take loaded
    # ChatML has no tool syntax: tools are described in a system message, unless the model says none
    assert rows["chat"]["tool_format"] == "plain" and rows["toolless"]["tool_format"] is None
    assert rows["toolless"]["media"] == ["audio"] and rows["chat"]["media"] == []
    assert rows["toolless"]["memory_estimate"]["projector"] > projector.stat().st_size
    # the draft model counts as the model it is would (plain.gguf, whose row is "chat")
    assert rows["toolless"]["memory_estimate"]["draft"] == rows["chat"]["memory_estimate"]["total"]

    table = run_cli("models", "--config", str(path))
    assert table.returncode == 0
    header, *lines = table.stdout.splitlines()
    assert header.split()[:8] == ["NAME", "SOURCE", "SIZE", "MEMORY", "ARCH", "QUANT", "TOOLS", "MEDIA"]
    assert any(line.startswith("chat (chat:latest, plain)") and "llama" in line and "F16" in line for line in lines)
    assert any(line.startswith("toolless") and " audio " in line for line in lines)


def test_models_reports_a_broken_file_without_failing(write_config, tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00")
    r = run_cli("models", "--config", str(write_config(f"server:\n  models_dirs: [{tmp_path}]\n")), "--json")
    assert r.returncode == 0
    (row,) = map(json.loads, r.stdout.splitlines())
    assert row["name"] == "broken" and "truncated GGUF header" in row["error"]


def test_serve_refuses_a_bad_config_with_the_problem_line(write_config):
    path = write_config("server:\n  port: nope\n")
    r = run_cli("serve", "--config", str(path))
    assert r.returncode == 2
    assert "server.port: must be a port number" in r.stderr and "Traceback" not in r.stderr


def test_models_shows_which_file_won_a_contested_name(write_config, model_dir, tmp_path):
    import shutil

    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
        shutil.copy(model_dir / "plain.gguf", d / "same.gguf")
    (second / "same.gguf").write_bytes((second / "same.gguf").read_bytes())  # a distinct file, same name
    path = write_config(f"server:\n  models_dirs: [{first}, {second}]\n  discover_default_stores: false\n")
    r = run_cli("models", "--config", str(path))
    assert r.returncode == 0, r.stderr
    assert f"name 'same': {first / 'same.gguf'} won over {second / 'same.gguf'}" in r.stdout


def test_models_and_check_config_show_upstreams_and_replicas(write_config, model_dir):
    path = write_config(f"""
        server:
          discover_default_stores: false
        models:
          far: {{upstream: "http://box:8080/v1", model: qwen3, api_key: sk-secret}}
          pair:
            replicas: [{model_dir}/plain.gguf, {{upstream: "http://box:8080"}}]
    """)
    rows = {json.loads(line)["name"]: json.loads(line) for line in run_cli("models", "--config", str(path),
                                                                           "--json").stdout.splitlines()}
    assert rows["far"]["file"] == "http://box:8080/v1 (qwen3)" and rows["far"]["source"] == "upstream"
    assert rows["pair"]["file"] == f"replicas: {model_dir}/plain.gguf, http://box:8080/v1 (pair#2)"
    table = run_cli("models", "--config", str(path)).stdout
    assert "http://box:8080/v1 (qwen3)" in table and "sk-secret" not in table
    r = run_cli("check-config", "--config", str(path))
    assert r.returncode == 0 and "2 model(s) configured" in r.stdout


def test_devices_lists_what_llama_cpp_can_offload_to():
    r = run_cli("devices", "--json")
    assert r.returncode == 0, r.stderr
    found = [json.loads(line) for line in r.stdout.splitlines()]
    assert any(d["kind"] == "cpu" and d["pool"] == "ram" and d["total"] > 0 for d in found)
    r = run_cli("devices")
    assert r.returncode == 0 and r.stdout.startswith("NAME") and "CPU" in r.stdout
    if not any(d["kind"] in ("gpu", "igpu") for d in found):
        assert "no GPU: models run on the CPU" in r.stderr
