#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test tier
# that runs on this machine (unit, multi-process, tools) with CTest.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
# The PyTorch backend's environment (torch from PyPI in a venv), unless
# LOOM_TORCH=OFF: without it the torch tests skip, saying why.
if [ "${LOOM_TORCH:-AUTO}" != OFF ]; then
  BUILD_DIR="$build" "$root/tools/scripts/setup-torch.sh"
fi
"$root/tools/scripts/build.sh" "$@"
cd "$build"
# These tiers test host buffers. On a GPU machine LOOM_DEVICE=auto would
# mean cuda mode, so host mode is asked for; the cuda-mode tests choose
# their mode themselves (loomSetBufferMode), and tools/gpu_check.sh runs
# the device checks.
export LOOM_DEVICE=host
ctest --output-on-failure --timeout 900 -j "$(nproc)"
