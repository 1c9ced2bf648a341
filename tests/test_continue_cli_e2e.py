"""The Continue CLI itself (npm's @continuedev/cli, `cn -p` headless) against the real gateway on
loopback, pointed at it by a local config.yaml (`--config`, provider openai) and nothing else: a
text turn, and tool round trips in which a scripted model under Qwen 2.5's chat template calls
Continue's built-in Bash and Read tools, Continue really runs them and sends their results back,
and the model answers. Every request Continue makes goes through a logging proxy, and none is
answered with a 4xx or 5xx; the gateway's inference events say the same.

No Continue account is needed: with a local config file headless mode asks the hub for nothing.
Its OpenTelemetry metrics are off (CONTINUE_CLI_ENABLE_TELEMETRY=0, CONTINUE_METRICS_ENABLED=0).
The one call it makes elsewhere, a version check to api.continue.dev at start-up, has no switch;
it fails quietly offline and does not hold up the answer.

Continue is installed once into the repository's ignored .cache/continue-cli; without npm (or
without the registry) the tests are skipped, saying why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import LoggingProxy, npm_program
from helpers import REPO, ServerProcess, agent_model

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

VERSION = "1.5.47"  # the version this tier was written against; GGUF_GATEWAY_CONTINUE_CLI picks another
PROOF = "continue-ran"
FINAL = ["The", " command", " ran", "."]
NOTE = "The secret word is walrus."


def call(name: str, arguments: str) -> list[str]:
    """A Hermes-style call of ``name`` (Qwen 2.5's format): ``arguments`` is the JSON object."""
    return ["<tool_call>", "\n", '{"name":', f' "{name}",', ' "arguments":', f" {arguments}}}", "\n", "</tool_call>"]


def cn_binary() -> Path:
    """Continue's ``cn``, installed on first use."""
    return npm_program("@continuedev/cli", VERSION, "cn", "continue-cli", env_version="GGUF_GATEWAY_CONTINUE_CLI")


def config_yaml(model: str, api_base: str) -> str:
    """The config.yaml docs/agents.md shows, for ``model`` at ``api_base``."""
    return (f"name: gguf-gateway\nversion: 1.0.0\nschema: v1\nmodels:\n  - name: {model}\n    provider: openai\n"
            f"    model: {model}\n    apiBase: {api_base}\n    apiKey: x\n")


@pytest.fixture(scope="module")
def continue_cli(tmp_path_factory):
    binary = cn_binary()
    d = tmp_path_factory.mktemp("continue-cli")
    # Continue's prompt with its tools is ~7.5k tokens of a scripted model's byte vocabulary
    tm.plain(d / "plain.gguf", ["Hello", " from", " the", " gateway", "."], context_length=32768)
    agent_model(d / "agent.gguf", FINAL, call=call("Bash", f'{{"command": "echo {PROOF} > marker.txt && cat marker.txt"}}'),
                context_length=32768)
    agent_model(d / "reader.gguf", ["Read", " it", "."], call=call("Read", '{"filepath": "notes.txt"}'),
                context_length=32768)
    events = d / "events.jsonl"
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {events}\nmodels:\n" + "".join(
        f"  {name}: {{path: {d}/{name}.gguf, n_ctx: 32768, parallel: 1}}\n" for name in ("plain", "agent", "reader")))
    home = d / "home"
    home.mkdir()
    with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as server, LoggingProxy(server.url) as proxy:

        def run(model: str, prompt: str, files: dict[str, str] | None = None
                ) -> tuple[subprocess.CompletedProcess, Path, list[dict]]:
            """``cn -p prompt`` with ``model``, in a fresh directory holding ``files``: its result,
            the directory, and the proxy's records of its requests."""
            work = d / f"work{len(proxy.records)}-{model}"
            work.mkdir()
            for name, text in (files or {}).items():
                (work / name).write_text(text)
            config = d / f"{model}.yaml"
            config.write_text(config_yaml(model, f"{proxy.url}/v1"))
            env = {"PATH": os.environ["PATH"], "HOME": str(home), "CONTINUE_GLOBAL_DIR": str(home / ".continue"),
                   "CONTINUE_CLI_ENABLE_TELEMETRY": "0", "CONTINUE_METRICS_ENABLED": "0"}
            before = len(proxy.records)
            done = subprocess.run([str(binary), "-p", prompt, "--config", str(config)], cwd=work, env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
            return done, work, proxy.records[before:]

        yield run, events
        log = server.output()
    statuses = [json.loads(line)["status"] for line in events.read_text().splitlines()]
    assert statuses and all(s == 200 for s in statuses), (statuses, log[-3000:])


def test_the_agents_page_shows_this_config():
    readme = (REPO / "docs" / "agents.md").read_text()
    assert config_yaml("qwen2.5-7b-instruct", "http://127.0.0.1:8080/v1") in readme
    assert "CONTINUE_CLI_ENABLE_TELEMETRY=0 CONTINUE_METRICS_ENABLED=0 cn --config ./config.yaml -p" in readme


def no_failures(records: list[dict]) -> None:
    failed = [(r["method"], r["path"], r["status"]) for r in records if r["status"] >= 400]
    assert records and not failed, failed


def test_a_text_turn(continue_cli):
    run, _ = continue_cli
    done, _, records = run("plain", "Say hello")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert done.stdout.strip() == "Hello from the gateway."
    no_failures(records)
    assert [r["path"] for r in records] == ["/v1/chat/completions"]
    body = records[0]["body"]
    assert body["model"] == "plain" and body["stream"] is True
    assert {"Read", "Bash"} <= {t["function"]["name"] for t in body["tools"]}  # what the scripted calls name


def test_a_bash_tool_round_trip_runs_the_command(continue_cli):
    run, _ = continue_cli
    done, work, records = run("agent", "Write the marker file.")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert (work / "marker.txt").read_text().strip() == PROOF  # the tool really ran
    assert done.stdout.strip() == "".join(FINAL)
    no_failures(records)
    assert len(records) == 2
    messages = records[-1]["body"]["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "Bash"
    assert messages[-1]["role"] == "tool" and PROOF in json.dumps(messages[-1]["content"])  # its output went back


def test_a_read_tool_round_trip_reads_the_file(continue_cli):
    run, _ = continue_cli
    done, work, records = run("reader", "Read notes.txt.", {"notes.txt": NOTE + "\n"})
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert done.stdout.strip() == "Read it."
    no_failures(records)
    assert len(records) == 2
    messages = records[-1]["body"]["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "Read"
    assert messages[-1]["role"] == "tool" and "walrus" in json.dumps(messages[-1]["content"])
