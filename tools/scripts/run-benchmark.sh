#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs an AllReduce
# benchmark with 4 local ranks (host memory on a machine without a GPU).
# Arguments replace the default perf-tool arguments.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
"$root/tools/scripts/build.sh"
args=("$@")
if [ ${#args[@]} -eq 0 ]; then args=(-b 8 -e 128M -f 2); fi
exec "$build/bin/loomrun" -n 4 "$build/bin/all_reduce_perf" "${args[@]}"
