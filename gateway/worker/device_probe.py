"""The devices llama.cpp can place a model on, with their memory, as ggml reports them.

``python -m gateway.worker.device_probe`` prints them as a JSON list (``hardware.Device.describe``)
and exits: the gateway asks this way (``gateway.hardware.devices``), because initialising a GPU backend
in the gateway's own process would hold its memory for as long as the gateway runs. The CPU
device reports system memory; a CUDA device's free memory is ``cudaMemGetInfo``'s, a Metal
device's its recommended working set less what is allocated.
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any

from ..protocol.topology import HOST_KINDS, Device
from . import ggml

# enum ggml_backend_dev_type, in order
KINDS = ("cpu", "gpu", "igpu", "accel", "meta")


def _kind(n: int) -> str:
    return KINDS[n] if 0 <= n < len(KINDS) else "other"


def query(ll: Any, only: set[str] | None = None) -> list[Device]:
    """Every device ggml has registered, in its order (the order llama.cpp numbers GPUs in);
    with ``only`` (lowercased names), the CPU's and those: asking a GPU's memory starts its
    runtime in this process, which then holds some of that GPU's memory."""
    lib = ggml.bind(ll, "ggml_backend_dev_count", "ggml_backend_dev_get", "ggml_backend_dev_name",
                    "ggml_backend_dev_description", "ggml_backend_dev_type", "ggml_backend_dev_memory")
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = _kind(lib.ggml_backend_dev_type(dev))
        name = (lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace")
        if only is not None and kind not in HOST_KINDS and name.lower() not in only:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(Device(name=name,
                              description=(lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
                              kind=kind,
                              free=free.value, total=total.value))
    return devices


def offload_list(ll: Any, names: tuple[str, ...]) -> Any:
    """``llama_model_params.devices`` for ``names`` (models.yaml ``devices``): their handles,
    NULL-terminated (an empty list: no device but the CPU). Raises ``ValueError`` naming the
    devices there are, for a name llama.cpp does not know or for the CPU (not a device to
    offload to, as llama-server's --device says)."""
    lib = ggml.bind(ll, "ggml_backend_dev_by_name", "ggml_backend_dev_type")
    handles = []
    for name in names:
        dev = lib.ggml_backend_dev_by_name(name.encode())
        if not dev or _kind(lib.ggml_backend_dev_type(dev)) in HOST_KINDS:
            there = [d.name for d in query(ll) if d.kind not in HOST_KINDS]
            raise ValueError(f"llama.cpp has no device {name!r} to offload to (it has: "
                             f"{', '.join(there) or 'none besides the CPU'}); see gguf-gateway devices")
        handles.append(dev)
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


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
