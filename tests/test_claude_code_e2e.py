"""The real Claude Code (npm ``@anthropic-ai/claude-code``, installed once into the repository's
``.cache/claude-code``), headless (``claude -p``):

- against the real gateway on loopback (through a logging proxy: every request Claude Code made,
  and each refusal's answer): a text turn; and a scripted model under Qwen 2.5's chat template
  calls Claude Code's Bash tool, Claude Code runs it and sends its result back, and the model
  answers. Every request Claude Code made is in the gateway's inference events, and none was
  refused, except, where the context is too small for its max_tokens, a try whose max_tokens
  does not fit: refused in the words Claude Code reads, and asked again with a max_tokens that
  fits, to an answer. How many requests Claude Code makes, and in what order, is its own affair
  (on a slow machine it sends more): what is asserted is what the gateway answered to each. A
  second session reads the first one's prompt from the cache;
- its first request with its whole default prompt (24 tools, ~100k tokens of a scripted model's
  byte vocabulary: too long to run here), caught by a stand-in server, then read by the gateway's
  parser and made into each call format's grammar, which llama.cpp's grammar parser takes.

Skipped, with the reason, where npm or the package is not to be had."""

import json
import os
import re
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from agents import LoggingProxy, npm_program
from helpers import ServerProcess, agent_model, vocab_only
from test_anthropic_claude_code_e2e import CC_MAX_TOKENS

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

VERSION = "2.1.197"  # the version this was tried with; GGUF_GATEWAY_CLAUDE_CODE picks another
COMMAND = "echo claude-code-ran > marker.txt"
CALL = ["<tool_call>", "\n", '{"name":', ' "Bash",', ' "arguments":', ' {"command":', f' "{COMMAND}"}}}}', "\n",
        "</tool_call>"]
FINAL = ["The", " command", " ran", "."]


