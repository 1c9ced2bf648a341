"""``gguf-gateway launch``: the model it picks and each agent's settings (pure functions, read
directly), what ``--print`` writes, and the one-line errors through ``gateway.cli.main``, with
no gateway and with a real one (``serve`` as a process). The agents themselves run in
``test_launch_agents_e2e.py``."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time

import pytest
import tomllib
from helpers import ServerProcess, agent_model, free_port, gateway_command

from gateway import cli
from gateway.cli import agents
from gateway.cli.agents import CLIENTS, KEY, KEY_VAR, LaunchError, Model
from gateway.cli.launch import printed
from gateway.models import testmodels as tm

CODER = Model("coder", True, 65536, True)


def test_a_named_model_wins_then_the_configured_one():
    models = [CODER, Model("chat", False, 8192, True), Model("big", True, 131072, False)]
    assert agents.pick(models, "chat", "big") == (models[1], "named with --model; its format has no tool calls: "
                                                  "the agent's tools will not work")
    assert agents.pick(models, None, "big") == (models[2], "server.agent_model in the configuration")
    with pytest.raises(LaunchError, match="no model 'gone' on the gateway"):
        agents.pick(models, "gone", None)
    with pytest.raises(LaunchError, match="server.agent_model"):
        agents.pick(models, None, "gone")


def test_otherwise_a_loaded_model_with_tools_and_the_biggest_context():
    loaded = [Model("a", True, 32768, True), Model("b", True, 65536, True), Model("c", False, 262144, True),
              Model("d", True, 131072, False)]
    model, why = agents.pick(loaded, None, None)
    assert model.name == "b" and why == "the loaded model with tool calls and the biggest context (65536 tokens)"
    # none loaded: the biggest of all; a context not known counts as the smallest; a tie goes by name
    idle = [Model("z", True, 8192, False), Model("y", True, None, False), Model("x", True, 8192, False)]
    model, why = agents.pick(idle, None, None)
    assert model.name == "x" and "none of them is loaded" in why
    with pytest.raises(LaunchError, match="no model on the gateway has a format with tool calls"):
        agents.pick([Model("c", False, 262144, True)], None, None)
    with pytest.raises(LaunchError, match="tool calls"):
        agents.pick([], None, None)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_context_below_the_agents_prompt_is_refused(client):
    need = CLIENTS[client].min_context
    agents.check_context(CLIENTS[client], Model("m", True, need, True))
    agents.check_context(CLIENTS[client], Model("m", True, None, True))  # not known: not refused
    with pytest.raises(LaunchError, match=f"context of {need - 1} tokens.*--force"):
        agents.check_context(CLIENTS[client], Model("m", True, need - 1, True))


def test_claude_code_gets_every_model_slot_the_compaction_window_and_a_stable_prompt():
    s = agents.settings(CLIENTS["claude"], "http://127.0.0.1:8080/", CODER, keyed=True)
    assert s.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8080" and s.env["ANTHROPIC_AUTH_TOKEN"] is KEY
    assert s.env["ANTHROPIC_API_KEY"] == ""
    for var in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                "CLAUDE_CODE_SUBAGENT_MODEL"):
        assert s.env[var] == "coder"
    assert s.env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "65536"
    assert s.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and s.env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert not s.args and not s.files
    plain = agents.settings(CLIENTS["claude"], "http://h:1", Model("m", True, None, True), keyed=False)
    assert plain.env["ANTHROPIC_AUTH_TOKEN"] == agents.NO_KEY and "CLAUDE_CODE_AUTO_COMPACT_WINDOW" not in plain.env


def test_codex_gets_a_provider_of_its_own_as_overrides_and_the_same_as_toml():
    s = agents.settings(CLIENTS["codex"], "http://127.0.0.1:8080", CODER, keyed=True)
    pairs = dict(a.split("=", 1) for a in s.args[1::2])
    assert s.args[::2] == ["-c"] * len(pairs)
    values = {k: tomllib.loads(f"v = {v}")["v"] for k, v in pairs.items()}
    assert values == {"model_provider": "gguf-gateway", "model_providers.gguf-gateway.name": "gguf-gateway",
                      "model_providers.gguf-gateway.base_url": "http://127.0.0.1:8080/v1",
                      "model_providers.gguf-gateway.wire_api": "responses",
                      "model_providers.gguf-gateway.env_key": KEY_VAR, "model": "coder", "model_context_window": 65536}
    assert s.env == {KEY_VAR: KEY}
    block = tomllib.loads(s.note.split("\n", 1)[1])
    assert block["model_providers"]["gguf-gateway"]["wire_api"] == "responses" and block["model"] == "coder"
    bare = agents.settings(CLIENTS["codex"], "http://h:1", Model('a "b"', True, None, True), keyed=False)
    assert not bare.env and not any("env_key" in a or "context" in a for a in bare.args)
    assert tomllib.loads(bare.args[-1].split("=", 1)[1].join(["v = ", ""]))["v"] == 'a "b"'


def test_opencode_continue_and_aider_in_their_own_forms_the_key_by_reference():
    oc = agents.settings(CLIENTS["opencode"], "http://h:1", CODER, keyed=True)
    config = json.loads(oc.env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["gguf-gateway"]
    assert provider["options"] == {"baseURL": "http://h:1/v1", "apiKey": "{env:GGUF_GATEWAY_KEY}"}
    assert provider["models"]["coder"]["limit"]["context"] == 65536 and config["model"] == "gguf-gateway/coder"
    assert oc.env[KEY_VAR] is KEY

    cn = agents.settings(CLIENTS["continue"], "http://h:1", CODER, keyed=True)
    (name, text), = cn.files.items()
    assert cn.args == ["--config", "{dir}/" + name]
    assert 'apiKey: "${{ secrets.GGUF_GATEWAY_KEY }}"' in text and "contextLength: 65536" in text
    assert 'apiBase: "http://h:1/v1"' in text

    ai = agents.settings(CLIENTS["aider"], "http://h:1", Model("org/m:q4", True, 16384, True), keyed=False)
    (name, text), = ai.files.items()
    assert name == "org_m_q4.aider-metadata.json"
    assert ai.args == ["--model", "openai/org/m:q4", "--model-metadata-file", "{dir}/" + name]
    assert json.loads(text)["openai/org/m:q4"]["max_input_tokens"] == 16384
    assert ai.env == {"OPENAI_API_BASE": "http://h:1/v1", "OPENAI_API_KEY": agents.NO_KEY}


def test_print_quotes_for_the_shell_and_never_holds_the_key(tmp_path):
    s = agents.settings(CLIENTS["claude"], "http://h:1", Model("it's", True, 65536, True), keyed=True)
    text = printed("claude", s, tmp_path, ["-p", "hi there"], keyed=True)
    assert "export ANTHROPIC_AUTH_TOKEN=\"$GGUF_GATEWAY_KEY\"" in text
    assert f"export ANTHROPIC_MODEL={shlex.quote(chr(39).join(['it', 's']))}" in text
    assert text.splitlines()[-1] == "claude -p 'hi there'"
    codex = printed("codex", agents.settings(CLIENTS["codex"], "http://h:1", CODER, keyed=False), tmp_path, [], False)
    command = next(line for line in codex.splitlines() if line.startswith("codex "))
    assert shlex.split(command)[1:3] == ["-c", 'model_provider="gguf-gateway"']
    assert "# [model_providers.gguf-gateway]" in codex
    cn = printed("cn", agents.settings(CLIENTS["continue"], "http://h:1", CODER, keyed=True), tmp_path, [], True)
    assert f"cn --config {tmp_path}/coder.continue.yaml\n\n# {tmp_path}/coder.continue.yaml (written by launch) holds:" \
        "\n# name: gguf-gateway\n" in cn
    assert '#     apiKey: "${{ secrets.GGUF_GATEWAY_KEY }}"' in cn


def test_an_unknown_client_is_one_line_and_exit_2(capsys):
    assert cli.main(["launch", "vim"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unknown client 'vim': launch knows claude, codex")


def test_no_gateway_running_is_one_line(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["launch", "codex", "--url", url, "--", "exec", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot reach gguf-gateway at {url}" in err


def test_no_gateway_at_the_configured_address_is_one_line(capsys, write_config):
    path = write_config(f"server:\n  port: {free_port()}\n")
    assert cli.main(["launch", "claude", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no gguf-gateway answers at http://127.0.0.1:" in err


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A gateway with a model without tool calls (``chat``), a small one with them
    (``small``), and keys."""
    d = tmp_path_factory.mktemp("launch")
    tm.plain(d / "chat.gguf", context_length=65536)
    agent_model(d / "small.gguf")
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  api_keys: [sk-launch]\nmodels:\n"
                   f"  chat: {{path: {d}/chat.gguf, n_ctx: 65536}}\n  small: {{path: {d}/small.gguf, n_ctx: 4096}}\n")
    with ServerProcess("--config", str(cfg)) as server:
        yield server


