#!/usr/bin/env bash
# Prepares what tools/gpu_check.sh needs on an offline GPU machine and may
# not find there: GoogleTest (for the `gpu`-labelled tests). Run it on the
# build machine (Debian 12, where install-deps.sh puts GoogleTest's source
# in /usr/src/googletest); it builds the static libraries and their CMake
# package into ${CARRY_DIR:-<checkout>/.gpu-carry}/gtest, a folder git
# ignores. Take that folder along with the checkout, then on the GPU machine:
#
#   GTEST_ROOT=$PWD/.gpu-carry/gtest tools/gpu_check.sh
#
# The libraries are x86-64 and work with any g++ at least as new as this
# machine's (12).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# Absolute: CMake would read a relative install prefix from its build folder.
carry="$(realpath -m "${CARRY_DIR:-$root/.gpu-carry}")"
src=/usr/src/googletest
[ -f "$src/CMakeLists.txt" ] || "$root/tools/scripts/install-deps.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake -S "$src" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
  -DBUILD_GMOCK=ON -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$carry/gtest" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null
cmake --build "$work" -j "$(nproc)" >/dev/null
rm -rf "$carry/gtest"
cmake --install "$work" >/dev/null
echo "GoogleTest for the GPU machine: $carry/gtest ($(du -sh "$carry/gtest" | cut -f1))"
