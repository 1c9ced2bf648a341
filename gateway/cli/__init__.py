"""``gguf-gateway`` command line: serve, check-config, models."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import faulthandler
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .models.adapternames import qualified
from .models.config import EVENT_LOOPS, Config, ConfigError, find_config_path, load_config
from .models.discovery import INFO_CACHE
from .models.ggufmeta import ModelFileError

log = logging.getLogger("gateway")


def _add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="models.yaml (default: $GGUF_GATEWAY_CONFIG, else ~/.config/gguf-gateway/models.yaml)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gguf-gateway", description="Serve local GGUF models behind one URL.")
    parser.add_argument("--version", action="version", version=f"gguf-gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the gateway")
    _add_config_arg(serve)
    serve.add_argument("--host", help="address to bind (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: server.port, 8080)")
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve on a non-loopback address without API keys (anyone who can reach it may use it)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", default="plain", choices=["plain", "json"],
                       help="plain lines (fit for journald) or one JSON object per line")
    serve.add_argument("--event-loop", choices=EVENT_LOOPS,
                       help="the HTTP server's event loop (default: server.event_loop, auto: uvloop where installed)")

    check = sub.add_parser("check-config", help="validate models.yaml and the model files it names")
    _add_config_arg(check)

    sub.add_parser("schema", help="print models.yaml's JSON Schema (docs/models.yaml.schema.json)")
    status = sub.add_parser("status", help="ask a running gateway what is loaded, in flight and failed")
    chat = sub.add_parser("chat", help="chat in the terminal with a model of a running gateway")
    chat.add_argument("model")
    chat.add_argument("--system", help="a system prompt")
    chat.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                      help="show thinking dimmed (auto: when the output is a terminal)")
    for p in (status, chat):
        _add_config_arg(p)
        p.add_argument("--url", help="the gateway (default: $GGUF_GATEWAY_URL, else host and port from the config)")
        p.add_argument("--api-key", help="default: $GGUF_GATEWAY_API_KEY, else the config's first key")

    models = sub.add_parser("models", help="list every model name that resolves, read from the GGUF headers")
    _add_config_arg(models)
    models.add_argument("--json", action="store_true", help="one JSON object per model")

    from .pullcmd import add_commands

    add_commands(sub, _add_config_arg)
    from . import keyscmd

    keyscmd.add_commands(sub, _add_config_arg)

    devs = sub.add_parser("devices", help="list the devices llama.cpp can offload to, with their memory "
                          "(the names models.yaml's devices takes)")
    devs.add_argument("--json", action="store_true", help="one JSON object per device")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "check-config":
        return cmd_check_config(args)
    if args.command in ("status", "chat"):
        return cmd_console(args)
    if args.command == "devices":
        return cmd_devices(args)
    if args.command == "schema":
        from .models.config.reference import schema_text

        sys.stdout.write(schema_text())
        return 0
    if args.command in ("pull", "rm"):
        from . import pullcmd

        config = _load(args, check_files=False) if (args.config or find_config_path(None)) else None
        return (pullcmd.cmd_pull if args.command == "pull" else pullcmd.cmd_rm)(args, config)
    if args.command in ("keys", "usage"):
        from . import keyscmd

        return keyscmd.main(args)
    return cmd_models(args)


def cmd_devices(args: argparse.Namespace) -> int:
    """What llama.cpp sees, read the way the gateway reads it (a probe process)."""
    from .hardware.devices import Inventory

    found = asyncio.run(Inventory().probe())
    if found is None:
        print("cannot list llama.cpp's devices (see the message above)", file=sys.stderr)
        return 1
    if args.json:
        for d in found:
            print(json.dumps({**d.describe(), "pool": d.pool}))
        return 0
    table = [("NAME", "KIND", "FREE", "TOTAL", "DESCRIPTION")]
    table += [(d.name, d.kind, _human(d.free), _human(d.total), d.description) for d in found]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])
    if not any(d.kind in ("gpu", "igpu") for d in found):
        print("no GPU: models run on the CPU (this llama-cpp-python was built without a GPU backend, or none "
              "is there)", file=sys.stderr)
    return 0


def cmd_console(args: argparse.Namespace) -> int:
    from . import console

    config = _load(args, check_files=False) if (args.config or find_config_path(None)) else None
    gw = console.Gateway.from_args(args, config)
    try:
        if args.command == "status":
            return console.status(gw)
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        return console.chat(gw, args.model, args.system, color)
    except console.Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _load(args: argparse.Namespace, *, check_files: bool = True) -> Config | None:
    try:
        return load_config(find_config_path(args.config), check_files=check_files)
    except ConfigError as e:
        for line in e.problems:
            print(f"error: {line}", file=sys.stderr)
        return None


def cmd_check_config(args: argparse.Namespace) -> int:
    config = _load(args)
    if config is None:
        return 1
    problems = list(config.warnings)  # missing model files
    try:
        event_loop(config.server.event_loop)
    except ConfigError as e:
        problems += [f"{config.path}: {line}" for line in e.problems]
    for spec in config.models:
        for member in spec.members:
            if member.path is None or not member.path.is_file():
                continue
            try:
                INFO_CACHE.get(member.path)  # the header as serving reads it: any refusal is a reason
            except ModelFileError as e:
                problems.append(f"{config.path}: models.{spec.name}: {e}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if problems:
        return 1
    where = config.path or "built-in defaults (no config file)"
    print(f"ok: {where}: {len(config.models)} model(s) configured")
    return 0


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def cmd_models(args: argparse.Namespace) -> int:
    from .serving.registry import Registry
    from .text.chat_template import CHATML
    from .text.formats import tool_format

    config = _load(args, check_files=False)
    if config is None:
        return 1
    registry = Registry(config)
    asyncio.run(registry.devices.read(dict))  # the GPUs, for the estimates' split by device
    rows = []
    for spec in registry.specs():
        names = registry.names_of(spec)
        row: dict[str, Any] = {"name": spec.name, "aliases": names[1:], "source": spec.source, "file": str(spec.path),
               "conflicts": {n: [str(p) for p in lost] for n, lost in registry.conflicts_won(spec).items()},
               "loras": _adapters(spec)}
        if spec.path is None:  # served elsewhere, or by replicas: nothing on disk to read
            row.update(size=None, architecture=None, quantization=None, context_length=None, error=None,
                       tool_format=None, memory_estimate=None, media=[], file=_served_by(spec))
            rows.append(row)
            continue
        try:
            info = INFO_CACHE.get(spec.path)  # read by the registry's scan already
            row.update(size=info.file_size, architecture=info.architecture, quantization=info.quantization,
                       context_length=info.context_length, error=None, media=registry.media(spec),
                       tool_format=tool_format(spec.tool_format,
                                               {"chat_template": spec.chat_template or info.chat_template or CHATML}),
                       memory_estimate=registry.estimate(spec))
        except ModelFileError as e:
            row.update(size=None, architecture=None, quantization=None, context_length=None, error=str(e),
                       tool_format=None, memory_estimate=None, media=[])
        rows.append(row)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print("no models configured or found (gguf-gateway serve would serve its built-in demo model)",
              file=sys.stderr)
        return 0
    table = [("NAME", "SOURCE", "SIZE", "MEMORY", "ARCH", "QUANT", "TOOLS", "MEDIA", "FILE")]
    for r in rows:
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
        if r["error"]:
            table.append((name, r["source"], "-", "-", "-", "-", "-", "-", f"{r['file']}  [error: {r['error']}]"))
        elif r["size"] is None:
            table.append((name, r["source"], "-", "-", "-", "-", "-", "-", r["file"]))
        else:
            memory = "?"
            if r["memory_estimate"]:  # the total, and what of it a GPU holds
                gpus = [f"{pool} {_human(n)}" for pool, n in r["memory_estimate"]["devices"].items() if pool != "ram"]
                memory = _human(r["memory_estimate"]["total"]) + (f" ({', '.join(gpus)})" if gpus else "")
            table.append((name, r["source"], _human(r["size"]), memory, r["architecture"] or "?",
                          r["quantization"] or "?", r["tool_format"] or "none", "+".join(r["media"]) or "-",
                          r["file"]))
    widths = [max(len(line[i]) for line in table) for i in range(8)]
    print("  ".join(c.ljust(w) for c, w in zip(table[0], widths)) + "  " + table[0][8])
    for line, r in zip(table[1:], rows):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[8])
        for a in r["loras"]:  # each adapter under its model, by the name a request gives it
            print(f"  + {a['model']}  (LoRA, scale {a['scale']:g}, {a['source']})  {a['path']}")
    for r in rows:
        for name, lost in r["conflicts"].items():
            print(f"name {name!r}: {r['file']} won over {', '.join(lost)}")
    return 0


def _adapters(spec) -> list[dict[str, Any]]:
    """A model's LoRA adapters by name (``ModelSpec.loras``), as ``/models`` lists them."""
    return [{"name": a.name, "model": qualified(spec.name, a.name), "path": str(a.path), "scale": a.scale,
             "source": a.source} for a in spec.loras]


