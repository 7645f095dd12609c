#!/usr/bin/env bash
# The sanitizer tiers (CI runs them after run-tests.sh):
#   ASan + UBSan: the unit and multi-process tests (not the >2^31-element
#                 one, which needs 6 GiB of plain buffers), build-asan/;
#                 each unit test binary runs once with all its cases
#                 (tests/CMakeLists.txt, loom_unit_tests)
#   TSan:         the tests that run ranks as threads of one process
#                 (cuda mode's on the emulated device too), and the
#                 common primitives' tests (the biased and futex mutexes,
#                 the asymmetric fence), build-tsan/
# Any report fails the run: UBSan is built to abort, ASan and TSan exit
# non-zero. Suppressions, each with its reason, live in
# tools/scripts/sanitizer-suppressions/.
# Usage: run-sanitizers.sh [asan|tsan|all]   (default all)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
which="${1:-all}"
jobs="$(nproc)"
supp="$root/tools/scripts/sanitizer-suppressions"
"$root/tools/scripts/install-deps.sh" --clang

# Host buffers, as in run-tests.sh (auto would mean cuda on a GPU machine).
export LOOM_DEVICE=host

configure() {  # dir sanitizer
  # Clang: the instrumented build compiles in about 60% of g++'s time (the
  # normal build stays on g++, so both compilers check the code).
  # -O0 -g1: the instrumented build compiles in half the time of -O1 (the
  # kernels' templates dominate) and still gives file:line stacks; the tests
  # run a little slower, which costs far less than the compile saves.
  cmake -S "$root" -B "$1" -G Ninja -DLOOM_SANITIZE="$2" -DLOOM_BUILD_BENCH=OFF \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
    -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O0 -g1" -DCMAKE_C_FLAGS_SANITIZE="-O0 -g1" >/dev/null
}

if [ "$which" = all ] || [ "$which" = asan ]; then
  dir="${ASAN_BUILD_DIR:-$root/build-asan}"
  configure "$dir" address,undefined
  cmake --build "$dir" -j "$jobs"
  # allocator_may_return_null: a failed huge allocation must reach loom's
  # own error path (tested), not abort inside ASan.
  export ASAN_OPTIONS="allocator_may_return_null=1:detect_leaks=1:abort_on_error=0:suppressions=$supp/asan.txt"
  export LSAN_OPTIONS="suppressions=$supp/lsan.txt"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # Not the link and install checks: they build outside programs against
  # this (instrumented) library on purpose without the sanitizer runtime.
  (cd "$dir" && ctest --output-on-failure --timeout 900 -j "$jobs" -L "unit|multiproc" -LE large \
     -E '^api_(link|install)')
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
fi

if [ "$which" = all ] || [ "$which" = tsan ]; then
  dir="${TSAN_BUILD_DIR:-$root/build-tsan}"
  configure "$dir" thread
  cmake --build "$dir" -j "$jobs" --target mp_reliability_test mp_comm_test mp_matrix_test mp_failure_test \
    loom_cuda_mode_test loom_cudaipc_test loom_common_test
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.txt"
  # Ranks as threads: the matrix at 2 and 3 ranks, the communicator
  # features, the reliability races, abort from another thread, and cuda
  # mode's progress threads and streams on the emulated device; the locks
  # and fences every call goes through, with threads racing on them.
  (cd "$dir" && ctest --output-on-failure --timeout 900 -j "$jobs" \
     -R '^(mp_reliability_test\.|mp_comm_test\.|mp_matrix_test\..*/n[23](_tcp)?$|mp_failure_test\..*AbortFromAnotherThread|loom_cuda_mode_test\.all$|loom_cudaipc_test\.all$|loom_common_test\.all$)')
  unset TSAN_OPTIONS
fi
