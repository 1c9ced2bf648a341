"""What the machine offers a model: its CPUs (``physical_cores``, ``default_threads``) and
llama.cpp's devices as ggml reports them (``Device``, read by the probe process
``worker/device_probe`` and sent to the gateway as JSON)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any


def default_threads() -> int:
    """A model's thread count when none is configured: the physical cores among the CPUs this
    process may use (at most 16), as llama.cpp's own default. With SMT two threads on one core
    share its arithmetic units, and llama.cpp's threads wait for each other at every step, so
    every logical CPU decodes slower than one per core."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # macOS
        return max(1, min(_macos_physical_cores() or os.cpu_count() or 1, 16))
    return max(1, min(_cores(frozenset(cpus)), 16))


@functools.lru_cache(maxsize=8)
def _cores(cpus: frozenset[int]) -> int:
    """``physical_cores`` read once per set of CPUs: the placer asks at each request's start and
    end (``Placer.share_cpus``), and reading sysfs costs more than the rest of a short request's
    path; the affinity is still asked each time (a syscall), the machine's topology is not."""
    return physical_cores(set(cpus))


def physical_cores(cpus: set[int], sysfs: str = "/sys/devices/system/cpu") -> int:
    """How many distinct cores (package, core id) the logical CPUs ``cpus`` are on, from
    Linux's sysfs; where it says nothing, the CPUs themselves."""
    cores = set()
    for cpu in cpus:
        try:
            with open(f"{sysfs}/cpu{cpu}/topology/physical_package_id") as f:
                package = f.read().strip()
            with open(f"{sysfs}/cpu{cpu}/topology/core_id") as f:
                core = f.read().strip()
        except OSError:
            return len(cpus)
        cores.add((package, core))
    return len(cores) or len(cpus)


@functools.lru_cache(maxsize=1)
def _macos_physical_cores() -> int | None:
    import subprocess

    try:
        out = subprocess.run(["sysctl", "-n", "hw.physicalcpu"], capture_output=True, text=True, timeout=5)
        return int(out.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


# ggml's device kinds that use the system's memory and are not offloaded to (llama.cpp's
# ``--device`` refuses them)
HOST_KINDS = ("cpu", "accel")


@dataclass(frozen=True)
class Device:
    """One of llama.cpp's devices as ggml reports it (``worker/device_probe``): what the gateway's
    placement counts a GPU's memory by. Crosses from the probe process as a JSON object."""

    name: str  # ggml's: CPU, CUDA0, MTL0, Vulkan0, ...
    description: str
    kind: str  # cpu, gpu (own memory), igpu (host memory), accel, meta
    free: int  # bytes, when it was read
    total: int

    @property
    def pool(self) -> str:
        """The name memory is counted under: the device's, lowercased (``memory.RAM`` for the CPU)."""
        return "ram" if self.kind in HOST_KINDS else self.name.lower()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "kind": self.kind, "free": self.free,
                "total": self.total}

    @classmethod
    def parse(cls, d: Any) -> Device:
        """From ``describe()``'s object; raises ValueError on anything else."""
        try:
            return cls(str(d["name"]), str(d["description"]), str(d["kind"]), int(d["free"]), int(d["total"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a device: {d!r}") from e
