"""``gguf-gateway models``: every model name that resolves, with its aliases, source, size, memory
estimate, architecture, quantization, tool-call format, media and LoRA adapters, read from the
GGUF headers (the registry's own scan, nothing loaded); ``--json``: one object per model."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..models.adapternames import qualified
from ..models.discovery import INFO_CACHE
from ..models.ggufmeta import ModelFileError
from .configfile import config_arg, read_config
from .devices import human


def add_commands(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="list every model name that resolves, read from the GGUF headers")
    config_arg(models)
    models.add_argument("--json", action="store_true", help="one JSON object per model")
    models.set_defaults(run=cmd_models)


def cmd_models(args: argparse.Namespace) -> int:
    from ..serving.registry import Registry
    from ..text.chat_template import CHATML
    from ..text.formats import tool_format

    config = read_config(args, check_files=False)
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
                gpus = [f"{pool} {human(n)}" for pool, n in r["memory_estimate"]["devices"].items() if pool != "ram"]
                memory = human(r["memory_estimate"]["total"]) + (f" ({', '.join(gpus)})" if gpus else "")
            table.append((name, r["source"], human(r["size"]), memory, r["architecture"] or "?",
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
