"""``gguf-gateway launch CLIENT [--model NAME] [--print] [-- CLIENT ARGS]``: a coding agent
(Claude Code, Codex, opencode, Continue's CLI, aider) run against the running gateway, set up
for that process only.

It finds the gateway as ``pull`` does (``Gateway.running``), asks it what models it has
(``/models``: which are loaded; ``/props``: each one's context; ``/api/show``: whether its
format carries tool calls), picks one and says why on stderr (``agents.pick``), then runs the
agent with ``agents.settings`` and the person's own arguments after ``--``, with its terminal,
and exits with the agent's exit code. Ctrl-C reaches the agent (it is in the same process
group) and this process waits for it to end. ``--print`` writes the settings instead: shell
``export`` lines and the command line, for a shell profile or a client it does not run.

The key: ``--api-key``, else ``$GGUF_GATEWAY_KEY``, else as ``Gateway.from_args`` finds one
(``$GGUF_GATEWAY_API_KEY``, the configuration's first key); where the gateway answers 401 to
none, it is asked for on a terminal (never echoed), else it is a one-line error. The key goes
into the agent's environment only, never into a file.

Every failure is one line on stderr: an unknown client (exit 2, argparse's), no gateway, a key
refused, no model with tool calls, a context too small for the agent (``--force`` goes on), the
agent not installed (with how to install it)."""

from __future__ import annotations

import argparse
import getpass
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from ..backends.untrusted import shown
from ..models.config import Config
from ..models.config.specs import default_state_dir
from .agents import CLIENTS, KEY, KEY_VAR, LaunchError, Model, Settings, Value, check_context, pick, settings
from .client import BadAnswer, Gateway, Refused, Unreachable
from .configfile import config_arg, config_if_any

