"""The devices llama.cpp can place a model on, with their memory, as ggml reports them.

``python -m gateway.engine.devices`` prints them as a JSON list (``protocol.Device.describe``)
and exits: the gateway asks this way (``gateway.devices``), because initialising a GPU backend
in the gateway's own process would hold its memory for as long as the gateway runs. The CPU
device reports system memory; a CUDA device's free memory is ``cudaMemGetInfo``'s, a Metal
device's its recommended working set less what is allocated.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from . import ggml
from .protocol import Device

# enum ggml_backend_dev_type, in order
KINDS = ("cpu", "gpu", "igpu", "accel", "meta")


def query(ll: Any) -> list[Device]:
    """Every device ggml has registered, in its order (the order llama.cpp numbers GPUs in)."""
    lib = ggml.bind(ll, "ggml_backend_dev_count", "ggml_backend_dev_get", "ggml_backend_dev_name",
                    "ggml_backend_dev_description", "ggml_backend_dev_type", "ggml_backend_dev_memory")
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        devices.append(Device(name=(lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace"),
                              description=(lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
                              kind=KINDS[kind] if 0 <= kind < len(KINDS) else "other",
                              free=free.value, total=total.value))
    return devices


def main() -> int:
    try:
        import llama_cpp

        llama_cpp.llama_backend_init()  # its log goes to stderr, which the gateway reads only on failure
        found = query(llama_cpp)
    except (ImportError, OSError, ggml.Missing) as e:
        print(f"cannot list llama.cpp's devices: {e}", file=sys.stderr)
        return 1
    json.dump([d.describe() for d in found], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