def _served_by(spec) -> str:
    """Where a model that is not one local file runs: its upstream, or its replicas."""
    if spec.upstream is not None:
        return f"{spec.upstream.url} ({spec.upstream.model or spec.name})"
    return "replicas: " + ", ".join(_served_by(m) if m.path is None else str(m.path) for m in spec.replicas)


def cmd_serve(args: argparse.Namespace) -> int:
    handler = logging.StreamHandler()
    if args.log_format == "json":
        from .server.events import JsonLogFormatter

        handler.setFormatter(JsonLogFormatter())
    elif os.environ.get("JOURNAL_STREAM"):  # journald stamps each line itself
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    logging.getLogger("gguf").setLevel(logging.WARNING)  # the GGUF writer narrates every file it writes
    config = _load(args)
    if config is None:
        return 2
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack to stderr: for a stuck server
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    for line in config.warnings:
        log.warning("%s", line)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    from .app import is_loopback

    if not is_loopback(host) and not config.server.api_keys and not args.allow_unauthenticated:
        log.error("refusing to serve on %s with no API keys: anyone who can reach it could use it. "
                  "Set server.api_keys (or $GGUF_GATEWAY_API_KEYS), bind 127.0.0.1, or pass "
                  "--allow-unauthenticated", host)
        return 2
    from .server.connections import QuietConnectionLogs, raise_fd_limit

    QuietConnectionLogs().install()
    server = dataclasses.replace(config.server, host=host, port=port)
    fds = raise_fd_limit()
    allowed = None if fds is None else max(1, fds - 64)  # room left for workers, models and logs
    if allowed is not None and server.max_connections > allowed:
        log.warning("server.max_connections %d is over what %d open files allow: using %d",
                    server.max_connections, fds, allowed)
        server = dataclasses.replace(server, max_connections=allowed)
    config = dataclasses.replace(config, server=server)
    try:
        loop = event_loop(args.event_loop or config.server.event_loop)
    except ConfigError as e:
        for line in e.problems:
            log.error("%s", line)
        return 2
    try:
        if loop == "uvloop":
            import uvloop

            return uvloop.run(_serve(config, host, port))
        return asyncio.run(_serve(config, host, port))
    except KeyboardInterrupt:  # a second Ctrl-C while shutting down
        return 0


