"""``gguf-gateway serve``: logging, the refusal to serve an open address without keys, the
connection limit the open-file limit allows, the event loop (``event_loop``), the listeners
(``server.ollama_port`` too), systemd's notifications, SIGHUP's reload, and the drain on SIGINT
or SIGTERM (``_drain``: requests in flight get ``server.drain_seconds``, then end with an error)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import faulthandler
import logging
import os
import signal

from .. import __version__
from ..models.config import EVENT_LOOPS, Config, ConfigError
from .configfile import config_arg, read_config

log = logging.getLogger("gateway")


def add_commands(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run the gateway")
    config_arg(serve)
    serve.add_argument("--host", help="address to bind (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: server.port, 8080)")
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve on a non-loopback address without API keys (anyone who can reach it may use it)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", default="plain", choices=["plain", "json"],
                       help="plain lines (fit for journald) or one JSON object per line")
    serve.add_argument("--event-loop", choices=EVENT_LOOPS,
                       help="the HTTP server's event loop (default: server.event_loop, auto: uvloop where installed)")
    serve.set_defaults(run=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    handler = logging.StreamHandler()
    if args.log_format == "json":
        from ..server.events import JsonLogFormatter

        handler.setFormatter(JsonLogFormatter())
    elif os.environ.get("JOURNAL_STREAM"):  # journald stamps each line itself
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    logging.getLogger("gguf").setLevel(logging.WARNING)  # the GGUF writer narrates every file it writes
    config = read_config(args)
    if config is None:
        return 2
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack to stderr: for a stuck server
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    for line in config.warnings:
        log.warning("%s", line)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    from ..app import is_loopback

    if not is_loopback(host) and not config.server.api_keys and not args.allow_unauthenticated:
        log.error("refusing to serve on %s with no API keys: anyone who can reach it could use it. "
                  "Set server.api_keys (or $GGUF_GATEWAY_API_KEYS), bind 127.0.0.1, or pass "
                  "--allow-unauthenticated", host)
        return 2
    from ..server.connections import QuietConnectionLogs, raise_fd_limit

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

    from ..api.admin import reload_configuration
    from ..app import CONNECTIONS, LIFECYCLE, create_app, server_settings
    from ..server.systemd import Notifier
    from ..serving.registry import Registry

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