@pytest.mark.slow
def test_errors_against_a_running_gateway_are_one_line(gateway, capsys, monkeypatch):
    printed_out = []

    def launch(*args: str) -> tuple[int, str]:
        code = cli.main(["launch", *args, "--url", gateway.url, "--print"])
        out, err = capsys.readouterr()
        printed_out.append(out)
        return code, err

    code, err = launch("codex")  # no key, and no terminal to ask on
    assert code == 1 and err == f"error: the gateway at {gateway.url} needs an API key: set $GGUF_GATEWAY_KEY " \
                                "(or pass --api-key)\n"
    code, err = launch("codex", "--api-key", "sk-wrong")
    assert code == 1 and err.count("\n") == 1 and "refused the key (401: " in err
    monkeypatch.setenv(KEY_VAR, "sk-launch")
    code, err = launch("codex")  # small has tool calls, but its context is too small for Codex's prompt
    assert code == 1 and err.count("\n") == 1 and err.startswith(
        "error: small has a context of 4096 tokens, and Codex's prompt needs about 24000")
    code, err = launch("aider", "--model", "nope")
    assert code == 1 and err == "error: no model 'nope' on the gateway (named with --model); " \
                                "see `gguf-gateway models`\n"
    code, err = launch("codex", "--force")
    assert code == 0 and err == "Codex on small: the model (none of them is loaded) with tool calls and the " \
                                "biggest context (4096 tokens)\n"
    out = printed_out[-1]  # --print with a key: its name, never its value
    assert "sk-launch" not in out and "env_key=\"GGUF_GATEWAY_KEY\"" in out


@pytest.mark.slow
def test_a_missing_agent_says_how_to_install_it(gateway, capsys, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "sk-launch")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli.main(["launch", "aider", "--url", gateway.url]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: aider is not installed (no `aider` on PATH): pipx install aider-chat " \
                      "(or: pip install aider-chat)"


@pytest.mark.slow
def test_ctrl_c_reaches_the_agent_and_its_exit_code_comes_back(gateway, tmp_path):
    """Ctrl-C at a terminal signals the whole foreground group: here a stand-in for aider (a
    shell script on PATH: what launch runs is any program by that name) that ends on it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ready = tmp_path / "ready"
    agent = bin_dir / "aider"
    agent.write_text(f"#!/bin/sh\ntrap 'echo interrupted; exit 42' INT\necho \"$@\" > {ready}\n"
                     "while true; do sleep 0.1; done\n")
    agent.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", KEY_VAR: "sk-launch"}
    proc = subprocess.Popen([*gateway_command(), "launch", "aider", "--url", gateway.url, "--", "--yes-always"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.read_text().split()[-1] == "--yes-always"  # the person's arguments after launch's own
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42 and out == "interrupted\n" and "Traceback" not in err
