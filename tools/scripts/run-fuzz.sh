#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz: clang + libFuzzer, ASan + UBSan) into
# ${BUILD_DIR:-build-fuzz} and runs each one: first over its regression
# inputs (tests/fuzz/regressions/<target>/), then fuzzing for
# SECONDS_PER_TARGET seconds from a working copy of its seed corpus.
#
#   tools/scripts/run-fuzz.sh [SECONDS_PER_TARGET=30] [extra libFuzzer args...]
#
# FUZZ_TARGETS="hello settings" runs only those, PARALLEL (default: the
# number of CPUs) of them at a time; FUZZ_WORK (default
# $BUILD_DIR/fuzz-work) holds the working corpora, which grow from run to
# run, and the crash files (artifacts/<target>/). JOBS caps the build's
# parallel jobs. Prints one line per target and exits non-zero when any
# target crashed or a regression input fails again.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build-fuzz}"
seconds=30
if [ $# -gt 0 ]; then
  seconds="$1"
  shift
fi
extra=("$@")
work="${FUZZ_WORK:-$build/fuzz-work}"

"$root/tools/scripts/install-deps.sh" --clang

# ---- build ---------------------------------------------------------------------
cmake -S "$root/tests/fuzz" -B "$build" -G Ninja \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}"

# ---- run -----------------------------------------------------------------------
if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=()
  for f in "$root"/tests/fuzz/fuzz_*.cc; do
    name="$(basename "$f" .cc)"
    targets+=("${name#fuzz_}")
  done
fi

# Hangs and runaway memory are failures too: -timeout per input, -rss_limit_mb.
common=(-rss_limit_mb=2048 -timeout=20)

# One target: its regression inputs, then fuzzing. Prints its summary line;
# exits non-zero when it failed.
run_target() {
  local t="$1"
  local bin="$build/fuzz_$t"
  local log="$work/logs/$t.log"
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t" "$work/logs"

  # Every crash found so far, as a test that must keep passing.
  local regressions=()
  if [ -d "$root/tests/fuzz/regressions/$t" ]; then
    while IFS= read -r -d '' f; do regressions+=("$f"); done \
      < <(find "$root/tests/fuzz/regressions/$t" -type f ! -name '*.md' -print0 | sort -z)
  fi
  if [ ${#regressions[@]} -gt 0 ]; then
    if ! "$bin" "${common[@]}" "${regressions[@]}" >"$work/logs/$t.regressions.log" 2>&1; then
      echo "fuzz $t: a regression input fails again; see $work/logs/$t.regressions.log"
      return 1
    fi
  fi

  # Fuzz from the seeds (added to what earlier runs left in the working corpus).
  cp -n "$root/tests/fuzz/corpus/$t/"* "$work/corpus/$t/" 2>/dev/null || true
  rm -f "$work/artifacts/$t/"*
  local start status=0 elapsed execs crashes
  start=$(date +%s)
  "$bin" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/$t/" "${extra[@]}" "$work/corpus/$t" >"$log" 2>&1 || status=$?
  elapsed=$(( $(date +%s) - start ))
  execs="$(grep -m1 '^stat::number_of_executed_units:' "$log" | awk '{print $2}' || true)"
  crashes="$(find "$work/artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) | wc -l)"
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi  # failed without a file: count it
  echo "fuzz $t: ${execs:-0} executions in $elapsed s, $crashes crashes"
  if [ "$crashes" -ne 0 ]; then
    echo "  log: $log; inputs: $work/artifacts/$t/"
    return 1
  fi
}

# The targets run side by side, PARALLEL at a time (default: one per CPU);
# each still gets its full SECONDS_PER_TARGET.
parallel="${PARALLEL:-$(nproc)}"
mkdir -p "$work/logs"
pids=()
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  run_target "$t" >"$work/logs/$t.summary" 2>&1 &
  pids+=("$!")
done
failed=0
for i in "${!targets[@]}"; do
  wait "${pids[$i]}" || failed=1
  cat "$work/logs/${targets[$i]}.summary"
done
exit "$failed"
