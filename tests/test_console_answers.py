"""``gguf-gateway status`` and ``chat`` (gateway/cli/console.py) against a server that is not a
gguf-gateway, or a hostile one: a tiny loopback HTTP server answers each path as it is told.
JSON nested far deeper than Python's recursion limit, JSON of another shape and an error body of
either are each one line on stderr and exit code 1 (``client.BadAnswer``), never a traceback;
an error the gateway answered inside a chat's stream ends that turn only, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import run_cli

from gateway import cli

DEEP = b"[" * 100_000 + b"]" * 100_000  # valid JSON; Python's json.loads raises RecursionError on it


class Answers(ThreadingHTTPServer):
    """path -> (status, content type, body), for GET and POST alike."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers: dict[str, tuple[int, str, bytes]] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Answers

    def answer(self) -> None:
        if length := int(self.headers.get("Content-Length") or 0):
            self.rfile.read(length)
        status, kind, body = self.server.answers.get(self.path, (404, "text/plain", b"no"))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def server(tmp_path, monkeypatch) -> Iterator[Answers]:
    monkeypatch.setenv("HOME", str(tmp_path))  # no user config: the address is --url's
    for name in ("GGUF_GATEWAY_CONFIG", "GGUF_GATEWAY_URL", "GGUF_GATEWAY_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    srv = Answers()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


JSON = "application/json"
HEALTH = (200, JSON, b'{"version": "1", "status": "ok"}')


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("answers, words", [
    ({"/health": (200, JSON, DEEP)}, "`/health` is nested more than 100 levels deep"),
    ({"/health": HEALTH, "/models": (200, JSON, DEEP)}, "`/models` is nested more than 100 levels deep"),
    ({"/health": (200, "text/html", b"<html>a router's page</html>")}, "`/health` is not valid JSON"),
    ({"/health": (200, JSON, b'{"status": "ok"}'), "/models": (200, JSON, b'{"data": []}')},
     "in a shape this client does not read"),
    ({"/health": HEALTH, "/models": (200, JSON, b'{"data": [1, 2]}')}, "in a shape this client does not read"),
    ({"/health": (500, JSON, DEEP)}, "500: Internal Server Error"),
    ({"/health": (401, JSON, b'{"error": "no \\u001b[2J"}')}, '401: {\'error\': \'no \\x1b[2J\'}'),
])
def test_status_reads_a_bad_answer_as_one_line_and_exit_code_1(server, capsys, answers, words):
    server.answers = answers
    code, out, err = run(capsys, "status", "--url", server.url)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    assert "\x1b" not in err


def chunk(text: str) -> bytes:
    return b'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n' % text.encode()


@pytest.mark.parametrize("stream, words", [
    (chunk("hi") + b"data: " + DEEP + b"\n\n", "`/v1/chat/completions` is nested more than 100 levels deep"),
    (b"data: [1]\n\n", "streamed an event that is not a JSON object"),
    (b'data: {"choices": [7]}\n\n', "streamed a chunk that is not a chat completion's"),
])
def test_chat_ends_on_a_bad_answer_with_one_line_and_exit_code_1(server, tmp_path, stream, words):
    server.answers = {"/v1/chat/completions": (200, "text/event-stream", stream)}
    r = run_cli("chat", "m", "--url", server.url, "--color", "never", env={"HOME": str(tmp_path)},
                input_text="hello\nagain\n")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_an_error_the_gateway_streams_ends_one_turn_of_the_chat(server, tmp_path):
    server.answers = {"/v1/chat/completions": (200, "text/event-stream", chunk("so") + (
        b'data: {"error": {"message": "the model \\u001b[31mfailed"}}\n\n'))}
    r = run_cli("chat", "m", "--url", server.url, "--color", "never", env={"HOME": str(tmp_path)},
                input_text="hello\nagain\n")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.count("error: the model \\x1b[31mfailed") == 2  # each turn, escaped


def test_the_installed_command_prints_no_traceback(server, tmp_path):
    server.answers = {"/health": (200, JSON, DEEP)}
    r = run_cli("status", "--url", server.url, env={"HOME": str(tmp_path)})
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr == (f"error: {server.url} did not answer with JSON this client reads: `/health` is nested "
                        "more than 100 levels deep; is this a gguf-gateway?\n")
