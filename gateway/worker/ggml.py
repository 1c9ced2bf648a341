"""ggml's backend registry, bound with ctypes: llama-cpp-python binds none of it.

The calls are found through the libllama llama-cpp-python loaded (its dependencies are searched
too), so they act on the very ggml that llama.cpp uses: another copy of the library would hold
a registry of its own."""

from __future__ import annotations

import ctypes
from typing import Any

_p = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "ggml_backend_reg_by_name": ([ctypes.c_char_p], _p),
    "ggml_backend_reg_get_proc_address": ([_p, ctypes.c_char_p], _p),
    "ggml_backend_register": ([_p], None),
    "ggml_backend_reg_dev_count": ([_p], ctypes.c_size_t),
    "ggml_backend_dev_count": ([], ctypes.c_size_t),
    "ggml_backend_dev_get": ([ctypes.c_size_t], _p),
    "ggml_backend_dev_by_name": ([ctypes.c_char_p], _p),
    "ggml_backend_dev_name": ([_p], ctypes.c_char_p),
    "ggml_backend_dev_description": ([_p], ctypes.c_char_p),
    "ggml_backend_dev_type": ([_p], ctypes.c_int),
    "ggml_backend_dev_memory": ([_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
}


class Missing(RuntimeError):
    """llama-cpp-python's libraries do not export a ggml call the gateway needs."""


def bind(ll: Any, *names: str) -> Any:
    """The loaded library with ``names`` given their C signatures; raises ``Missing``."""
    lib = ll.llama_cpp._lib
    for name in names:
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise Missing(f"llama-cpp-python's libraries do not export {name}") from None
        f.argtypes, f.restype = _SIGNATURES[name]
    return lib
