#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test tier
# that runs on this machine (unit, multi-process, tools) with CTest.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
"$root/tools/scripts/build.sh" "$@"
cd "$build"
ctest --output-on-failure --timeout 900 -j "$(nproc)"
