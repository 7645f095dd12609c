#!/usr/bin/env bash
# Builds link_all_symbols.c, links it to loom's libnccl.so.2 with every
# reference resolved at link and at load time, and runs it.
#
# Modes:
#   loom    build against loom's include/nccl.h: as C99 without any CUDA
#           include path (what host-only users do), and as C++ -- the C++
#           build also once with the CUDA include directory when it exists,
#           which exercises the header's CUDA branch.
#   nvidia  build against NVIDIA's nccl.h (needs its CUDA headers next to
#           it); exits 77 (CTest "skipped") when that header is absent.
#
# usage: check_link.sh <mode> <c-compiler> <c++-compiler> <loom-include-dir>
#          <libnccl.so.2> <cuda-include-dir> <scratch-dir> <expected-version>
set -euo pipefail

if [[ $# -ne 8 ]]; then
  echo "usage: $0 <loom|nvidia> <cc> <cxx> <loom-include-dir> <libnccl.so.2>" \
       "<cuda-include-dir> <scratch-dir> <expected-version>" >&2
  exit 2
fi
mode=$1
cc=$2
cxx=$3
loom_inc=$4
lib=$5
cuda_inc=$6
scratch=$7
expected=$8
here=$(cd "$(dirname "$0")" && pwd)
src=$here/link_all_symbols.c

if [[ ! -f $lib ]]; then
  echo "FAIL: $lib does not exist; build the 'nccl' target first" >&2
  exit 1
fi
libdir=$(cd "$(dirname "$lib")" && pwd)
rm -rf "$scratch"
mkdir -p "$scratch"

# Every function nccl.h declares must be referenced by the program.
missing=0
for name in $("$here/list_functions.sh" "$cc" "$loom_inc" | grep -v '^p'); do
  if ! grep -qE "LOOM_REF\([^,]+, *$name *," "$src"; then
    echo "FAIL: link_all_symbols.c does not reference $name (declared in nccl.h); add a LOOM_REF line" >&2
    missing=1
  fi
done
[[ $missing -eq 0 ]] || exit 1

# Link: all symbols of the program and of libnccl's own dependencies must be
# resolvable (--no-undefined, --no-allow-shlib-undefined). Load: bind
# everything immediately (-z now, LD_BIND_NOW) so a missing symbol fails at
# start, and use DT_RPATH (not RUNPATH) so LD_LIBRARY_PATH cannot substitute
# another libnccl.so.2.
# shellcheck disable=SC2054  # the commas belong to -Wl options
link_flags=(-Wl,--no-undefined -Wl,--no-allow-shlib-undefined -Wl,-z,now
            -Wl,--disable-new-dtags "-Wl,-rpath,$libdir")
common=(-O1 -Wall -Wextra -Wno-deprecated-declarations -I"$here"
        "-DLOOM_EXPECTED_NCCL_VERSION=$expected")

build_and_run() { # <label> <compiler> <flags...>
  local label=$1 compiler=$2
  shift 2
  local exe=$scratch/$label
  echo "== $label: $compiler $*"
  "$compiler" "$@" "${common[@]}" "$src" -x none "$lib" "${link_flags[@]}" -o "$exe"
  LD_BIND_NOW=1 "$exe"
}

case $mode in
  loom)
    build_and_run c99-host-only "$cc" -x c -std=c99 -pedantic -Werror \
      -Werror=incompatible-pointer-types -DLOOM_EXPECT_LOOM_HEADER -I"$loom_inc"
    build_and_run cxx-host-only "$cxx" -x c++ -std=c++17 -Werror \
      -DLOOM_EXPECT_LOOM_HEADER -DLOOM_NCCL_NO_CUDA -I"$loom_inc"
    if [[ -f $cuda_inc/cuda_runtime.h ]]; then
      build_and_run cxx-with-cuda "$cxx" -x c++ -std=c++17 -Werror \
        -DLOOM_EXPECT_LOOM_HEADER -I"$loom_inc" -I"$cuda_inc"
    else
      echo "note: $cuda_inc/cuda_runtime.h absent; CUDA branch of nccl.h not exercised"
    fi
    ;;
  nvidia)
    if [[ ! -f $cuda_inc/nccl.h ]]; then
      echo "SKIP: NVIDIA's header $cuda_inc/nccl.h is not installed"
      exit 77
    fi
    # gnu11: CUDA's headers use anonymous unions, which strict C99 rejects.
    build_and_run c-nvidia-header "$cc" -x c -std=gnu11 \
      -Werror=incompatible-pointer-types -DLOOM_EXPECT_NVIDIA_HEADER -I"$cuda_inc"
    build_and_run cxx-nvidia-header "$cxx" -x c++ -std=c++17 \
      -DLOOM_EXPECT_NVIDIA_HEADER -I"$cuda_inc"
    ;;
  *)
    echo "unknown mode '$mode' (want loom or nvidia)" >&2
    exit 2
    ;;
esac
echo "OK: all builds linked and ran"