def event_loop(choice: str) -> str:
    """The event loop ``serve`` runs on, ``uvloop`` or ``asyncio``, for ``server.event_loop`` (or
    ``--event-loop``): ``auto`` is uvloop where it can be imported. uvloop asked for by name
    where it cannot be is a ``ConfigError`` saying how to get it."""
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError as e:
        if choice == "uvloop":
            raise ConfigError([f"server.event_loop: uvloop cannot be imported ({e}): install it with "
                               "pip install 'gguf-gateway[fast]' (or pip install uvloop), or set "
                               "event_loop: auto or asyncio"]) from None
        return "asyncio"
    return "uvloop"


async def _serve(config: Config, host: str, port: int) -> int:
    from aiohttp import web

    from .api.admin import reload_configuration
    from .app import CONNECTIONS, LIFECYCLE, create_app, server_settings
    from .server.systemd import Notifier
    from .serving.registry import Registry

    notifier = Notifier()
    registry = await asyncio.to_thread(Registry, config, allow_demo=True)
    app = create_app(config, registry)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=2.0, **server_settings(config))
    await runner.setup()  # preloads models (cleanup_ctx) before anything listens
    loop = asyncio.get_running_loop()
    guard = app[CONNECTIONS]
    listeners: list[asyncio.AbstractServer] = []
    # server.ollama_port: the same gateway on Ollama's port too, for clients that cannot be pointed elsewhere
    for at in [port] + ([config.server.ollama_port] if config.server.ollama_port else []):
        try:
            assert runner.server is not None  # made by setup()
            listeners.append(await loop.create_server(guard.wrap(runner.server), host, at, backlog=128))
        except OSError as e:
            log.error("cannot listen on %s:%s: %s", host, at, e.strerror or e)
            for listener in listeners:
                listener.close()
            await runner.cleanup()
            return 1
    stop = asyncio.Event()
    handlers = {signal.SIGINT: stop.set, signal.SIGTERM: stop.set,
                getattr(signal, "SIGHUP", None): lambda: asyncio.ensure_future(reload_configuration(app))}
    for sig, handler in handlers.items():
        if sig is None:
            continue
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError):  # not on this platform
            pass
    names = ", ".join(s.name for s in registry.specs()) or "none"
    running = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    log.info("gguf-gateway %s listening on http://%s:%s%s (models: %s; event loop: %s)", __version__, host, port,
             f" and :{config.server.ollama_port} (Ollama's port)" if config.server.ollama_port else "", names,
             running)
    notifier.notify("READY=1")
    watchdog = asyncio.ensure_future(notifier.watchdog())
    await stop.wait()
    notifier.notify("STOPPING=1")
    await _drain(app[LIFECYCLE], registry, listeners, config.server.drain_seconds)
    watchdog.cancel()
    guard.stop()
    await runner.cleanup()
    log.info("stopped")
    return 0


async def _drain(lifecycle: dict, registry, listeners: list[asyncio.AbstractServer], seconds: float) -> None:
    """Stop taking requests, give those in flight ``seconds`` to finish, then end the rest with an error."""
    lifecycle["draining"] = True
    for listener in listeners:
        listener.close()  # no new connections; a kept-alive one gets 503 and Connection: close
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    if registry.in_flight():
        log.info("shutting down: waiting up to %.0f s for %d request(s) in flight", seconds, registry.in_flight())
    while registry.in_flight() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if registry.in_flight():
        log.warning("drain time over: ending %d request(s) with an error", registry.in_flight())
        registry.abort_all("the gateway is shutting down")
        end = loop.time() + 2.0
        while registry.in_flight() and loop.time() < end:
            await asyncio.sleep(0.05)
