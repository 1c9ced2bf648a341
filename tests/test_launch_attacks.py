"""``gguf-gateway launch`` against an impostor: a real aiohttp server on loopback that answers
what a hostile gateway could (model names an agent's configuration would read as a
substitution, escape codes, shell metacharacters, contexts of 400 digits, redirects to another
host, answers cut off, bodies without end), and a state folder another user prepared. Each is
driven through ``gateway.cli.main`` as a person would run it: a one-line error and a non-zero
exit, or settings that carry the name as it is and nothing more; never a traceback, never the
key elsewhere than the gateway named."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
import tomllib
from aiohttp import web
from helpers import gateway_command

from gateway import cli
from gateway.cli import client
from gateway.cli import launch as launch_module
from gateway.cli.agents import KEY_VAR

KEY = "sk-launch-secret"


class Impostor:
    """A server that looks like a gguf-gateway: ``/health``, ``/models`` listing ``names``,
    ``/props`` with ``n_ctx``, ``/api/show`` with tool calls, ``/v1/models`` that wants
    ``KEY`` when ``keyed``. ``routes`` replaces the handler of a path. ``seen``: each request's
    path and Authorization header."""

    def __init__(self, names=("coder",), n_ctx=65536, keyed=False, routes=None):
        self.names, self.n_ctx, self.keyed = list(names), n_ctx, keyed
        self.routes = routes or {}
        self.seen: list[tuple[str, str | None]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, request.headers.get("Authorization")))
        if request.path in self.routes:
            return await self.routes[request.path](request)
        if request.path == "/health":
            return web.json_response({"version": "impostor"})
        if self.keyed and request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": {"message": "no key"}}, status=401)
        if request.path == "/models":
            return web.json_response({"data": [{"id": n, "kind": "chat", "state": "ready"} for n in self.names]})
        if request.path == "/props":
            return web.Response(text=f'{{"default_generation_settings": {{"n_ctx": {self.n_ctx}}}}}',
                                content_type="application/json")
        if request.path == "/api/show":
            return web.json_response({"capabilities": ["completion", "tools"]})
        return web.json_response({"data": []})

    def __enter__(self) -> Impostor:
        self.thread.start()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)

        async def start() -> int:
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        self.url = f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def state(tmp_path, monkeypatch):
    """No configuration found, the key in ``$GGUF_GATEWAY_KEY``, the state folder in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for var in ("GGUF_GATEWAY_URL", "GGUF_GATEWAY_API_KEY", "GGUF_GATEWAY_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_VAR, KEY)
    return tmp_path


def launch(capsys, url: str, *args: str) -> tuple[int, str, str]:
    code = cli.main(["launch", *args, "--url", url, "--print"])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, err: str) -> str:
    assert code != 0 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


# what an agent reads in its own configuration as a substitution: opencode's {env:X} and
# {file:PATH} (the file's text inlined: the model name, sent to the gateway with each request,
# would carry the person's private key), Continue's ${{ secrets.X }}
SUBSTITUTED = ["{file:~/.ssh/id_ed25519}", "{env:AWS_SECRET_ACCESS_KEY}", "m ${{ secrets.OPENAI_API_KEY }}",
               "${HOME}"]
UNPRINTABLE = ["m\x1b]52;c;dG91Y2ggL3RtcC9wd25lZA==\x07", "m\nexport X=1", "m\u202eevil", "x" * 5000, "../../etc"]


@pytest.mark.parametrize("name", SUBSTITUTED + UNPRINTABLE)
@pytest.mark.parametrize("client_", ["opencode", "continue"])
def test_a_name_an_agent_would_read_as_more_than_a_name_is_not_passed_on(state, capsys, name, client_):
    with Impostor([name]) as gw:
        code, out, err = launch(capsys, gw.url, client_)
        assert "model on the gateway" in one_line(code, err) and out == ""
        code, out, err = launch(capsys, gw.url, client_, "--model", name)
        assert "cannot be passed to an agent" in one_line(code, err) and "\x1b" not in err and out == ""
    assert not (state / "state").exists() or not any((state / "state").rglob("*.yaml"))


