#!/usr/bin/env python3
"""llama.cpp's RPC backend without reinstalling llama-cpp-python: ``rpc-server`` and an
RPC-enabled ggml, built from the llama.cpp sources that the installed llama-cpp-python vendors
(the same version, so the RPC protocol matches), once per checkout into ``.cache/``. The tests
and ``scripts/bench.py --rpc`` use it; so can a user trying RPC on one machine:

    .venv/bin/python scripts/rpc_build.py      # prints the rpc-server binary and the library directory
    LLAMA_CPP_LIB_PATH=<library directory> ./scripts/serve

The gateway's workers then load that ggml instead of the installed one: llama-cpp-python reads
its libraries from ``$LLAMA_CPP_LIB_PATH`` when set, and the directory built here holds the
installed ``libllama`` beside the RPC-enabled ggml libraries (``libllama`` finds ggml by
``$ORIGIN``, and finds the RPC backend at run time by name).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.models import testmodels  # noqa: E402

CACHE = Path(os.environ.get("GGUF_GATEWAY_TEST_CACHE") or REPO / ".cache")


def build() -> tuple[Path, Path]:
    """(the rpc-server binary, the library directory for ``LLAMA_CPP_LIB_PATH``)."""
    version = metadata.version("llama-cpp-python")
    root = CACHE / f"rpc-{version}"
    server, libs = root / "build" / "bin" / "ggml-rpc-server", root / "libs"
    if server.exists() and (libs / "libllama.so").exists():
        return server, libs
    src = root / "src"
    if not (src / "CMakeLists.txt").exists():
        sdist = testmodels._llama_cpp_sdist(CACHE)
        shutil.rmtree(src, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            prefix = next(m.name for m in tar if m.name.endswith("/vendor/llama.cpp/CMakeLists.txt")).rsplit("/", 1)[0]
            members = [m for m in tar.getmembers() if m.name.startswith(prefix + "/")]
            for m in members:
                m.name = m.name[len(prefix) + 1:]
            members = [m for m in members if not m.name.startswith(("models/", "docs/"))]  # vocabularies, docs
            tar.extractall(src, members=members, filter="tar")
    began = time.monotonic()
    cmake = ["cmake", "-S", str(src), "-B", str(root / "build"), "-DGGML_RPC=ON", "-DBUILD_SHARED_LIBS=ON",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_SERVER=OFF", "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ninja"):
        cmake += ["-G", "Ninja"]
    subprocess.run(cmake, check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(root / "build"), "--target", "ggml-rpc-server", "-j",
                    str(os.cpu_count() or 2)], check=True, capture_output=True)
    print(f"built llama.cpp's rpc-server in {time.monotonic() - began:.0f} s", file=sys.stderr)
    libs.mkdir(parents=True, exist_ok=True)
    import llama_cpp.llama_cpp as ll

    installed = Path(ll._base_path)
    # links stay links: libfoo.so, libfoo.so.0 and libfoo.so.0.x.y must be one file, or a process
    # would load two copies of a library (each with its own backend registry)
    for lib in [*(root / "build" / "bin").glob("libggml*.so*"), *installed.glob("libllama.so*"),
                *installed.glob("libmtmd.so*")]:
        (libs / lib.name).unlink(missing_ok=True)
        shutil.copy2(lib, libs / lib.name, follow_symlinks=False)
    return server, libs


if __name__ == "__main__":
    binary, directory = build()
    print(f"rpc-server: {binary}\nLLAMA_CPP_LIB_PATH={directory}")
