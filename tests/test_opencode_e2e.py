"""opencode itself (npm's ``opencode-ai``, ``opencode run`` headless) against the real gateway
over the OpenAI chat completions API, as a custom ``@ai-sdk/openai-compatible`` provider: a text
turn, and a tool round trip whose tool (opencode's ``bash``) really runs and whose result goes
back to the model, which then answers. Each request opencode makes is recorded by a logging
proxy, and none is answered with a 4xx or 5xx.

opencode is installed once into the repository's ignored .cache/opencode; without npm (or without
the registry) the tests are skipped, saying why. Nothing it would fetch from elsewhere (models.dev,
updates, default plugins, LSP servers, sharing) is asked for: see ``environment``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import LoggingProxy, npm_program
from helpers import ServerProcess, agent_model

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

VERSION = "1.18.33"  # the registry's latest when this tier was written
PROOF = "opencode-was-here"
COMMAND = f"echo {PROOF} > proof.txt"
CALL = ["<tool_call>", "\n", '{"name":', ' "bash",', ' "arguments":', ' {"command":', f' "{COMMAND}"}}}}', "\n",
        "</tool_call>"]
FINAL = ["Wrote", " proof", ".txt", "."]
# opencode's prompt (system prompt and ten tools' schemas) is ~40k tokens of a scripted model's
# byte vocabulary, and it asks for max_tokens 32000 of a model it has no limits for
N_CTX = 131072


def opencode() -> str:
    """The ``opencode`` executable, installed on first use."""
    return str(npm_program("opencode-ai", VERSION, "opencode", "opencode"))


def config(base_url: str) -> dict:
    """The ``opencode.json`` of docs/agents.md: the gateway as an OpenAI-compatible provider."""
    return {"$schema": "https://opencode.ai/config.json",
            "provider": {"gateway": {"npm": "@ai-sdk/openai-compatible", "name": "gguf-gateway",
                                     "options": {"baseURL": base_url},
                                     "models": {"plain": {"name": "plain"}, "agent": {"name": "agent"}}}},
            "model": "gateway/plain", "autoupdate": False, "share": "disabled"}


def environment(home: Path) -> dict[str, str]:
    """A fresh HOME, and nothing opencode would fetch from outside this machine."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1"}


@pytest.fixture(scope="module")
def run_opencode(tmp_path_factory):
    exe = opencode()
    d = tmp_path_factory.mktemp("opencode")
    tm.plain(d / "plain.gguf", ["Hello", " from", " the", " gateway", "."], context_length=N_CTX)
    agent_model(d / "agent.gguf", FINAL, call=CALL, context_length=N_CTX)
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {d}/events.jsonl\nmodels:\n" + "".join(
        f"  {name}: {{path: {d}/{name}.gguf, n_ctx: {N_CTX}, parallel: 1}}\n" for name in ("plain", "agent")))
    home = d / "home"
    home.mkdir()
    with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as server, LoggingProxy(server.url) as proxy:

        def run(prompt: str, *args: str) -> tuple[subprocess.CompletedProcess, Path, list[dict]]:
            """``opencode run`` in a fresh working directory holding ``opencode.json``: its result,
            the directory, and the requests it made."""
            work = d / f"work{len(proxy.records)}"
            work.mkdir()
            (work / "opencode.json").write_text(json.dumps(config(proxy.url + "/v1"), indent=2))
            first = len(proxy.records)
            try:
                done = subprocess.run([exe, "run", "--print-logs", "--log-level", "WARN", *args, prompt], cwd=work,
                                      env=environment(home), stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=120)
            except subprocess.TimeoutExpired as e:
                pytest.fail(f"opencode run timed out: {e.stderr!r}"[-3000:] + server.output()[-2000:])
            return done, work, proxy.records[first:]

        yield run


def no_failures(records: list[dict]) -> None:
    failed = [(r["method"], r["path"], r["status"]) for r in records if r["status"] >= 400]
    assert records and not failed, failed


def test_a_text_turn(run_opencode):
    done, _, records = run_opencode("Say hello")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Hello from the gateway." in done.stdout
    no_failures(records)
    assert {r["path"] for r in records} == {"/v1/chat/completions"}
    turn = next(r["body"] for r in records if r["body"].get("tools"))
    assert turn["model"] == "plain" and turn["stream"] is True
    assert "bash" in {t["function"]["name"] for t in turn["tools"]}


def test_a_tool_round_trip_runs_opencodes_bash_tool(run_opencode):
    done, work, records = run_opencode("Write proof.txt", "-m", "gateway/agent")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "proof.txt").read_text().strip() == PROOF  # the tool really ran
    assert "Wrote proof.txt." in done.stdout
    no_failures(records)
    last = [r["body"] for r in records if r["body"].get("tools")][-1]
    call = next(m for m in last["messages"] if m.get("tool_calls"))["tool_calls"][0]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"])["command"] == COMMAND
    result = next(m for m in last["messages"] if m["role"] == "tool")
    assert result["tool_call_id"] == call["id"]
