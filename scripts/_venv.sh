# Sourced by scripts/serve and scripts/test: make .venv and install the package into it.
# Re-installs only when pyproject.toml changes; pip's wheel cache is left alone, so the
# llama-cpp-python build (minutes, from source) happens once per machine.

ensure_venv() {
    local extra="$1"
    local py="${PYTHON:-python3}"
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "error: $py not found; install Python 3.10 or newer (or set PYTHON=/path/to/python3)" >&2
        exit 1
    fi
    if [ ! -x .venv/bin/python ]; then
        "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
            echo "error: gguf-gateway needs Python 3.10 or newer; $py is $("$py" --version 2>&1)" >&2
            exit 1
        }
        echo "creating .venv with $("$py" --version 2>&1)" >&2
        "$py" -m venv .venv || exit 1
    fi
    local stamp=".venv/.installed${extra:+-$extra}"
    local want
    want="$(cat pyproject.toml scripts/_venv.sh | cksum)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "installing gguf-gateway${extra:+ with [$extra]} into .venv" >&2
        echo "(the first install compiles llama-cpp-python from source: a few minutes;" \
             "set CMAKE_ARGS=\"-DGGML_CUDA=on\" first for an NVIDIA GPU)" >&2
        .venv/bin/python -m pip install -q --upgrade pip >&2 || exit 1
        .venv/bin/python -m pip install -q -e ".${extra:+[$extra]}" >&2 || exit 1
        echo "$want" > "$stamp"
    fi
}
