"""``gguf-gateway devices``: the devices llama.cpp can offload to, with their memory, read the
way the gateway reads them (``hardware.devices.Inventory``'s probe process), by the names
models.yaml's ``devices`` takes."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys


def add_commands(sub: argparse._SubParsersAction) -> None:
    devs = sub.add_parser("devices", help="list the devices llama.cpp can offload to, with their memory "
                          "(the names models.yaml's devices takes)")
    devs.add_argument("--json", action="store_true", help="one JSON object per device")
    devs.set_defaults(run=cmd_devices)


def cmd_devices(args: argparse.Namespace) -> int:
    """What llama.cpp sees, read the way the gateway reads it (a probe process)."""
    from ..hardware.devices import Inventory

    found = asyncio.run(Inventory().probe())
    if found is None:
        print("cannot list llama.cpp's devices (see the message above)", file=sys.stderr)
        return 1
    if args.json:
        for d in found:
            print(json.dumps({**d.describe(), "pool": d.pool}))
        return 0
    table = [("NAME", "KIND", "FREE", "TOTAL", "DESCRIPTION")]
    table += [(d.name, d.kind, human(d.free), human(d.total), d.description) for d in found]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])
    if not any(d.kind in ("gpu", "igpu") for d in found):
        print("no GPU: models run on the CPU (this llama-cpp-python was built without a GPU backend, or none "
              "is there)", file=sys.stderr)
    return 0


def human(n: int) -> str:
    """A size in bytes for a person: binary units, one decimal."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)
