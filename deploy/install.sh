#!/usr/bin/env bash
# Install gguf-gateway as a systemd service (Linux). Idempotent: run it again to upgrade.
#   sudo deploy/install.sh             install or upgrade
#   sudo deploy/install.sh --nvidia    also the NVIDIA drop-in (build llama-cpp-python for CUDA:
#                                      CMAKE_ARGS="-DGGML_CUDA=on" sudo -E deploy/install.sh --nvidia)
#   sudo deploy/install.sh --uninstall remove the service, the venv and the user (keeps /etc and /var/lib)
set -euo pipefail

PREFIX=/opt/gguf-gateway
ETC=/etc/gguf-gateway
UNIT=/etc/systemd/system/gguf-gateway.service
DROPIN=/etc/systemd/system/gguf-gateway.service.d
USER_NAME=gguf-gateway
SRC="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

[ "$(id -u)" -eq 0 ] || { echo "error: run as root (sudo $0 $*)" >&2; exit 1; }
command -v systemctl >/dev/null || { echo "error: systemd (systemctl) not found" >&2; exit 1; }

if [ "${1:-}" = "--uninstall" ]; then
    systemctl disable --now gguf-gateway.service 2>/dev/null || true
    rm -f "$UNIT"
    rm -rf "$DROPIN" "$PREFIX"
    systemctl daemon-reload
    if id "$USER_NAME" >/dev/null 2>&1; then userdel "$USER_NAME"; fi
    echo "removed gguf-gateway (kept $ETC and /var/lib/gguf-gateway)"
    exit 0
fi

if ! id "$USER_NAME" >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/gguf-gateway --no-create-home --shell /usr/sbin/nologin "$USER_NAME"
fi
# GPU device nodes belong to render/video on most distributions
for group in render video; do
    if getent group "$group" >/dev/null; then usermod -a -G "$group" "$USER_NAME"; fi
done

mkdir -p "$PREFIX"
[ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/python" -m pip install -q --upgrade pip
"$PREFIX/venv/bin/python" -m pip install -q --upgrade "$SRC"
install -m 0644 "$SRC/README.md" "$PREFIX/README.md"
install -d -m 0755 "$PREFIX/docs"
install -m 0644 "$SRC"/docs/*.md "$SRC"/docs/*.json "$PREFIX/docs/"

install -d -m 0755 "$ETC"
[ -e "$ETC/models.yaml" ] || install -m 0644 "$SRC/models.yaml.example" "$ETC/models.yaml"
install -m 0644 "$SRC/deploy/gguf-gateway.service" "$UNIT"
if [ "${1:-}" = "--nvidia" ]; then
    install -d -m 0755 "$DROPIN"
    install -m 0644 "$SRC/deploy/gguf-gateway-nvidia.conf" "$DROPIN/nvidia.conf"
fi

"$PREFIX/venv/bin/gguf-gateway" check-config --config "$ETC/models.yaml" || \
    echo "warning: fix $ETC/models.yaml, then: systemctl restart gguf-gateway" >&2
systemctl daemon-reload
systemctl enable gguf-gateway.service >/dev/null
systemctl restart gguf-gateway.service
echo "installed: systemctl status gguf-gateway; config in $ETC/models.yaml; logs: journalctl -u gguf-gateway"
