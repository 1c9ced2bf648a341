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

``server()`` builds llama.cpp's own ``llama-server`` of that version in the same tree, for the
tests and benchmarks that set the gateway beside it (``tests/test_lora_e2e.py``,
``scripts/bench.py --lora``), and ``llama-bench`` beside it (``scripts/bench.py --embeddings``
reads its pp512 from there):

    .venv/bin/python scripts/rpc_build.py --server   # prints the llama-server binary
"""

from __future__ import annotations

import fcntl
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
    root = _root()
    server, libs = root / "build" / "bin" / "ggml-rpc-server", root / "libs"
    if server.exists() and (libs / "libllama.so").exists():
        return server, libs
    began = time.monotonic()
    _configure(root, "-DLLAMA_BUILD_SERVER=OFF")
    _target(root, "ggml-rpc-server")
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


def server() -> Path:
    """llama.cpp's ``llama-server`` of the vendored version, built in the same tree as ``build()``
    (what that built is reused; from nothing, everything is done here), for tests and benchmarks
    that set the gateway's answers beside llama-server's, with ``llama-bench`` beside it. It runs
    from the build tree: it finds its own ``libllama`` and ggml there (not the installed ones),
    built from the same sources. No web UI is embedded (nothing is downloaded); start it with
    ``--no-webui``."""
    root = _root()
    binary = root / "build" / "bin" / "llama-server"
    bench = binary.with_name("llama-bench")
    if binary.exists() and bench.exists():
        return binary
    with open(root / ".server-build.lock", "w") as lock:  # two processes at once: one builds, one waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            began = time.monotonic()
            _configure(root, "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF")
            _target(root, "llama-server")
            print(f"built llama.cpp's llama-server in {time.monotonic() - began:.0f} s", file=sys.stderr)
        if not bench.exists():  # (a tree that built llama-server before llama-bench was asked for: a link more)
            _target(root, "llama-bench")
    return binary


def _root() -> Path:
    """``CACHE / rpc-VERSION``, its ``src`` holding the vendored llama.cpp (extracted once)."""
    version = metadata.version("llama-cpp-python")
    root = CACHE / f"rpc-{version}"
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
    return root


def _configure(root: Path, *more: str) -> None:
    """cmake's configure of ``root/build``: one set of flags for every target built there, so a
    second target reuses what the first built (changing a compiler flag would rebuild it all)."""
    cmake = ["cmake", "-S", str(root / "src"), "-B", str(root / "build"), "-DGGML_RPC=ON", "-DBUILD_SHARED_LIBS=ON",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DCMAKE_BUILD_TYPE=Release", *_native_flags(), *more]
    if shutil.which("ninja"):
        cmake += ["-G", "Ninja"]
    subprocess.run(cmake, check=True, capture_output=True)


def _target(root: Path, target: str) -> None:
    subprocess.run(["cmake", "--build", str(root / "build"), "--target", target, "-j", str(os.cpu_count() or 2)],
                   check=True, capture_output=True)


def _native_flags() -> list[str]:
    """ggml builds for this CPU (``GGML_NATIVE``). Where the compiler's ``-march=native`` turns
    AMX on, AMX is kept out: some virtual machines' CPUs advertise AMX but trap its instructions
    (the kernel grants AMX's state only on request). Elsewhere nothing is added: the same flags
    as a tree configured before this rule, so it is not rebuilt."""
    try:
        macros = subprocess.run(["cc", "-march=native", "-dM", "-E", "-x", "c", "-"], input="", text=True,
                                capture_output=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    if "__AMX_TILE__" not in macros:
        return []
    flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    return [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]


if __name__ == "__main__":
    if sys.argv[1:] == ["--server"]:
        print(f"llama-server: {server()}")
    else:
        binary, directory = build()
        print(f"rpc-server: {binary}\nLLAMA_CPP_LIB_PATH={directory}")