def test_such_a_name_beside_a_good_one_is_passed_over(state, capsys):
    with Impostor(["{file:~/.ssh/id_ed25519}", "coder"]) as gw:
        code, out, err = launch(capsys, gw.url, "opencode")
    assert code == 0 and err.startswith("opencode on coder:")
    assert "{file:" not in out


SHELLISH = ["it's", 'a"b', "a`touch pwned1`b", "a;touch pwned2;#", "a|touch pwned3", "a'&&touch pwned4&&'",
            "m -- --dangerously-skip-permissions", "org/m:q4@v1+x", "мodel-😀"]


@pytest.mark.parametrize("client_", ["claude", "codex", "aider", "opencode", "continue"])
def test_print_pasted_into_a_shell_runs_nothing_the_gateway_named(state, capsys, client_):
    """Each name printed as a value, shell-quoted: the text run by bash (with the agent a
    function that records its arguments) creates no file, and each argument is the name."""
    for name in SHELLISH:
        with Impostor([name]) as gw:
            code, out, err = launch(capsys, gw.url, client_)
        assert code == 0, err
        program = {"continue": "cn"}.get(client_, client_)
        script = f'{program}() {{ printf "%s\\n" "$@" > args; env > env_seen; }}\n{out}'
        subprocess.run(["bash", "-c", script], cwd=state, check=True, env={"PATH": os.environ["PATH"]})
        assert not list(state.glob("pwned*")), (client_, name)
        seen = (state / "args").read_text().splitlines() + (state / "env_seen").read_text().splitlines()
        if client_ in ("claude", "aider"):
            assert any(name in line for line in seen), (name, seen)
        if client_ == "codex":
            model = next(line for line in seen if line.startswith("model="))
            assert tomllib.loads(f"v = {model[6:]}")["v"] == name


def test_codex_overrides_hold_the_name_as_one_toml_string(state, capsys):
    for name in ['a", base_url="http://evil', 'a"\n', "мodel-😀", 'a\\"b']:
        with Impostor([name]) as gw:
            code, out, err = launch(capsys, gw.url, "codex")
        if code:
            one_line(code, err)
            continue
        command = next(line for line in out.splitlines() if line.startswith("codex "))
        import shlex
        words = shlex.split(command)[1:]
        overrides = dict(w.split("=", 1) for w in words[1::2])
        assert words[::2] == ["-c"] * len(overrides)
        values = {k: tomllib.loads(f"v = {v}")["v"] for k, v in overrides.items()}
        assert values["model"] == name and values["model_providers.gguf-gateway.base_url"] == gw.url + "/v1"


@pytest.mark.parametrize("n_ctx", ["1" + "0" * 400, "9223372036854775808", "-5", "1.5e9", '"65536"', "true", "null"])
def test_a_context_no_model_has_is_not_known(state, capsys, n_ctx):
    with Impostor(n_ctx=n_ctx) as gw:
        code, out, err = launch(capsys, gw.url, "codex")
    assert code == 0, err
    assert "model_context_window" not in out and "not known" in err


def test_thousands_of_models_are_asked_about_within_a_bound(state, capsys):
    with Impostor([f"m{i:05}" for i in range(20000)]) as gw:
        code, out, err = launch(capsys, gw.url, "aider")
        asked = sum(1 for path, _ in gw.seen if path == "/props")
    assert code == 0 and asked <= 256


