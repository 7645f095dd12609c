#!/usr/bin/env bash
# The GPU checks of issue #14, for an offline machine with one NVIDIA GPU
# (nvcc, cmake, ninja, PyTorch 2.x with CUDA; nothing from a package
# registry). Builds for sm_90 into ${BUILD_DIR:-build-gpu}, then runs each
# check under its own timeout and prints one line per check:
#   PASS <check>            FAIL <check> (<why>; log: <file>)
#   SKIP <check>: <why>
# Exits non-zero when any check failed. Logs go to $BUILD_DIR/gpu-check/.
#
#   tools/gpu_check.sh            # everything, about 5 minutes
#   CHECKS="build perf" tools/gpu_check.sh
#   CHECKS=device DEVICE_MODES="latency graph" tools/gpu_check.sh
#
# GoogleTest is optional: without it (no /usr/include/gtest and no
# GTEST_ROOT=<dir with include/ and lib/>) the library, the tools and the
# PyTorch check still run; the tests labelled `gpu` are then skipped.
# tools/scripts/gpu-carry.sh builds it on the build machine into
# .gpu-carry/gtest (ignored by git): copy that folder along with the
# checkout, then run GTEST_ROOT=$PWD/.gpu-carry/gtest tools/gpu_check.sh.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-gpu}"
logs="$build/gpu-check"
checks="${CHECKS:-build tests exports perf procs algos network device torch topo}"
mkdir -p "$logs"
failed=0

want() { [[ " $checks " == *" $1 "* ]]; }
# run <name> <seconds> <command...>: PASS when it exits 0.
run() {
  local name="$1" limit="$2"
  shift 2
  local log="$logs/$name.log" rc=0
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name"
  else
    local why="exit $rc"
    [ "$rc" -eq 124 ] && why="timed out after $limit s"
    echo "FAIL $name ($why; last line: $(tail -n 1 "$log" | cut -c1-160); log: $log)"
    failed=1
  fi
}
# perf <name> <seconds> <command...>: PASS when it exits 0 and every table
# says "Out of bounds values : 0 OK".
perf() {
  local name="$1"
  run "$@"
  local log="$logs/$name.log"
  if ! grep -q "Out of bounds values : 0 OK" "$log" || grep -q "Out of bounds values : [1-9]" "$log"; then
    echo "FAIL $name (wrong elements or no check summary; log: $log)"
    failed=1
  fi
}

command -v nvidia-smi >/dev/null && nvidia-smi -L | sed 's/^/# /'

if want build; then
  gtest=OFF
  extra=()
  if [ -n "${GTEST_ROOT:-}" ]; then
    gtest=ON
    extra+=(-DGTest_ROOT="$GTEST_ROOT")
  elif [ -f /usr/include/gtest/gtest.h ]; then
    gtest=ON
  fi
  # The PyTorch backend too, for this machine's torch (torch-mixed below).
  if python3 -c 'import torch' >/dev/null 2>&1; then
    extra+=(-DLOOM_TORCH_PYTHON="$(command -v python3)")
  fi
  run configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
    -DLOOM_CUDA_ARCHS=90 -DLOOM_BUILD_BENCH=OFF -DLOOM_BUILD_TESTS="$gtest" "${extra[@]}"
  run build 600 cmake --build "$build" -j "$(nproc)"
  [ "$gtest" = ON ] || echo "SKIP tests: GoogleTest is not on this machine (set GTEST_ROOT to bring it)"
fi

if want tests && [ -f "$build/CTestTestfile.cmake" ]; then
  # Label gpu: the device kernels against the host reference, and cuda
  # mode on the emulated device (its CPU part) on this machine too.
  run tests 180 ctest --test-dir "$build" --output-on-failure --no-tests=error -j 4 -L gpu
fi

if want exports; then
  run no-libcuda 30 bash -c "! readelf -d '$build/lib/libnccl.so.2' | grep -E 'libcuda|libcudart'"
fi

