"""llama.cpp's RPC backend in the worker: a model's layers on other machines' ``rpc-server``s.

This is what llama.cpp's own ``--rpc host:port,...`` does (``common/arg.cpp``): each server is
added through the RPC backend's ``ggml_backend_rpc_add_server`` and registered as a backend, so
its devices (``RPC0``, ``RPC1``, ...) join the ones llama.cpp spreads layers over by free memory:
the servers' first, then any local GPU; the layers past ``n_gpu_layers`` stay on the local CPU.

llama-cpp-python binds none of ggml's backend registry: the few calls are bound with ctypes
(``worker.ggml``). Two failures are caught before llama.cpp sees them, because
there they abort the whole process: a llama-cpp-python built without ``-DGGML_RPC=on`` (no
"RPC" registry), and a server that does not accept a connection.
"""

from __future__ import annotations

import ctypes
import socket
from typing import Any

from . import ggml

CONNECT_TIMEOUT = 5.0
_add_server_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)


class RpcUnavailable(RuntimeError):
    """The model cannot use its RPC servers; the message says why and what to do."""


def _ggml(ll: Any) -> Any:
    try:
        return ggml.bind(ll, "ggml_backend_reg_by_name", "ggml_backend_reg_get_proc_address", "ggml_backend_register",
                         "ggml_backend_reg_dev_count")
    except ggml.Missing as e:
        raise RpcUnavailable(str(e)) from None


def check_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT) -> None:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise RpcUnavailable(f"rpc-server {endpoint} is not reachable ({e.strerror or e}); start llama.cpp's "
                             f"rpc-server there: `ggml-rpc-server --host 0.0.0.0 --port {port}`") from None


def add_servers(ll: Any, endpoints: list[str] | tuple[str, ...]) -> int:
    """Register each ``host:port`` as llama.cpp devices before the model loads; returns the number
    of devices they hold. Raises ``RpcUnavailable``."""
    if not ll.llama_supports_rpc():
        raise RpcUnavailable("this llama-cpp-python was built without llama.cpp's RPC backend; reinstall it with "
                             'CMAKE_ARGS="-DGGML_RPC=on" (see docs/beyond-one-machine.md)')
    ggml = _ggml(ll)
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    add = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not add:
        raise RpcUnavailable("llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    devices = 0
    for endpoint in endpoints:
        check_reachable(endpoint)
        server = _add_server_t(add)(endpoint.encode())
        if not server:
            raise RpcUnavailable(f"rpc-server {endpoint} offers no device")
        ggml.ggml_backend_register(server)
        devices += ggml.ggml_backend_reg_dev_count(server)
    return devices
