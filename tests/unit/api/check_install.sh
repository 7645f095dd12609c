#!/usr/bin/env bash
# Checks `cmake --install` of the build tree.
#
# Steps (each is one CTest test; "install" is the fixture the others use):
#   install       install into <scratch>/prefix and check that every file
#                 listed in <build>/loom-package/install-expected.txt exists
#   find_package  configure, build and run install_consumer/ against the
#                 prefix with find_package(loom)
#   pkg_config    `pkg-config --cflags --libs nccl` (and loom) through
#                 PKG_CONFIG_PATH, then build and run the consumer with those
#                 flags; exits 77 (CTest "skipped") without pkg-config
#
# usage: check_install.sh <step> <cmake> <build-dir> <scratch-dir> <c-compiler>
set -euo pipefail

if [[ $# -ne 5 ]]; then
  echo "usage: $0 <install|find_package|pkg_config> <cmake> <build-dir> <scratch-dir> <cc>" >&2
  exit 2
fi
step=$1
cmake=$2
build=$3
scratch=$4
cc=$5
here=$(cd "$(dirname "$0")" && pwd)
prefix=$scratch/prefix

# Find the installed library folder (lib, lib64, lib/<triplet>) from the
# package file, so nothing here assumes GNUInstallDirs' choice.
find_libdir() {
  local config
  config=$(find "$prefix" -path '*/cmake/loom/loomConfig.cmake' | head -n 1)
  if [[ -z $config ]]; then
    echo "FAIL: no lib*/cmake/loom/loomConfig.cmake under $prefix; did the install step run?" >&2
    exit 1
  fi
  dirname "$(dirname "$(dirname "$config")")"
}

case $step in
  install)
    rm -rf "$scratch"
    mkdir -p "$scratch"
    "$cmake" --install "$build" --prefix "$prefix"
    expected=$build/loom-package/install-expected.txt
    if [[ ! -f $expected ]]; then
      echo "FAIL: $expected is missing; reconfigure the build" >&2
      exit 1
    fi
    status=0
    count=0
    while IFS= read -r rel; do
      [[ -n $rel ]] || continue
      count=$((count + 1))
      if [[ ! -e $prefix/$rel ]]; then
        echo "FAIL: $rel was not installed" >&2
        status=1
      fi
    done < <(LC_ALL=C sort -u "$expected")
    if grep -q 'libnccl' "$expected" && [[ ! -e $(find_libdir)/libnccl.so.2 ]]; then
      echo "FAIL: libnccl.so.2 (the soname NVIDIA's users load) is not installed" >&2
      status=1
    fi
    [[ $status -eq 0 ]] && echo "OK: all $count expected files installed under $prefix"
    exit $status
    ;;

  find_package)
    libdir=$(find_libdir)
    rm -rf "$scratch/consumer-cmake"
    "$cmake" -S "$here/install_consumer" -B "$scratch/consumer-cmake" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
    "$cmake" --build "$scratch/consumer-cmake"
    LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$scratch/consumer-cmake/consumer"
    echo "OK: find_package(loom) consumer configured, built and ran"
    ;;

  pkg_config)
    if ! command -v pkg-config >/dev/null 2>&1; then
      echo "SKIP: pkg-config is not installed (apt-get install pkgconf)"
      exit 77
    fi
    libdir=$(find_libdir)
    export PKG_CONFIG_PATH="$libdir/pkgconfig"
    for pkg in nccl loom; do
      flags=$(pkg-config --cflags --libs "$pkg")
      echo "pkg-config $pkg: $flags"
      for want in "-I$prefix/include" "-L$libdir" "-l$pkg"; do
        if [[ " $flags " != *" $want "* ]]; then
          echo "FAIL: pkg-config --cflags --libs $pkg lacks '$want'" >&2
          exit 1
        fi
      done
    done
    exe=$scratch/consumer-pkgconfig
    # shellcheck disable=SC2046  # word splitting of the flags is intended
    "$cc" -std=c99 "$here/install_consumer/main.c" $(pkg-config --cflags --libs nccl) -o "$exe"
    LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe"
    echo "OK: pkg-config flags build a working program"
    ;;

  *)
    echo "unknown step '$step'" >&2
    exit 2
    ;;
esac