bin="$build/bin"
if want perf; then
  # One GPU, 2 ranks as threads, device buffers (cuda mode), checking on.
  perf perf-all_reduce 120 "$bin/all_reduce_perf" -t 2 -b 8 -e 8M -f 8 -c 1 -d all -o all -n 5 -w 1
  perf perf-reduce_scatter 120 "$bin/reduce_scatter_perf" -t 2 -b 8 -e 8M -f 8 -c 1 -d all -o all -n 5 -w 1
  perf perf-all_gather 120 "$bin/all_gather_perf" -t 2 -b 8 -e 8M -f 8 -c 1 -d all -n 5 -w 1
  perf perf-broadcast 120 "$bin/broadcast_perf" -t 2 -b 8 -e 8M -f 8 -c 1 -d all -n 5 -w 1
  perf perf-sendrecv 120 "$bin/sendrecv_perf" -t 2 -b 8 -e 8M -f 8 -c 1 -d all -n 5 -w 1
fi

if want procs; then
  # 4 ranks as processes sharing the GPU, GPU to GPU through CUDA IPC.
  for t in float bfloat16 f8e4m3; do
    perf "procs4-all_reduce-$t" 120 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "$bin/loomrun" -n 4 --timeout 110 -- \
      "$bin/all_reduce_perf" -b 8 -e 32M -f 8 -c 1 -d "$t" -n 5 -w 1
    grep -q "via cudaipc" "$logs/procs4-all_reduce-$t.log" ||
      { echo "FAIL procs4-all_reduce-$t (no connection used cudaipc; log: $logs/procs4-all_reduce-$t.log)"; failed=1; }
  done
fi

if want algos; then
  # Every AllReduce algorithm forced on device buffers (fan-in folds as
  # kernels), 4 ranks as processes over CUDA IPC, avg (pre-multiplied by 1/n).
  for a in direct twoshot tree doubling halving; do
    perf "algo4-all_reduce-$a" 120 env NCCL_ALGO="allreduce:$a" "$bin/loomrun" -n 4 --timeout 110 -- \
      "$bin/all_reduce_perf" -b 8 -e 4M -f 8 -c 1 -o avg -n 5 -w 1
  done
fi

if want network; then
  # The same forced across the network path: no shared memory, no CUDA IPC
  # (pinned host slots over TCP).
  for t in float bfloat16 f8e4m3; do
    perf "network4-all_reduce-$t" 120 env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$bin/loomrun" -n 4 --timeout 110 -- \
      "$bin/all_reduce_perf" -b 8 -e 8M -f 8 -c 1 -d "$t" -n 5 -w 1
  done
fi

if want device; then
  # Stream semantics, graphs, failures and bandwidth on the device
  # (tools/gpu/gpu_stream_check.cc; each prints its figures in its log).
  for mode in ${DEVICE_MODES:-latency graph abort kill bench}; do
    run "device-$mode" 90 "$bin/loom_gpu_stream_check" "$mode"
    grep -E "^$mode: " "$logs/device-$mode.log" | grep -v ": ok$" | sed 's/^/  /'
  done
fi

if want torch; then
  if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    run torch-ddp 180 env LD_PRELOAD="$build/lib/libnccl.so.2" python3 "$root/tools/gpu/ddp_check.py"
    # backend="cpu:loom,cuda:nccl": CPU tensors on loom_torch beside torch's
    # own NCCL for the CUDA ones, in one process (tests/torch).
    if [ -d "$build/python/loom_torch" ]; then
      run torch-mixed 120 python3 "$root/tests/torch/lifecycle_test.py" --package-dir "$build/python" \
        --scenario mixed --ranks 1  # one GPU: NCCL allows one rank per device
    else
      echo "SKIP torch-mixed: loom_torch was not built (no torch at configure time)"
    fi
  else
    echo "SKIP torch-ddp: no PyTorch with CUDA here"
  fi
fi

if want topo; then
  # What loom sees of this GPU machine: the GPU with its PCI path, NVLinks
  # (through NVML), NICs; the picture is kept next to the log.
  run loom-topo 60 "$bin/loom-topo" --dot "$logs/machine.dot" --schedule-dot "$logs/schedule.dot" \
    --dump "$logs/machine.xml"
  if ! grep -qE "^ *gpu " "$logs/loom-topo.log"; then
    echo "FAIL loom-topo-gpu (no GPU in the detected topology; log: $logs/loom-topo.log)"
    failed=1
  fi
  sed -n '1,40p' "$logs/loom-topo.log" | sed 's/^/  /'
  if command -v dot >/dev/null; then dot -Tpng "$logs/machine.dot" -o "$logs/machine.png"; fi
fi
exit "$failed"