def environment(url: str, home) -> dict[str, str]:
    """Claude Code pointed at ``url``, with nothing sent anywhere else."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "dummy",
            "ANTHROPIC_MODEL": "agent", "ANTHROPIC_SMALL_FAST_MODEL": "agent", "ANTHROPIC_DEFAULT_HAIKU_MODEL": "agent",
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_ERROR_REPORTING": "1"}


def claude() -> str:
    """The ``claude`` executable, installed on first use."""
    return str(npm_program("@anthropic-ai/claude-code", VERSION, "claude", "claude-code",
                           env_version="GGUF_GATEWAY_CLAUDE_CODE"))


def run_claude(tmp_path, n_ctx: int, prompts: list[str], *args: str,
               server: str = "") -> tuple[dict, list[dict], str, list[dict]]:
    """``claude -p`` with ``args``, a session for each of ``prompts``, against the gateway serving
    ``tmp_path/agent.gguf`` in a context of ``n_ctx``, in ``tmp_path/work``: the last JSON result,
    the inference event of each request, the gateway's metrics, and the requests to
    ``/v1/messages`` as the proxy saw them (``LoggingProxy.records``), each checked to be in the
    events with the status it had. ``server``: more settings."""
    events = tmp_path / "events.jsonl"
    cfg = tmp_path / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  events_path: {events}\n{server}models:\n"
                   f"  agent:\n    path: {tmp_path}/agent.gguf\n    n_ctx: {n_ctx}\n    parallel: 1\n")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    with ServerProcess("--config", str(cfg), env={"HOME": str(home)}) as srv, LoggingProxy(srv.url) as proxy:
        for prompt in prompts:
            done = subprocess.run([claude(), "-p", prompt, *args, "--output-format", "json", "--model", "agent",
                                   "--max-turns", "3"], cwd=work, env=environment(proxy.url, home),
                                  capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                break
        with urllib.request.urlopen(srv.url + "/metrics", timeout=60) as r:
            metrics = r.read().decode()
        log = srv.output()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:], log[-3000:])
    inference = [json.loads(line) for line in events.read_text().splitlines()]
    sent = [r for r in proxy.records if r["path"] == "/v1/messages"]
    statuses = {e["request_id"]: e["status"] for e in inference if e["endpoint"] == "/v1/messages"}
    assert {r["request_id"]: r["status"] for r in sent} == statuses, (sent, inference)
    return json.loads(done.stdout), inference, metrics, sent


def main_turns(sent: list[dict], system: str) -> list[dict]:
    """The requests of the sessions' own turns (under ``system``, the --system-prompt), in order:
    not the others Claude Code may send beside them (a quota check, a title)."""
    return [r for r in sent if system in json.dumps(r["body"].get("system"))]


@pytest.mark.parametrize("keep", [False, True])
def test_claude_code_text_turns_and_a_new_session_reads_the_last_ones_prompt_from_the_cache(tmp_path, keep):
    """Unless ``server.keep_billing_header``: then the header, first in the prompt, differs."""
    tm.plain(tmp_path / "agent.gguf", context_length=32768)
    # two first messages: Claude Code's billing header differs with the first message
    prompts = ["What is two and two?", "List the files."]
    result, events, _, sent = run_claude(tmp_path, 65536, prompts, "--system-prompt", "You are a test agent.",
                                         "--tools", "", server=f"  keep_billing_header: {str(keep).lower()}\n")
    assert result["result"] == "Hello, world!" and not result["is_error"], result
    assert [e["status"] for e in events] == [200] * len(events)  # nothing refused
    by_id = {e["request_id"]: e for e in events}
    # each session's turn, the first time it was asked (Claude Code may ask again, or send others)
    turns = [next(r for r in main_turns(sent, "You are a test agent.") if prompt in json.dumps(r["body"]["messages"]))
             for prompt in prompts]
    first, second = (by_id[r["request_id"]] for r in turns)
    assert second["prompt_tokens"] > 500 and first["cached_tokens"] < 80  # at most a template's opening in common
    if keep:
        assert second["cached_tokens"] < 80, events  # up to where the headers differ
    else:
        assert second["cached_tokens"] >= second["prompt_tokens"] - 40, events  # all but the user's message


@pytest.mark.parametrize("n_ctx", [65536, 32768])
def test_claude_code_runs_a_bash_tool_round_trip(tmp_path, n_ctx):
    """With room for Claude Code's max_tokens (32000 for a model it does not know) nothing is
    refused. Without, each try whose max_tokens does not fit is refused in Anthropic's words for
    a context overflow (Claude Code's own regex reads the numbers), and Claude Code asks again,
    the same conversation with a max_tokens that fits (what a small local context needs), and
    gets its answer."""
    agent_model(tmp_path / "agent.gguf", FINAL, call=CALL, context_length=32768)
    result, events, metrics, sent = run_claude(tmp_path, n_ctx, ["Write the marker file."], "--system-prompt",
                                               "You are a test agent.", "--tools", "Bash", "--allowedTools", "Bash")
    assert result["result"] == "".join(FINAL) and not result["is_error"], result
    assert (tmp_path / "work" / "marker.txt").read_text().strip() == "claude-code-ran"  # the tool really ran
    turns = main_turns(sent, "You are a test agent.")
    # the tool's result went back to the model, and that turn was answered
    assert any(r["status"] == 200 and "tool_result" in json.dumps(r["body"]["messages"][-1]) for r in turns), turns
    refused = [r for r in sent if r["status"] != 200]
    for r in refused:
        assert r["status"] == 400, r
        error = json.loads(r["answer"])
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        numbers = CC_MAX_TOKENS.search(error["error"]["message"])
        assert numbers, error
        prompt, max_tokens, limit = map(int, numbers.groups())
        assert (max_tokens, limit) == (r["body"]["max_tokens"], n_ctx) and prompt + max_tokens > limit
        again = [s for s in sent[sent.index(r) + 1:] if s["body"]["messages"] == r["body"]["messages"]]
        assert again and again[0]["status"] == 200 and again[0]["body"]["max_tokens"] <= limit - prompt, again
    counted = re.search(r'rejected_requests_total\{reason="context_length_exceeded"\} (\S+)$', metrics, re.M)
    assert (float(counted.group(1)) if counted else 0) == len(refused)
    if n_ctx == 65536:
        assert not refused, refused
    else:
        assert refused, sent  # Claude Code's max_tokens does not fit 32768 with its prompt


def first_request(exe: str, tmp_path) -> dict:
    """The body of Claude Code's first request with its default prompt and tools, caught by a
    stand-in server that refuses it (Claude Code then gives up)."""
    bodies: list[dict] = []

    class Catch(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"))
            out = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "caught"}})
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out.encode())

        def log_message(self, *args):
            pass

    catcher = ThreadingHTTPServer(("127.0.0.1", 0), Catch)
    threading.Thread(target=catcher.serve_forever, daemon=True).start()
    try:
        (tmp_path / "home").mkdir()
        subprocess.run([exe, "-p", "hi", "--output-format", "json", "--max-turns", "1"], cwd=tmp_path,
                       env=environment(f"http://127.0.0.1:{catcher.server_port}", tmp_path / "home"),
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        catcher.shutdown()
        catcher.server_close()
    assert bodies, "Claude Code sent no request"
    return bodies[0]


def test_claude_codes_whole_first_request_is_read_and_its_tools_make_grammars(tmp_path):
    import llama_cpp as L

    from gateway.text.grammar import MAX_MADE_GRAMMAR_CHARS, grammar_problem
    from gateway.wire import anthropic
    from gateway.worker import toolgrammar

    body = first_request(claude(), tmp_path)
    parsed = anthropic.parse(body)
    messages = parsed.request.messages
    assert messages[0]["role"] == "system" and "x-anthropic-billing-header" not in messages[0]["content"]
    assert "x-anthropic-billing-header" in json.dumps(body["system"])  # it was sent, and left out
    if any(m.get("role") == "system" for m in body["messages"]):  # its reminders, folded into user turns
        assert [m["role"] for m in messages[1:]] == ["user"] and "<system-reminder>" in messages[1]["content"]
    tools = parsed.request.tools
    assert tools and len(tools) >= 10
    with vocab_only("qwen2") as vocab:
        for fmt in ("hermes", "qwen3_coder", "llama3", "mistral", "harmony", "deepseek"):
            grammar = toolgrammar.build(fmt, json.loads(json.dumps(tools)), required=True)
            assert grammar_problem(grammar.gbnf, MAX_MADE_GRAMMAR_CHARS) is None, fmt
            sampler = L.llama_sampler_init_grammar(vocab, grammar.gbnf.encode(), b"root")
            assert sampler, fmt  # llama.cpp's parser took it
            L.llama_sampler_free(sampler)
