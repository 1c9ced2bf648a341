"""``gguf-gateway launch`` running the real agents headless (Claude Code ``-p``, ``codex exec``,
``opencode run``, Continue's ``cn -p``, aider ``--message``), each at the version its own tier
pins and installs on first use (skipped, saying why, where npm or the package index is not to
be had), against the real gateway through a logging proxy: each gets an answer and no request
is refused. The headless flags go after ``--``, as a person's own would.

- ``launch`` picks the one model with tool calls by itself and says why;
- ``--print``'s lines, run by a shell with nothing else set, do the same;
- Codex through ``launch`` with a small ``model_auto_compact_token_limit`` compacts its session
  (through the custom provider that is one more ordinary ``/v1/responses`` turn), and the next
  turn answers;
- with keys on the gateway, the key reaches the agent from ``$GGUF_GATEWAY_KEY`` alone, and
  no file of ours holds it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import LoggingProxy
from helpers import REPO, ServerProcess, gateway_command
from test_aider_e2e import FLAGS as AIDER_FLAGS
from test_aider_e2e import aider_binary
from test_claude_code_e2e import claude
from test_continue_cli_e2e import cn_binary
from test_opencode_e2e import opencode
from test_responses_codex_cli import codex_binary

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

ANSWER = "Hello from the gateway."
N_CTX = 131072  # the agents' prompts in a scripted model's byte vocabulary (opencode asks for 32000 more)

# each agent: its executable (installed on first use), its headless arguments, what else keeps it
# on this machine (its own switches: launch leaves them to the person)
AGENTS = {
    "claude": (lambda: Path(claude()), ["-p", "Say hello", "--tools", "", "--max-turns", "2"],
               {"DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}),
    "codex": (codex_binary, ["exec", "--skip-git-repo-check", "Say hello"], {}),
    "opencode": (lambda: Path(opencode()), ["run", "Say hello"],
                 {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                  "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                  "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1"}),
    "continue": (cn_binary, ["-p", "Say hello"], {"CONTINUE_CLI_ENABLE_TELEMETRY": "0", "CONTINUE_METRICS_ENABLED": "0"}),
    "aider": (aider_binary, ["--message", "Say hello", *AIDER_FLAGS], {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}),
}


def write_models(d: Path, keys: str = "") -> Path:
    """``coder``: answers ``ANSWER`` under Qwen 2.5's template (so its format has tool calls);
    ``chat``: a bigger context, no tool calls (launch passes it over)."""
    qwen = tm.llama_cpp_source_file("models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", REPO / ".cache" / "templates")
    tm.plain(d / "coder.gguf", ["Hello", " from", " the", " gateway", "."], chat_template=qwen.read_text(),
             context_length=N_CTX)
    tm.plain(d / "chat.gguf", context_length=2 * N_CTX)
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n{keys}models:\n"
                   f"  coder: {{path: {d}/coder.gguf, n_ctx: {N_CTX}, parallel: 1}}\n"
                   f"  chat: {{path: {d}/chat.gguf, n_ctx: {2 * N_CTX}, parallel: 1}}\n")
    return cfg


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    d = tmp_path_factory.mktemp("launch-agents")
    with ServerProcess("--config", str(write_models(d))) as server, LoggingProxy(server.url) as proxy:
        yield proxy


def environment(name: str, home: Path, more: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's bin folder first on PATH, a fresh HOME (and CODEX_HOME in it), its own
    switches, and none of the developer's OpenAI, Anthropic or Codex settings."""
    binary, _, switches = AGENTS[name]
    home.mkdir(parents=True, exist_ok=True)
    (home / ".codex").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "CODEX_", "CLAUDE_"))}
    return {**env, "PATH": f"{binary().parent}{os.pathsep}{env['PATH']}", "HOME": str(home),
            "CODEX_HOME": str(home / ".codex"), **switches, **(more or {})}


