#!/usr/bin/env bash
# Makes the Python environment the PyTorch backend is built and tested with:
# a venv of Debian's python3 with torch from PyPI (the wheel runs on CPU
# machines too). Safe to run again: an existing venv whose torch imports is
# kept.
#   setup-torch.sh [VENV]     default: ${BUILD_DIR:-build}/torch-venv
# LOOM_TORCH_SPEC picks the torch to install (default below); the CMake
# configure step finds <build>/torch-venv by itself (or pass
# -DLOOM_TORCH_PYTHON=/path/to/python).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-${BUILD_DIR:-$root/build}/torch-venv}"
spec="${LOOM_TORCH_SPEC:-torch==2.15.0}"
"$root/tools/scripts/install-deps.sh"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch" 2>/dev/null; then
  exit 0
fi
start=$(date +%s)
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "$spec" numpy
echo "loom: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)') in $venv ($(( $(date +%s) - start )) s)" >&2
