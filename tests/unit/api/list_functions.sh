#!/usr/bin/env bash
# Prints, one per line and sorted, every function name (ncclX and pncclX)
# that include/nccl.h declares.
#
# The header is run through the C preprocessor first so that comments (which
# mention function names freely) and macros are gone; the remaining text is
# split into declarations at ';' and a declaration counts when it has the
# shape "<ncclResult_t | char* | void> <name>(".
#
# usage: list_functions.sh <c-compiler> <include-dir>
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 <c-compiler> <include-dir>" >&2
  exit 2
fi
cc=$1
incdir=$2

# LOOM_NCCL_NO_CUDA keeps CUDA's own declarations out of the output.
"$cc" -E -P -x c -std=c99 -DLOOM_NCCL_NO_CUDA -I"$incdir" "$incdir/nccl.h" |
  tr '\n' ' ' | tr ';' '\n' |
  sed -nE 's/.*(^|[^A-Za-z0-9_])(ncclResult_t|char|void)[[:space:]*]+(p?nccl[A-Za-z0-9_]+)[[:space:]]*\(.*/\3/p' |
  LC_ALL=C sort -u