def test_a_redirect_does_not_take_the_key_to_another_host(state, capsys):
    with Impostor() as sink:
        async def away(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(sink.url + "/models")

        with Impostor(routes={"/models": away, "/props": away}) as gw:
            code, out, err = launch(capsys, gw.url, "claude")
        assert not any(auth for _, auth in sink.seen), sink.seen
    assert "redirect" in one_line(code, err)


async def cut_off(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Length": "1000", "Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"data": [')
    request.transport.close()  # type: ignore[union-attr]
    return response


WRITTEN: dict[str, int] = {}  # bytes each endless answer wrote before the client went away


async def endless(request: web.Request, status: int = 200) -> web.StreamResponse:
    response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"error": {"message": "')
    key = f"{request.path} {status}"
    WRITTEN[key] = 0
    for _ in range(40000):  # 400 MB, if read whole
        await response.write(b"x" * 10000)
        WRITTEN[key] += 10000
    return response


async def drip(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    for _ in range(40):  # 20 s, a byte each half second: never a wait past TIMEOUT
        await response.write(b" ")
        await asyncio.sleep(0.5)
    return response


async def stalled(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"data": [')
    await asyncio.sleep(3)  # past the client's TIMEOUT, as the test sets it
    return response


async def not_json(request: web.Request) -> web.StreamResponse:
    return web.Response(text="<html>hello</html>", content_type="text/html")


async def failing(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": {"message": "boom \x1b[31m"}}, status=500)


async def echoing_401(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": {"message": f"bad key {request.headers.get('Authorization')}"}}, status=401)


async def unauthorized_without_end(request: web.Request) -> web.StreamResponse:
    return await endless(request, 401)


@pytest.mark.parametrize("handler", [cut_off, endless, stalled, drip, not_json, failing, unauthorized_without_end])
@pytest.mark.parametrize("path", ["/models", "/props", "/api/show"])
def test_a_broken_answer_is_one_line_or_counts_as_not_known(state, capsys, monkeypatch, handler, path):
    """Within the client's bounds (made short here): each wait, the whole answer's time, its
    bytes (an error's too: the 401 without end is left after a few mebibytes, not read whole)."""
    monkeypatch.setattr(client, "TIMEOUT", 1.0)
    monkeypatch.setattr(client, "DEADLINE", 2.0)
    started = time.monotonic()
    with Impostor(routes={path: handler}) as gw:
        code, out, err = launch(capsys, gw.url, "aider")
        took = time.monotonic() - started
    assert took < 10 and WRITTEN.get(f"{path} 401", 0) < 100 << 20
    if path == "/models":
        one_line(code, err)
    else:  # a fact not known: this model is passed over (no tool calls) or its context not known
        assert "Traceback" not in err and (code == 0 or err.count("\n") == 1), err


def test_a_gateway_slow_on_each_model_ends_the_command_in_bounded_time(state, capsys, monkeypatch):
    """Each answer within the client's bounds, but many of them: the survey as a whole is
    bounded; naming the model asks about that one alone."""
    monkeypatch.setattr(client, "TIMEOUT", 1.0)
    monkeypatch.setattr(client, "DEADLINE", 1.0)
    monkeypatch.setattr(launch_module, "SURVEY_TIME", 2.0)
    started = time.monotonic()
    with Impostor([f"m{i}" for i in range(50)], routes={"/props": drip}) as gw:
        code, out, err = launch(capsys, gw.url, "aider")
        assert "took over 2 s to describe its models" in one_line(code, err) and time.monotonic() - started < 15
        code, out, err = launch(capsys, gw.url, "aider", "--model", "m7")
        assert code == 0 and err.startswith("aider on m7: named with --model"), err
        assert sum(1 for path, _ in gw.seen if path == "/api/show") < 10


def test_a_refusal_that_echoes_the_key_does_not_print_it(state, capsys):
    with Impostor(routes={"/models": echoing_401}) as gw:
        code, out, err = launch(capsys, gw.url, "claude")
    assert KEY not in one_line(code, err)


def test_the_files_of_launch_are_not_written_through_a_link_another_user_left(state, capsys):
    folder = state / "state" / "gguf-gateway" / "launch"
    folder.mkdir(parents=True)
    victim = state / "victim"
    victim.write_text("mine\n")
    (folder / "coder.continue.yaml").symlink_to(victim)
    with Impostor() as gw:
        code, out, err = launch(capsys, gw.url, "continue")
    assert code == 0, err
    assert victim.read_text() == "mine\n"
    assert not (folder / "coder.continue.yaml").is_symlink()


def test_a_launch_folder_others_may_write_is_refused(state, capsys):
    folder = state / "state" / "gguf-gateway" / "launch"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    with Impostor() as gw:
        code, out, err = launch(capsys, gw.url, "continue")
    assert "others can write" in one_line(code, err)


def test_the_launch_folder_itself_a_link_is_refused(state, capsys):
    elsewhere = state / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (state / "state" / "gguf-gateway").mkdir(parents=True)
    (state / "state" / "gguf-gateway" / "launch").symlink_to(elsewhere)
    with Impostor() as gw:
        code, out, err = launch(capsys, gw.url, "aider")
    one_line(code, err)
    assert not list(elsewhere.iterdir())


def test_no_file_of_launch_holds_the_key(state, capsys):
    with Impostor(keyed=True) as gw:
        for client_ in ("continue", "aider", "opencode", "codex", "claude"):
            code, out, err = launch(capsys, gw.url, client_)
            assert code == 0 and KEY not in out, err
    for path in (state / "state").rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text()
    assert json.dumps(KEY) not in out
    assert stat.S_IMODE((state / "state" / "gguf-gateway" / "launch").stat().st_mode) == 0o700
    assert all(auth in (None, f"Bearer {KEY}") for _, auth in gw.seen)


def test_default_state_folder_is_used(state):
    from gateway.models.config.specs import default_state_dir
    assert Path(default_state_dir()).is_relative_to(state)


def test_a_configuration_found_by_itself_does_not_give_its_key_to_a_named_host(state, capsys, monkeypatch):
    """This machine's configuration (found, not named) holds its own gateway's keys: they go to
    no host ``--url`` names. Named with ``--config`` beside ``--url``, the person ties them."""
    config = state / "models.yaml"
    config.write_text("server:\n  api_keys: [sk-this-machine]\n")
    monkeypatch.setenv("GGUF_GATEWAY_CONFIG", str(config))
    monkeypatch.delenv(KEY_VAR)
    with Impostor(keyed=True) as gw:
        code, out, err = launch(capsys, gw.url, "claude")
        assert "needs an API key" in one_line(code, err)
        assert not any(auth and "sk-this-machine" in auth for _, auth in gw.seen), gw.seen
        code, out, err = launch(capsys, gw.url, "claude", "--config", str(config))
        assert code == 1 and any(auth == "Bearer sk-this-machine" for _, auth in gw.seen)



ODD = {
    "surrogate": b'{"data": [{"id": "m\\ud800", "kind": "chat", "state": "ready"}, '
                 b'{"id": "coder", "kind": "chat", "state": "ready"}]}',
    "latin1": b'{"data": [{"id": "m\xe9", "kind": "chat"}]}',
    "deep": b'{"data": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    "types": b'{"data": [{"id": 5, "kind": "chat"}, {"id": ["x"]}, "coder", null, {"id": "coder", "kind": "chat"}]}',
}


@pytest.mark.parametrize("body", sorted(ODD))
def test_an_odd_listing_is_one_line_or_its_odd_entries_passed_over(state, capsys, body):
    """Text that is not Unicode, JSON nested deeper than a parser's stack, entries of the wrong
    types: one line, or the odd entries passed over."""
    async def listing(request: web.Request) -> web.StreamResponse:
        return web.Response(body=ODD[body], content_type="application/json")

    with Impostor(routes={"/models": listing}) as gw:
        code, out, err = launch(capsys, gw.url, "aider")
    if body == "types":
        assert code == 0 and err.startswith("aider on coder:"), err
    else:
        one_line(code, err)


def test_ctrl_c_at_a_gateway_that_drips_its_headers_is_no_traceback(state):
    """Headers a byte at a time: each wait is short, and http.client bounds no header's time as
    a whole, so the person presses Ctrl-C; launch ends with 130 and one line."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nX-A: ")
            for _ in range(120):
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(0.25)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> tuple[int | None, bytes]:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            *gateway_command(), "launch", "aider", "--print", "--url", f"http://127.0.0.1:{port}",
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        await asyncio.sleep(3)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        server.close()
        await asyncio.sleep(0.5)  # the handler sees the connection gone, and closes its side
        await server.wait_closed()
        return proc.returncode, err

    code, err = asyncio.run(main())
    assert code == 130 and err.decode() == "stopped\n", err
