"""Text another server chose (gateway/untrusted.py): which model names are refused, how text is
shown, and `gguf-gateway status` / `chat` never writing a raw escape code to the terminal."""

import io

import pytest

from gateway.backends.untrusted import MAX_NAME, name_problem, shown
from gateway.cli import client, console

DANGER = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u200f", "\u2028", "\r")


@pytest.mark.parametrize("name", ["llama3", "qwen3:8b", "meta-llama/Llama-3.1-8B-Instruct", "x" * MAX_NAME,
                                  "модель", "模型 v2", "a.b..c"])
def test_ordinary_names_are_names(name):
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["", None, 7, "x" * (MAX_NAME + 1), "\x1b[31mred", "tab\there", "new\nline",
                                  "bidi\u202eevil", "iso\u2066late", "zero\u200bwidth", "lone\ud800", "nb\u00a0sp",
                                  "../etc", "a/../b", "a/./b", "/abs", "trailing/", "a//b", "back\\slash", ".", ".."])
def test_names_that_could_act_or_travel_are_refused(name):
    assert name_problem(name) is not None


def test_shown_escapes_what_a_terminal_would_act_on():
    assert shown("plain text: ok") == "plain text: ok"
    assert shown("\x1b[2J\u202egood") == "\\x1b[2J\\u202egood"
    assert shown("x" * 10, 4) == "xxxx…"
    assert shown("\U000e0001tag") == "\\U000e0001tag"
    prose = shown("line one\n\tline two \x1b[31m\u202e 👩\u200d💻 日本", prose=True)
    assert prose == "line one\n\tline two \\x1b[31m\\u202e 👩\u200d💻 日本"  # newlines, tabs and a ZWJ emoji stay


class _Fake(client.Gateway):
    def __init__(self, answers):
        super().__init__("http://127.0.0.1:1", None)
        self.answers = answers

    def get(self, path):
        return self.answers[path]

    def stream_chat(self, body):
        yield {"choices": [{"delta": {"reasoning_content": "think\x1b]0;title\x07"}}]}
        yield {"choices": [{"delta": {"content": "answer\x1b[2J\u202e\nnext line"}}]}


def test_status_never_prints_a_server_provided_escape():
    evil = "\x1b[31mred\x1b[0m\u202e"
    out = io.StringIO()
    console.status(_Fake({"/health": {"version": "1" + evil, "status": "ok" + evil}, "/models": {"data": [{
        "id": "box/" + evil, "state": "ready", "in_flight": 0, "pid": None, "memory_bytes": None,
        "source": "upstream" + evil, "error": None, "upstream": {"url": "http://box/v1", "state": "down",
                                                                  "error": "HTTP 502: " + evil}}]}}), out)
    text = out.getvalue()
    assert not any(c in text for c in DANGER), text
    assert "box/\\x1b[31mred" in text and "HTTP 502: \\x1b[31m" in text


def test_chat_never_prints_a_server_provided_escape():
    out = io.StringIO()
    console.chat(_Fake({}), "m", None, color=False, inp=io.StringIO("hi\n"), out=out)
    text = out.getvalue()
    assert not any(c in text for c in DANGER), text
    assert "answer\\x1b[2J\\u202e\nnext line" in text
