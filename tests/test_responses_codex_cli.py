"""Codex CLI itself (npm's @openai/codex, `codex exec` headless) against the real gateway over
the Responses API: a text turn and a tool round trip whose tool really runs, each request Codex
makes recorded by a logging proxy and none answered with a 4xx or 5xx.

Codex is installed once into the repository's ignored .cache/codex; without npm (or without the
registry) the tests are skipped, saying why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import LoggingProxy, call_model, npm_program
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

CODEX_VERSION = "0.169.0"  # the version this tier was written against (issue 35)
PROOF = "codex-was-here"


def codex_binary() -> Path:
    return npm_program("@openai/codex", CODEX_VERSION, "codex", "codex")




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

        def run(prompt: str, *args: str, resume_in: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
            """``codex exec`` in a new directory, or with ``resume_in`` ``codex exec resume
            --last`` in that directory (--last picks the newest session started there)."""
            work = resume_in or Path(d / f"work{len(proxy.records)}")
            work.mkdir(exist_ok=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
            command = ["exec", "resume", "--last"] if resume_in else ["exec"]
            done = subprocess.run([str(binary), *command, "--skip-git-repo-check", *args, prompt], cwd=work,
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


def test_a_resumed_session_sends_the_first_turns_history(codex):
    run, proxy = codex
    done, work = run("Say hello")
    assert done.returncode == 0, done.stderr[-2000:]
    first = len(proxy.records)
    again, _ = run("Say it once more", resume_in=work)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Hello from the gateway." in again.stdout
    no_failures(proxy)
    turns = [r["body"] for r in proxy.records[first:] if r["path"] == "/v1/responses"]
    assert turns, "the resumed session made no Responses request"
    history = json.dumps(turns[-1]["input"])
    # the first turn's question and answer, then the new question, all in the resumed request
    assert history.index("Say hello") < history.index("Hello from the gateway.") < history.index("Say it once more")
