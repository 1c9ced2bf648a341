"""The machine's memory, as the gateway's placement counts it: system RAM (on macOS, the
unified memory the GPU shares). Linux reads /proc/meminfo; macOS asks sysctl and vm_stat.
None where the system says nothing. A GPU's own memory is llama.cpp's to report (``devices``)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Memory:
    total: int
    available: int  # what can be had without swapping: free, and caches the kernel can drop


def read() -> Memory | None:
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo") as f:
                return parse_meminfo(f.read())
        except OSError:
            return None
    if sys.platform == "darwin":
        return _macos()
    return None


def parse_meminfo(text: str) -> Memory | None:
    fields = {m.group(1): int(m.group(2)) * 1024 for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.M)}
    if "MemTotal" not in fields:
        return None
    available = fields.get("MemAvailable", fields.get("MemFree", 0) + fields.get("Cached", 0))
    return Memory(fields["MemTotal"], available)


def parse_vm_stat(text: str, total: int) -> Memory | None:
    page = re.search(r"page size of (\d+) bytes", text)
    pages = {m.group(1).lower(): int(m.group(2)) for m in re.finditer(r"^Pages ([\w ]+):\s+(\d+)\.", text, re.M)}
    if page is None or "free" not in pages:
        return None
    size = int(page.group(1))
    free = pages["free"] + pages.get("inactive", 0) + pages.get("speculative", 0) + pages.get("purgeable", 0)
    return Memory(total, min(total, free * size))


def _macos() -> Memory | None:
    try:
        total = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=5).stdout)
        stat = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return parse_vm_stat(stat, total)


RAM = "ram"  # system memory's pool name, beside each GPU's (``memory``, ``devices``)
DEFAULT_RESERVE = -10  # ``server.memory_reserve``'s default: 10% of each device's memory


def reserve_bytes(reserve: int, total: int) -> int:
    """``server.memory_reserve`` in bytes: a negative one is a percentage of ``total``."""
    return int(total * -reserve / 100) if reserve < 0 else reserve