MAX_MODELS = 256  # models asked about, at most: each costs two requests
MAX_ANSWER = 8 << 20  # bytes read of any one answer (a listing of MAX_MODELS models is far less)
SURVEY_TIME = 60.0  # seconds: the longest the gateway may take to describe its models, all together
MAX_CONTEXT = 1 << 30  # tokens: a bigger n_ctx is no model's (and no agent's setting reads it): not known


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", usage="gguf-gateway launch CLIENT [options] [-- CLIENT ARGS]",
                       help="run a coding agent (claude, codex, opencode, continue, aider) against "
                       "the running gateway, set up for that run only",
                       description="Run a coding agent against the running gateway; arguments after -- go to "
                       "the agent (e.g. -- -p 'fix the test').")
    p.add_argument("client", metavar="CLIENT", help=", ".join(CLIENTS))
    p.add_argument("--model", help="the model to use (default: server.agent_model, else the loaded model with "
                   "tool calls and the biggest context)")
    p.add_argument("--print", action="store_true", dest="print_only",
                   help="print the settings (export lines, the command line) instead of running the agent")
    p.add_argument("--force", action="store_true", help="run even where the model's context is smaller than "
                   "the agent's prompt needs")
    config_arg(p)
    p.add_argument("--url", help="the gateway (default: $GGUF_GATEWAY_URL, else the configured address)")
    p.add_argument("--api-key", help=f"default: ${KEY_VAR}, else $GGUF_GATEWAY_API_KEY, else the config's first key "
                   "(sent to a named --url only with --config)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return launch(args, config_if_any(args))
    except LaunchError as e:
        print(f"error: {shown(str(e), 1000)}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:  # Ctrl-C before the agent runs: at the key's prompt, at a slow gateway
        print("stopped", file=sys.stderr)
        return 130


def launch(args: argparse.Namespace, config: Config | None, out: TextIO | None = None) -> int:
    client = CLIENTS.get(args.client)
    if client is None:
        raise LaunchError(f"unknown client {args.client!r}: launch knows {', '.join(CLIENTS)}", code=2)
    extra = list(getattr(args, "passed_on", []))
    gw = Gateway.running(args, config)
    if gw is None:
        where = Gateway.from_args(args, config).url
        raise LaunchError(f"no gguf-gateway answers at {where}: start one (gguf-gateway serve), or name it "
                          "with --url or $GGUF_GATEWAY_URL")
    gw.api_key = args.api_key or os.environ.get(KEY_VAR) or gw.api_key
    rows = _rows(gw)
    keyed = gw.api_key is not None and _needs_key(gw)
    default = config.server.agent_model if config is not None else None
    models = _survey(gw, rows, args.model or default)
    model, why = pick(models, args.model, default)
    if not args.force:
        check_context(client, model)
    setup = settings(client, gw.url, model, keyed)
    folder = (config.server.state_dir if config is not None and config.server.state_dir else default_state_dir())
    folder = folder / "launch"
    if args.print_only:
        _write_files(setup, folder)
        print(f"{client.title} on {shown(model.name, 200)}: {why}", file=sys.stderr)
        (out or sys.stdout).write(printed(client.program, setup, folder, extra, keyed))
        return 0
    program = shutil.which(client.program)
    if program is None:
        raise LaunchError(f"{client.title} is not installed (no `{client.program}` on PATH): {client.install}")
    _write_files(setup, folder)
    print(f"{client.title} on {shown(model.name, 200)}: {why}", file=sys.stderr)
    key = gw.api_key or ""
    env = {**os.environ, **{k: key if v is KEY else str(v) for k, v in setup.env.items()}}
    return _run([program, *_args(setup, folder), *extra], env)


def _rows(gw: Gateway) -> list[dict[str, Any]]:
    """The gateway's text models, as ``/models`` lists them; the key asked for where it wants one."""
    try:
        answer = gw.get("/models", MAX_ANSWER)
    except Refused as e:
        if e.status != 401:
            raise LaunchError(f"the gateway at {gw.url} answered {e}") from None
        if gw.api_key is not None:
            raise LaunchError(f"the gateway at {gw.url} refused the key ({e}): "
                              f"set ${KEY_VAR} to one of its keys") from None
        if not sys.stdin.isatty():
            raise LaunchError(f"the gateway at {gw.url} needs an API key: set ${KEY_VAR} (or pass --api-key)") from None
        gw.api_key = getpass.getpass(f"API key for {gw.url}: ").strip() or None
        if gw.api_key is None:
            raise LaunchError(f"the gateway at {gw.url} needs an API key: set ${KEY_VAR} (or pass --api-key)") from None
        return _rows(gw)
    except (Unreachable, BadAnswer) as e:
        raise LaunchError(str(e)) from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise LaunchError(f"{gw.url}/models did not list models: is this a gguf-gateway?")
    return [r for r in data if isinstance(r, dict) and isinstance(r.get("id"), str) and r.get("kind") == "chat"]


def _survey(gw: Gateway, rows: list[dict[str, Any]], wanted: str | None) -> list[Model]:
    """The facts of the models listed (only the one ``wanted`` where one is named), within
    ``SURVEY_TIME`` in all: a gateway that answers each question slowly ends the command."""
    if wanted:
        rows = [r for r in rows if r["id"] == wanted][:1]  # none: pick says it is not there
    deadline = time.monotonic() + SURVEY_TIME
    models = []
    for row in rows[:MAX_MODELS]:
        if time.monotonic() > deadline:
            raise LaunchError(f"the gateway at {gw.url} took over {SURVEY_TIME:g} s to describe its models: "
                              "name one with --model")
        models.append(_model(gw, row))
    return models


def _needs_key(gw: Gateway) -> bool:
    """Whether the gateway refuses a request without a key (the agent then needs ours)."""
    try:
        Gateway(gw.url, None).get("/v1/models", MAX_ANSWER)
    except Refused as e:
        return e.status == 401
    except (Unreachable, BadAnswer):
        return True
    return False


def _model(gw: Gateway, row: dict[str, Any]) -> Model:
    """One model's facts: its context (``/props``: a loaded model's, else the one it will load
    with; 0, an upstream's, is not known) and whether its format carries tool calls
    (``/api/show``'s ``tools`` capability). What the gateway does not answer counts as not known."""
    name = row["id"]
    n_ctx = None
    try:
        props = gw.get(f"/props?model={quote(name, safe='')}", MAX_ANSWER)
        value = props.get("default_generation_settings", {}).get("n_ctx") if isinstance(props, dict) else None
        n_ctx = value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONTEXT else None
    except (Refused, BadAnswer, Unreachable, AttributeError):
        pass
    try:
        shown_ = gw.post("/api/show", {"model": name}, MAX_ANSWER)
        capabilities = shown_.get("capabilities") if isinstance(shown_, dict) else None
        tools = isinstance(capabilities, list) and "tools" in capabilities
    except (Refused, BadAnswer, Unreachable):
        tools = False
    return Model(name, tools, n_ctx, row.get("state") == "ready")


def _write_files(setup: Settings, folder: Path) -> None:
    """``setup.files`` written into ``folder`` (made, only its owner's, where it is not there).
    The agent reads what is there when it starts, so the folder must be one nobody else can
    change: a folder of this user's, not a link, that others cannot write into; else a
    ``LaunchError``. Each file is written beside its place and renamed over it, so a link left
    at its name is replaced, never written through."""
    if not setup.files:
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode):
            raise LaunchError(f"{folder} is not a folder (a link?): remove it, and launch makes its own")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise LaunchError(f"{folder} belongs to another user: remove it, and launch makes its own")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise LaunchError(f"others can write into {folder}: chmod go-w it (or remove it)")
        for name, text in setup.files.items():
            fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text.replace("{dir}", str(folder)))
                os.replace(temporary, folder / name)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
    except OSError as e:
        raise LaunchError(f"cannot write the agent's settings into {folder}: {e.strerror or e}") from None


