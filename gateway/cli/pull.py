"""``gguf-gateway pull NAME`` and ``gguf-gateway rm NAME``.

Both work against a running gateway (``--url``, ``$GGUF_GATEWAY_URL``, or the configured
address when a gateway answers there), so a pull joins the gateway's own download of that name
and the gateway sees the model the moment it is in place; with none running they do the same
work in this process (``hub/``), into the same stores. Two processes pulling one file wait for
each other on the store's lock file, and the second finds the file in place.

Progress: on a terminal, one bar per file, redrawn in place, with bytes, speed and time left;
elsewhere (a log, a pipe) a plain line per step. Ctrl-C stops a pull this process runs (its
partial files stay: the next pull resumes) and leaves a gateway's pull running.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.error
from typing import Any, TextIO

from ..api.pulls import Narration
from ..backends.untrusted import shown
from ..hub import pulls as hub
from ..hub import transfer
from ..hub.removal import remove
from ..models.catalog import ModelCatalog
from ..models.config import Config, ServerConfig
from .client import BadAnswer, Gateway, Unreachable
from .configfile import config_arg, config_if_any

BAR = 24  # characters of a progress bar


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class View:
    """Progress lines (Ollama's shape, with the gateway's ``bytes_per_second`` and
    ``eta_seconds``) drawn for a person."""

    def __init__(self, out: TextIO, tty: bool):
        self.out, self.tty = out, tty
        self.status: str | None = None
        self.open_bar = False

    def line(self, line: dict[str, Any]) -> str | None:
        """Draw one line; the error it carries, if any."""
        if "error" in line:
            self._end_bar()
            return str(line["error"])
        status = str(line.get("status", ""))
        if "digest" in line and isinstance(line.get("total"), int):
            self._bar(status, line)
        elif status != self.status:
            self._end_bar()
            self.out.write(shown(status) + "\n")
        self.status = status
        self.out.flush()
        return None

    def _bar(self, status: str, line: dict[str, Any]) -> None:
        total, done = max(int(line["total"]), 0), max(int(line.get("completed") or 0), 0)
        share = done / total if total else 1.0
        rate = line.get("bytes_per_second") or 0
        tail = f"{_size(done)}/{_size(total)}" + (f"  {_size(rate)}/s" if rate else "") + (
            f"  {_eta(line.get('eta_seconds'))}" if line.get("eta_seconds") else "")
        if self.tty:
            if status != self.status:
                self._end_bar()
            filled = int(share * BAR)
            self.out.write(f"\r{shown(status)} {share:4.0%} ▕{'█' * filled}{' ' * (BAR - filled)}▏ {tail}\x1b[K")
            self.open_bar = True
        elif status != self.status:
            self.out.write(f"{shown(status)} ({_size(total)})\n")

    def _end_bar(self) -> None:
        if self.open_bar:
            self.out.write("\n")
            self.open_bar = False


def add_commands(sub: argparse._SubParsersAction) -> None:
    pull = sub.add_parser("pull", help="download a model by name from Hugging Face or an Ollama registry "
                          "(hf.co/ORG/REPO:QUANT, ORG/REPO, MODEL:TAG, HOST/NS/MODEL:TAG)")
    pull.add_argument("name")
    pull.add_argument("--insecure", action="store_true", help="ask a registry named by host over plain http")
    rm = sub.add_parser("rm", help="delete a pulled model (from the Hugging Face cache or Ollama's store)")
    rm.add_argument("name")
    for p in (pull, rm):
        config_arg(p)
        p.add_argument("--url", help="a running gateway to work through (default: $GGUF_GATEWAY_URL, else the "
                       "configured address when a gateway answers there, else none: this process does it)")
        p.add_argument("--api-key", help="default: $GGUF_GATEWAY_API_KEY, else the config's first key "
                   "(sent to a named --url only with --config)")
        p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return (cmd_pull if args.command == "pull" else cmd_rm)(args, config_if_any(args))


def cmd_pull(args: argparse.Namespace, config: Config | None, out: TextIO = sys.stdout) -> int:
    view = View(out, out.isatty())
    gw = Gateway.running(args, config)
    try:
        if gw is not None:
            error = _remote(gw, args, view)
        else:
            error = asyncio.run(_local(args.name, args.insecure, config.server if config else ServerConfig(), view))
    except KeyboardInterrupt:
        view._end_bar()
        print("stopped: the partial files stay, and the next pull of this name resumes"
              + (" (the gateway's pull goes on)" if gw is not None else ""), file=sys.stderr)
        return 130
    except (Unreachable, BadAnswer, RuntimeError) as e:
        view._end_bar()
        print(f"error: {shown(str(e), 500)}", file=sys.stderr)
        return 1
    if error is not None:
        print(f"error: {shown(error, 2000)}", file=sys.stderr)
        return 1
    return 0


def _remote(gw: Gateway, args: argparse.Namespace, view: View) -> str | None:
    error = None
    for line in gw.stream_lines("/models/pull", {"model": args.name, "insecure": args.insecure}):
        error = view.line(line) or error
    return error


async def _local(name: str, insecure: bool, server: ServerConfig, view: View) -> str | None:
    pulls = hub.Pulls(lambda: hub.stores_for(server))
    pull = pulls.start(name, insecure=insecure)
    told = Narration(own=True)
    try:
        async for now in pulls.watch(pull):
            for line in told.next(now):
                view.line(line)
    finally:
        await pulls.close()
    if pull.error is not None:
        return str(pull.error)
    for path in pull.paths:
        view.out.write(f"{shown(str(path))}\n")
    return None


def cmd_rm(args: argparse.Namespace, config: Config | None, out: TextIO = sys.stdout) -> int:
    gw = Gateway.running(args, config)
    try:
        if gw is not None:
            answer = gw.post("/models/delete", {"model": args.name})
            removed = answer.get("deleted", []) if isinstance(answer, dict) else []
        else:
            cfg = config or Config()
            catalog = ModelCatalog(cfg)
            spec = catalog.resolve(args.name)
            found = catalog.found.get(spec.name) if spec is not None else None
            removed = [str(p) for p in remove(args.name, found, hub.stores_for(cfg.server))]
    except (Unreachable, BadAnswer, RuntimeError, urllib.error.URLError) as e:
        print(f"error: {shown(str(e), 500)}", file=sys.stderr)
        return 1
    except transfer.PullError as e:
        print(f"error: {shown(e.message, 500)}", file=sys.stderr)
        return 1
    for path in removed:
        out.write(f"deleted {shown(str(path))}\n")
    return 0
