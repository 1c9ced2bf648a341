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

# The page's browser tests (tests/test_dashboard_browser.py) drive a system Chromium; they are
# skipped, saying why, where none is installed. Where the system has apt-get and we may use it
# (root, or sudo without a password) install Debian's package; GGUF_GATEWAY_NO_BROWSER=1 opts out.
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
        || [ -n "${GGUF_GATEWAY_CHROMIUM:-}" ] || [ -n "${GGUF_GATEWAY_NO_BROWSER:-}" ]; then
        return 0
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "note: no Chromium, and no root to install it; the page's browser tests will be skipped" >&2
            return 0
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "note: no Chromium (and no apt-get here); the page's browser tests will be skipped" >&2
        return 0
    fi
    echo "installing the system's chromium package for the page's browser tests" >&2
    if ! { $sudo env DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q chromium >/dev/null 2>&1 \
        || { $sudo timeout 300 apt-get update -q >/dev/null 2>&1 \
             && $sudo env DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q chromium >/dev/null 2>&1; }; }
    then
        echo "note: could not install chromium; the page's browser tests will be skipped" >&2
    fi
    return 0
}