def _args(setup: Settings, folder: Path) -> list[str]:
    return [a.replace("{dir}", str(folder)) for a in setup.args]


def printed(program: str, setup: Settings, folder: Path, extra: list[str], keyed: bool) -> str:
    """``--print``'s text: ``export`` lines, shell-quoted (the key as
    ``"$GGUF_GATEWAY_KEY"``, never its value), then the command line, then as comments
    ``setup.note`` and the text of each file of ours the command names (a config block to copy
    into a client ``launch`` does not run)."""
    lines = ["# the agent's settings, from gguf-gateway launch"]
    if keyed:
        lines.append(f"# ${KEY_VAR} must hold your key for the gateway")
    lines += [f"export {name}={_quoted(value)}" for name, value in setup.env.items() if name != KEY_VAR]
    lines.append(shlex.join([program, *_args(setup, folder), *extra]))
    notes = [setup.note] if setup.note else []
    notes += [f"{folder / name} (written by launch) holds:\n{text.replace('{dir}', str(folder))}"
              for name, text in setup.files.items()]
    for note in notes:
        lines += ["", *("# " + line if line else "#" for line in note.rstrip("\n").split("\n"))]
    return "\n".join(lines) + "\n"


def _quoted(value: Value) -> str:
    return f'"${KEY_VAR}"' if value is KEY else shlex.quote(str(value))


def _run(command: list[str], env: dict[str, str]) -> int:
    """The agent, with this terminal: its exit code (128 + N where signal N ended it). Ctrl-C
    goes to the whole foreground process group; this process ignores it while the agent runs."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            child = subprocess.Popen(command, env=env, preexec_fn=_default_sigint)
        except OSError as e:
            raise LaunchError(f"cannot run {command[0]}: {e.strerror or e}") from None
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    return 128 - code if code < 0 else code


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the agent gets Ctrl-C as it would from its shell
