#!/usr/bin/env bash
# Checks the dynamic symbol table of our libnccl.so.2.
#
# Expected, exactly: for every function ncclX declared in include/nccl.h,
# "W ncclX" (weak alias) and "T pncclX" (the definition), "T loomX" for
# every function of include/loom/loom.h, plus
# "T ncclResetDebugInitInternal" (NVIDIA's library exports it too), and
# ncclDevCommCreate/Destroy of the device API (refused). Any other
# defined dynamic symbol -- C++ internals, a missing or extra API function,
# a wrong binding -- fails the test.
#
# usage: check_exports.sh <nm> <c-compiler> <include-dir> <libnccl.so.2>
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 <nm> <c-compiler> <include-dir> <libnccl.so.2>" >&2
  exit 2
fi
nm=$1
cc=$2
incdir=$3
lib=$4
here=$(cd "$(dirname "$0")" && pwd)

if [[ ! -f $lib ]]; then
  echo "FAIL: $lib does not exist; build the 'nccl' target first" >&2
  exit 1
fi

declared=$("$here/list_functions.sh" "$cc" "$incdir")
if [[ -z $declared ]]; then
  echo "FAIL: found no function declarations in $incdir/nccl.h" >&2
  exit 1
fi

# Every plain name needs its p-twin in the header and the other way round.
status=0
plain=$(grep -v '^p' <<<"$declared" || true)
for name in $plain; do
  grep -qx "p$name" <<<"$declared" || { echo "FAIL: nccl.h declares $name but not p$name" >&2; status=1; }
done
for pname in $(grep '^p' <<<"$declared" || true); do
  grep -qx "${pname#p}" <<<"$declared" || { echo "FAIL: nccl.h declares $pname but not ${pname#p}" >&2; status=1; }
done

# loom's extensions (include/loom/loom.h): plain definitions, no twins.
extensions=$("$cc" -E -P -x c -std=c99 -DLOOM_NCCL_NO_CUDA -I"$incdir" "$incdir/loom/loom.h" |
  tr '\n' ' ' | tr ';' '\n' |
  sed -nE 's/.*(^|[^A-Za-z0-9_])ncclResult_t[[:space:]]+(loom[A-Za-z0-9_]+)[[:space:]]*\(.*/\2/p' |
  LC_ALL=C sort -u)
if [[ -z $extensions ]]; then
  echo "FAIL: found no function declarations in $incdir/loom/loom.h" >&2
  exit 1
fi

expected=$({
  for name in $plain; do
    echo "W $name"
    echo "T p$name"
  done
  for name in $extensions; do
    echo "T $name"
  done
  echo "T ncclResetDebugInitInternal"
  # The device API's host entry points that return ncclResult_t (declared in
  # NCCL's nccl_device.h, not nccl.h): refused with an error, src/api/memory.cc.
  for name in ncclDevCommCreate ncclDevCommDestroy; do
    echo "W $name"
    echo "T p$name"
  done
} | LC_ALL=C sort -k2)

# nm prints "<value> <type> <name>"; undefined-value rows have two fields.
actual=$("$nm" -D --defined-only "$lib" |
  awk 'NF >= 3 { print $2, $3 } NF == 2 { print $1, $2 }' | LC_ALL=C sort -k2)

missing=$(LC_ALL=C comm -23 <(sort <<<"$expected") <(sort <<<"$actual"))
extra=$(LC_ALL=C comm -13 <(sort <<<"$expected") <(sort <<<"$actual"))
if [[ -n $missing ]]; then
  echo "FAIL: expected exports absent or with the wrong binding (want W for nccl*, T for pnccl*):" >&2
  # shellcheck disable=SC2001  # indent every line
  sed 's/^/  /' <<<"$missing" >&2
  status=1
fi
if [[ -n $extra ]]; then
  echo "FAIL: unexpected exports (hide them with src/api/exports.map or fix the binding):" >&2
  # shellcheck disable=SC2001  # indent every line
  sed 's/^/  /' <<<"$extra" >&2
  status=1
fi
if [[ $status -eq 0 ]]; then
  echo "OK: $(wc -l <<<"$actual") exports match the $(wc -w <<<"$plain") functions of nccl.h and the $(wc -w <<<"$extensions") of loom/loom.h"
fi
exit $status
