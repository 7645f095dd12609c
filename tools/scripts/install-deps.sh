#!/usr/bin/env bash
# Installs what building and testing loom needs on Debian 12 (as root, or
# through sudo). Safe to run again: only missing packages are installed.
#   install-deps.sh           the build and the tests (g++)
#   install-deps.sh --clang   also clang with its sanitizer runtimes and
#                             libFuzzer (the sanitizer and fuzz tiers)
set -euo pipefail

install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
  echo "loom: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

install cmake ninja-build g++ make pkg-config libgtest-dev libgmock-dev libbenchmark-dev \
        iproute2 procps python3 gdb libhwloc-dev graphviz \
        python3-venv python3-dev python3-matplotlib openmpi-bin libibverbs-dev
if [ "${1:-}" = --clang ]; then
  install clang
  # The sanitizer runtimes and libFuzzer come with the compiler-rt of the
  # clang version installed (14 on Debian 12).
  install "libclang-rt-$(clang++ -dumpversion | cut -d. -f1)-dev"
fi
