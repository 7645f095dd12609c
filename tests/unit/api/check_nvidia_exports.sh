#!/usr/bin/env bash
# Compares our libnccl.so.2's exports with NVIDIA's, ignoring NVIDIA's
# device-API helpers (ncclTeam*, ncclLsa*, ncclGin*, ncclLLA2A* and their
# p-twins), which loom does not provide. ncclDevCommCreate/Destroy are
# compared: loom exports them (they refuse with an error), with NVIDIA's
# binding. Binding (W/T) counts. Loom's calls from NCCL releases newer than
# NVIDIA's installed one (ncclCommGetUniqueId, ncclCommGrow: 2.30) count
# only where that library has them too.
# Exits 77 (CTest "skipped") when NVIDIA's library is not installed.
#
# usage: check_nvidia_exports.sh <nm> <our libnccl.so.2> <nvidia libnccl.so.2>
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 <nm> <our libnccl.so.2> <nvidia libnccl.so.2>" >&2
  exit 2
fi
nm=$1
ours=$2
theirs=$3

if [[ ! -f $theirs ]]; then
  echo "SKIP: NVIDIA's library $theirs is not installed; nothing to compare with"
  exit 77
fi
if [[ ! -f $ours ]]; then
  echo "FAIL: $ours does not exist; build the 'nccl' target first" >&2
  exit 1
fi

# nccl*/pnccl* exports of a library as "<binding> <name>" lines.
exports() {
  "$nm" -D --defined-only "$1" |
    awk 'NF >= 3 { print $2, $3 } NF == 2 { print $1, $2 }' |
    grep -E ' p?nccl' |
    LC_ALL=C sort -u || true
}
# Ours is not filtered: another device-API name exported by loom is a difference.
their_host=$(exports "$theirs" | grep -vE ' p?nccl(Team|Lsa|Gin|LLA2A)' || true)
our_all=$(exports "$ours")
# Calls of newer NCCL releases than the installed one (2.30's grow) are
# left out of ours when NVIDIA's library does not have them yet.
for newer in ncclCommGetUniqueId ncclCommGrow; do
  if ! grep -qE " p?$newer\$" <<<"$their_host"; then
    our_all=$(grep -vE " p?$newer\$" <<<"$our_all" || true)
  fi
done
if [[ -z $their_host ]]; then
  echo "FAIL: found no nccl* exports in $theirs; is it a libnccl?" >&2
  exit 1
fi

if diff_out=$(diff <(echo "$their_host") <(echo "$our_all")); then
  echo "OK: $(wc -l <<<"$our_all") host-API exports identical to $theirs"
  exit 0
fi
echo "FAIL: host-API exports differ ('<' only in NVIDIA's, '>' only in ours):" >&2
grep '^[<>]' <<<"$diff_out" >&2
exit 1
