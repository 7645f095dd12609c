#!/usr/bin/env bash
# Configures and builds loom into ${BUILD_DIR:-build} (Release-with-debug-info).
# Extra arguments go to the CMake configure step (e.g. -DLOOM_CUDA=OFF).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
"$root/tools/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
