"""aider itself (PyPI's aider-chat, ``aider --message`` headless) against the real gateway on
loopback, in both of the shapes its users configure: OpenAI's chat completions
(``--model openai/NAME`` with ``OPENAI_API_BASE``) and Ollama's (``--model ollama_chat/NAME`` with
``OLLAMA_API_BASE``), each with its two main edit formats. A scripted model writes the edit in
that format (a SEARCH/REPLACE block for ``diff``, the whole file for ``whole``); aider applies it
to the file on disk. Every request aider makes goes through a logging proxy, and none is
answered with a 4xx or 5xx.

Nothing else is reached: update checks, analytics and release notes are off by aider's own
switches; its model-price list (which it fetches from GitHub once a day) is a cached one in the
test's home that lists these models, and litellm reads its bundled copy (``LITELLM_LOCAL_MODEL_COST_MAP``).

aider is installed once into a virtual environment of its own in the repository's ignored
.cache/aider (it pins its own versions of aiohttp and the rest); where the package index is not
to be had the tests are skipped, saying why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from agents import LoggingProxy, pip_program
from helpers import REPO, ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

VERSION = "0.86.2"  # the version this tier was written against; GGUF_GATEWAY_AIDER picks another
BEFORE, AFTER = 'print("hello")', 'print("goodbye")'
EDITS = {  # what a model answers in each edit format, as aider's own prompts show it
    "diff": ["hello.py", "\n", "```", "python", "\n", "<<<<<<< SEARCH", "\n", BEFORE, "\n", "=======", "\n",
             AFTER, "\n", ">>>>>>> REPLACE", "\n", "```", "\n"],
    "whole": ["hello.py", "\n", "```", "python", "\n", AFTER, "\n", "```", "\n"],
}
FLAGS = ["--no-git", "--no-check-update", "--analytics-disable", "--no-show-release-notes", "--no-show-model-warnings",
         "--yes-always", "--no-pretty", "--no-fancy-input"]


def aider_binary() -> Path:
    return pip_program("aider-chat", VERSION, "aider", "aider", env_version="GGUF_GATEWAY_AIDER")


@pytest.fixture(scope="module")
def aider(tmp_path_factory):
    binary = aider_binary()
    d = tmp_path_factory.mktemp("aider")
    for fmt, answer in EDITS.items():
        tm.plain(d / f"{fmt}.gguf", answer, context_length=16384)  # aider's prompt is ~2.5k tokens of bytes
    tm.plain(d / "plain.gguf", ["Hello", " from", " the", " gateway", "."], context_length=16384)
    events = d / "events.jsonl"
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {events}\nmodels:\n" + "".join(
        f"  {name}: {{path: {d}/{name}.gguf, n_ctx: 16384, parallel: 1}}\n" for name in ("diff", "whole", "plain")))
    home = d / "home"
    (home / ".aider" / "caches").mkdir(parents=True)
    # aider fetches this list when its cached copy is missing, stale or empty: a cached one that
    # knows these models (as litellm's list knows hosted ones) keeps it on loopback
    known = {f"{provider}/{name}": {"max_input_tokens": 16384, "max_output_tokens": 4096, "litellm_provider": provider,
                                    "mode": "chat", "input_cost_per_token": 0, "output_cost_per_token": 0}
             for provider in ("openai", "ollama_chat") for name in ("diff", "whole", "plain")}
    (home / ".aider" / "caches" / "model_prices_and_context_window.json").write_text(json.dumps(known))
    with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as server, LoggingProxy(server.url) as proxy:

        def run(model: str, *args: str) -> tuple[subprocess.CompletedProcess, Path, list[dict]]:
            """``aider --model model ARGS hello.py`` in a fresh directory: its result, the
            directory, and the proxy's records of its requests."""
            work = d / f"work{len(proxy.records)}"
            work.mkdir()
            (work / "hello.py").write_text(BEFORE + "\n")
            env = {"PATH": os.environ["PATH"], "HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                   "OPENAI_API_BASE": f"{proxy.url}/v1", "OPENAI_API_KEY": "x", "OLLAMA_API_BASE": proxy.url}
            before = len(proxy.records)
            done = subprocess.run([str(binary), "--model", model, *FLAGS, *args, "hello.py"], cwd=work, env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
            return done, work, proxy.records[before:]

        yield run
        log = server.output()
    assert events.read_text().strip(), log[-3000:]


def no_failures(records: list[dict]) -> None:
    failed = [(r["method"], r["path"], r["status"]) for r in records if r["status"] >= 400]
    assert records and not failed, failed


@pytest.mark.parametrize("fmt", ["diff", "whole"])
@pytest.mark.parametrize("provider, route", [("openai", "/v1/chat/completions"), ("ollama_chat", "/api/chat")])
def test_an_edit_is_applied(aider, provider, route, fmt):
    done, work, records = aider(f"{provider}/{fmt}", "--edit-format", fmt, "--message", "Say goodbye instead.")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert (work / "hello.py").read_text() == AFTER + "\n", out[-3000:]  # aider applied the model's edit
    assert "Applied edit to hello.py" in out
    assert "githubusercontent" not in out and "pypi.org" not in out  # nothing but loopback was asked
    no_failures(records)
    chats = [r for r in records if r["path"] == route]
    assert len(chats) == 1, [(r["method"], r["path"]) for r in records]  # no retry, no reflection
    body = chats[0]["body"]
    assert body["model"] == fmt and body["stream"] is True
    assert "hello.py" in body["messages"][-1]["content"] or any(BEFORE in str(m["content"]) for m in body["messages"])


@pytest.mark.parametrize("provider", ["openai", "ollama_chat"])
def test_a_question_is_answered(aider, provider):
    done, work, records = aider(f"{provider}/plain", "--chat-mode", "ask", "--message", "What does hello.py print?")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Hello from the gateway." in out
    assert (work / "hello.py").read_text() == BEFORE + "\n"
    no_failures(records)


def test_the_agents_page_shows_these_settings():
    readme = (REPO / "docs" / "agents.md").read_text()
    assert "aider --model openai/" in readme and "OPENAI_API_BASE=http://127.0.0.1:8080/v1" in readme
    assert "aider --model ollama_chat/" in readme and "OLLAMA_API_BASE=http://127.0.0.1:8080" in readme
