"""`scripts/bench.py --cost`'s probes: timestamps at the seams of a request's path, in the gateway
process and in its model worker, put there from outside, so the gateway's code carries none and
costs nothing when they are not installed.

costbench.py starts a gateway whose PYTHONPATH names a folder holding a ``sitecustomize.py`` that
calls ``install(folder)``. Each process started so (the gateway, its workers) then wraps the
functions ``PROBES`` names as their modules are imported: a wrapper notes ``LABEL>`` when the
function is called and ``LABEL<`` when it returns (an async context manager also ``LABEL=`` once
entered and ``LABEL x`` when left). A stamp is ``time.perf_counter_ns()``: CLOCK_MONOTONIC on
Linux, one clock for every process of the machine, so the client's, the gateway's and the
worker's stamps fall on one line. Each process keeps its stamps in memory and writes them to
``FOLDER/PID.txt`` (``label ns`` a line) when it exits: at ``atexit`` or at ``os._exit``, which
the worker leaves by.

What the probes cost (a wrapper and a clock read, about a microsecond each) is in the figures
they give: costbench measures the same gateway without them too, and says the difference.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "GATEWAY_COSTTRACE"  # the folder the stamps are written to; the probes install only with it

# module -> [(attribute path, label, kind)]; kind: "call" (a function or method, sync or async),
# "cm" (returns an async context manager), "middleware" (a factory whose result is a middleware)
PROBES: dict[str, list[tuple[str, str, str]]] = {
    "aiohttp.web_protocol": [("RequestHandler.data_received", "http.in", "call"),
                             ("RequestHandler._handle_request", "http.task", "call"),
                             ("RequestHandler.finish_response", "http.finish", "call")],
    "gateway.app": [("connection_middleware", "mw.connection", "call"),
                    ("observe_middleware", "mw.observe", "call"),
                    ("errors_middleware", "mw.errors", "call"),
                    ("host_check_middleware", "mw.host", "middleware"),
                    ("browser_guard_middleware", "mw.browser", "middleware"),
                    ("access_middleware", "mw.access", "middleware"),
                    ("_record", "record", "call")],
    "gateway.server.events": [("EventSink.write", "record.events", "call")],
    "gateway.server.live": [("Live.record", "record.live", "call")],
    "gateway.api.openai": [("completions", "handler", "call"), ("read_json_object", "body", "call")],
    "gateway.wire.openai": [("parse_completion", "parse", "call")],
    "gateway.wire.openai_answer": [("Renderer.whole", "render", "call")],
    "gateway.api.pipeline": [("prepared", "lease", "cm"), ("read", "collect", "call")],
    "gateway.serving.registry": [("Registry.lease", "lease.registry", "cm")],
    "gateway.backends.workerclient": [("WorkerProcess._send", "send", "call"),
                                      ("_Frames.data_received", "events.in", "call"),
                                      ("protocol.encode_command", "encode", "call")],
    "aiohttp.web": [("json_response", "json_response", "call")],
    "aiohttp.http_writer": [("StreamWriter._write", "http.write", "call"),
                            ("StreamWriter._writelines", "http.write", "call")],
    # a round of a tool the gateway runs itself (toolbench.py; never reached by a plain completion)
    "gateway.api.toolloop": [("_run", "loop.run", "call"), ("cut", "loop.cut", "call"),
                             ("_converse", "loop.converse", "call")],
    "gateway.tools.toolbox": [("Toolbox.run", "toolbox.run", "call")],
    "gateway.tools.websearch": [("_searxng", "search.http", "call")],
    "gateway.wire.anthropic_answer": [("Writer.hosted", "writer.hosted", "call"),
                                      ("Writer.hosted_result", "writer.result", "call")],
    # the worker's
    "gateway.worker.pipes": [("CommandReader.read", "w.read", "call")],  # called when the loop finds the pipe ready
    "gateway.worker.prompts": [("Prompts.prepare", "w.prepare", "call")],
    "gateway.worker.decoding": [("Decoder.admit", "w.admit", "call"), ("Decoder.step", "w.step", "call"),
                                ("choose", "w.choose", "call")],
    "gateway.worker.slotmemory": [("SlotMemory.prepare", "w.memory", "call")],
    "gateway.worker.sampling": [("Sampling.chain", "w.chain", "call")],
    "gateway.worker.outbox": [("Outbox.flush", "w.flush", "call")],
}

STAMPS: list[tuple[str, int]] = []
_clock = time.perf_counter_ns


def _call(f: Callable, label: str) -> Callable:
    enter, leave = label + ">", label + "<"
    stamps = STAMPS
    if inspect.iscoroutinefunction(f):
        @functools.wraps(f)
        async def probed_async(*a: Any, **kw: Any) -> Any:
            stamps.append((enter, _clock()))
            try:
                return await f(*a, **kw)
            finally:
                stamps.append((leave, _clock()))
        return probed_async

    @functools.wraps(f)
    def probed(*a: Any, **kw: Any) -> Any:
        stamps.append((enter, _clock()))
        try:
            return f(*a, **kw)
        finally:
            stamps.append((leave, _clock()))
    return probed


class _Context:
    """An async context manager, stamped as it is entered and left."""

    def __init__(self, cm: Any, label: str):
        self.cm, self.label = cm, label

    async def __aenter__(self) -> Any:
        STAMPS.append((self.label + ">", _clock()))
        value = await self.cm.__aenter__()
        STAMPS.append((self.label + "=", _clock()))
        return value

    async def __aexit__(self, *exc: Any) -> Any:
        STAMPS.append((self.label + "x", _clock()))
        try:
            return await self.cm.__aexit__(*exc)
        finally:
            STAMPS.append((self.label + "<", _clock()))


def _cm(f: Callable, label: str) -> Callable:
    @functools.wraps(f)
    def probed(*a: Any, **kw: Any) -> Any:
        return _Context(f(*a, **kw), label)
    return probed


def _middleware(factory: Callable, label: str) -> Callable:
    @functools.wraps(factory)
    def probed(*a: Any, **kw: Any) -> Any:
        return _call(factory(*a, **kw), label)
    return probed


_KINDS = {"call": _call, "cm": _cm, "middleware": _middleware}


def patch(module: Any) -> None:
    for path, label, kind in PROBES.get(module.__name__, ()):
        *owners, name = path.split(".")
        owner = module
        for part in owners:
            owner = getattr(owner, part)
        setattr(owner, name, _KINDS[kind](getattr(owner, name), label))


class _Finder(importlib.abc.MetaPathFinder):
    """Patches each probed module once it has run (its functions defined, its imports bound)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in PROBES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def dump(folder: Path) -> None:
    if STAMPS:
        with open(folder / f"{os.getpid()}.txt", "a") as f:
            f.writelines(f"{label} {ns}\n" for label, ns in STAMPS)
        STAMPS.clear()


def install(folder: str | None = None) -> None:
    """Probe this process (from ``sitecustomize``): nothing happens without ``GATEWAY_COSTTRACE``."""
    folder = folder or os.environ.get(ENV)
    if not folder:
        return
    where = Path(folder)
    sys.meta_path.insert(0, _Finder())
    atexit.register(dump, where)
    real_exit = os._exit

    def exit_(code: int) -> None:  # the worker leaves without atexit
        dump(where)
        real_exit(code)

    os._exit = exit_  # type: ignore[assignment]


def read(folder: Path) -> list[tuple[int, str, int]]:
    """Every process's stamps: (ns, label, pid), in time order."""
    out = []
    for file in folder.glob("*.txt"):
        pid = int(file.stem)
        for line in file.read_text().splitlines():
            label, ns = line.rsplit(" ", 1)
            out.append((int(ns), label, pid))
    out.sort()
    return out