def launch(name: str, url: str, work: Path, *args: str, env: dict[str, str] | None = None,
           passed_on: list[str] | None = None) -> subprocess.CompletedProcess:
    """``gguf-gateway launch NAME --url URL ARGS -- <its headless arguments>`` in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    command = [*gateway_command(), "launch", name, "--url", url, *args, "--",
               *(AGENTS[name][1] if passed_on is None else passed_on)]
    try:
        return subprocess.run(command, cwd=work, env=env or environment(name, work.parent / "home"),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"launch {name} timed out: {e.stdout!r} {e.stderr!r}"[-3000:])


def answered(done: subprocess.CompletedProcess, records: list[dict]) -> None:
    """The agent answered, and none of its requests was refused (those after launch's own:
    ``/models``, whether ``/v1/models`` asks for a key (a 401 where it does), each model's
    ``/props`` and ``/api/show``)."""
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert ANSWER in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
    shows = [i for i, r in enumerate(records) if r["path"] == "/api/show"]
    agents = records[shows[-1] + 1:] if shows else records
    generations = [r for r in agents if r["method"] == "POST" and r["path"].startswith("/v1/")]
    assert generations and all(r["status"] == 200 for r in agents), [(r["path"], r["status"]) for r in agents]


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_launch_runs_the_agent_and_it_answers(gateway, tmp_path, name):
    first = len(gateway.records)
    done = launch(name, gateway.url, tmp_path / "work")
    # the one model with tool calls, though chat's context is bigger
    assert done.stderr.splitlines()[0].endswith(
        f"on coder: the model (none of them is loaded) with tool calls and the biggest context ({N_CTX} tokens)") \
        or "on coder: the loaded model with tool calls" in done.stderr.splitlines()[0], done.stderr[-2000:]
    answered(done, gateway.records[first:])
    models = {r["body"].get("model") for r in gateway.records[first:]
              if r["path"].startswith("/v1/") and isinstance(r["body"], dict)}
    assert models - {None} <= {"coder", "openai/coder"}, models


def test_the_agents_exit_code_comes_back(gateway, tmp_path):
    done = launch("codex", gateway.url, tmp_path / "work", passed_on=["--no-such-flag"])
    assert done.returncode == 2 and "--no-such-flag" in done.stderr  # clap's usage error, as Codex exits


@pytest.mark.parametrize("name", ["claude", "codex"])
def test_the_printed_settings_exported_by_hand_do_the_same(gateway, tmp_path, name):
    printed = launch(name, gateway.url, tmp_path / "work", "--print")
    assert printed.returncode == 0, printed.stderr
    first = len(gateway.records)
    # a shell with the agent's bin on PATH and nothing of the gateway's: only what was printed
    env = environment(name, tmp_path / "home")
    done = subprocess.run(["bash", "-c", printed.stdout], cwd=tmp_path / "work", env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)
    answered(done, gateway.records[first:])


def test_codex_compacts_a_long_session_and_the_next_turn_answers(gateway, tmp_path):
    limit = ["-c", "model_auto_compact_token_limit=3000"]
    work = tmp_path / "work"
    first = len(gateway.records)
    done = launch("codex", gateway.url, work, passed_on=["exec", "--skip-git-repo-check", *limit, "Say hello"])
    answered(done, gateway.records[first:])
    again = launch("codex", gateway.url, work,
                   passed_on=["exec", "resume", "--last", "--skip-git-repo-check", *limit, "Say it again"])
    turns = [r for r in gateway.records[first:] if r["path"] == "/v1/responses"]
    answered(again, turns)
    # the first turn, the compaction (a turn of its own through a custom provider), the next turn
    assert len(turns) >= 3, [len(str(r["body"])) for r in turns]
    # Codex 0.169's words: a turn that asks for the summary, and a later one that carries it
    asks = [i for i, r in enumerate(turns) if "continue the work" in json.dumps(r["body"]["input"][-1:])]
    assert asks and "summary" in json.dumps(turns[-1]["body"]["input"]) and asks[0] < len(turns) - 1


def test_with_keys_the_key_reaches_the_agent_from_the_environment(tmp_path):
    cfg = write_models(tmp_path, keys="  api_keys: [sk-agent]\n")
    with ServerProcess("--config", str(cfg)) as server, LoggingProxy(server.url) as proxy:
        for name in ("codex", "claude", "continue"):
            env = environment(name, tmp_path / "home", {"GGUF_GATEWAY_KEY": "sk-agent"})
            first = len(proxy.records)
            answered(launch(name, proxy.url, tmp_path / name, env=env), proxy.records[first:])
    ours = list((tmp_path / "home" / ".local" / "state" / "gguf-gateway" / "launch").iterdir())
    assert ours and all(b"sk-agent" not in path.read_bytes() for path in ours)  # Continue's config names it
