#!/usr/bin/env bash
# The GPU checks of issue #14, for an offline machine with one NVIDIA GPU
# (nvcc, cmake, ninja, PyTorch 2.x with CUDA; nothing from a package
# registry). Builds for sm_90 into ${BUILD_DIR:-build-gpu}, then runs each
# check under its own timeout and prints one line per check:
#   PASS <check>            FAIL <check> (<why>; log: <file>)
#   SKIP <check>: <why>
#   MISS <check> (<why>)    it ran correctly but missed a target (timing)
# Exits non-zero when any check failed. Logs go to ${LOG_DIR:-$BUILD_DIR/gpu-check}.
#
# Everything must fit one device session: BUDGET_S (default 540) seconds
# from the start, after which the remaining checks say SKIP. The checks
# that tell most come first; a 2-rank smoke run gates the long families
# (perf, procs, algos, network), so one systematic hang costs one timeout.
# Every perf-tool check sets LOOM_DEVICE=cuda: a device that does not
# answer fails it, instead of a silent run on host buffers.
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
logs="${LOG_DIR:-$build/gpu-check}"
checks="${CHECKS:-build tests exports device torch topo perf procs algos network}"
budget="${BUDGET_S:-540}"
deadline=$(( $(date +%s) + budget ))
mkdir -p "$logs"
failed=0
bin="$build/bin"

want() { [[ " $checks " == *" $1 "* ]]; }
# run <name> <seconds> <command...>: PASS when it exits 0, MISS when it
# exits 3 (correct, a target missed), else FAIL with the log's tail. The
# limit shrinks to what is left of the budget; none left: SKIP.
run() {
  local name="$1" limit="$2"
  shift 2
  local log="$logs/$name.log" rc=0 left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 15 ]; then
    echo "SKIP $name: out of time (BUDGET_S=$budget)"
    echo "skipped: out of time" >"$log"
    return 2
  fi
  [ "$limit" -gt "$left" ] && limit="$left"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name"
  elif [ "$rc" -eq 3 ]; then
    echo "MISS $name ($(grep -E 'MISS|target' "$log" | tail -n 3 | tr '\n' ' ' | cut -c1-300); log: $log)"
  else
    local why="exit $rc"
    [ "$rc" -eq 124 ] && why="timed out after $limit s"
    echo "FAIL $name ($why; log: $log)"
    tail -n 15 "$log" | sed 's/^/  | /'
    failed=1
  fi
  return "$rc"
}
# perf <name> <seconds> <command...>: run, and FAIL unless every table
# says "Out of bounds values : 0 OK".
perf() {
  local name="$1" rc=0
  run "$@" || rc=$?
  [ "$rc" -eq 2 ] && return 2
  local log="$logs/$name.log"
  if ! grep -q "Out of bounds values : 0 OK" "$log" || grep -q "Out of bounds values : [1-9]" "$log"; then
    [ "$rc" -eq 0 ] && echo "FAIL $name (wrong elements or no check summary; log: $log)"
    failed=1
    return 1
  fi
  return "$rc"
}
# have <check> <file...>: false (with a SKIP line) when a file is missing.
have() {
  local name="$1" f
  shift
  for f in "$@"; do
    if [ ! -e "$f" ]; then
      echo "SKIP $name: $f was not built"
      return 1
    fi
  done
}

command -v nvidia-smi >/dev/null && nvidia-smi -L | sed 's/^/# /'
# Several processes on the one GPU need the default compute mode.
multiproc=1
mode="$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -n 1)"
case "$mode" in
  *Exclusive*|*Prohibited*) multiproc=0; echo "# compute mode $mode: checks with several processes on the GPU are skipped" ;;
esac

if want build; then
  gtest=OFF
  extra=()
  if [ -n "${GTEST_ROOT:-}" ]; then
    gtest=ON
    extra+=(-DGTest_ROOT="$GTEST_ROOT")
  elif [ -f /usr/include/gtest/gtest.h ]; then
    gtest=ON
  fi
  # The PyTorch backend too, for this machine's torch (torch-mixed below),
  # when its Python headers are here to build against.
  if python3 -c 'import torch' >/dev/null 2>&1; then
    pyinc="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    if [ -f "$pyinc/Python.h" ]; then
      extra+=(-DLOOM_TORCH_PYTHON="$(command -v python3)")
    else
      echo "SKIP loom_torch build: no Python.h in $pyinc"
    fi
  fi
  run configure 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
    -DLOOM_CUDA_ARCHS=90 -DLOOM_BUILD_BENCH=OFF -DLOOM_BUILD_TESTS="$gtest" "${extra[@]}"
  # -k 0: one target that fails to build must not keep the others from it.
  run build 420 cmake --build "$build" -j "$(nproc)" -- -k 0
  [ "$gtest" = ON ] || echo "SKIP tests: GoogleTest is not on this machine (set GTEST_ROOT to bring it)"
fi

if want exports && have no-libcuda "$build/lib/libnccl.so.2"; then
  run no-libcuda 30 bash -c "set -o pipefail; ! readelf -d '$build/lib/libnccl.so.2' | grep -E 'libcuda|libcudart'"
fi

if want tests && [ -f "$build/CTestTestfile.cmake" ]; then
  # Label gpu: the device kernels against the host reference, and cuda
  # mode on the emulated device (its CPU part) on this machine too.
  run tests 150 ctest --test-dir "$build" --output-on-failure --no-tests=error -j 4 -L gpu
fi

# The smoke run: 2 ranks as threads, one type and op, checked. The long
# families below run only when it passed.
smoke=0
if have smoke "$bin/all_reduce_perf"; then
  perf smoke-all_reduce 45 env LOOM_DEVICE=cuda "$bin/all_reduce_perf" -t 2 -b 8 -e 1M -f 32 -c 1 -d float -n 2 -w 1 &&
    smoke=1
fi
family() {  # family <check>: wanted, and the smoke run passed
  want "$1" || return 1
  [ "$smoke" -eq 1 ] && return 0
  echo "SKIP $1: the smoke run failed (see smoke-all_reduce above)"
  return 1
}
multi() {  # multi <check>: several processes may share the GPU
  [ "$multiproc" -eq 1 ] && return 0
  echo "SKIP $1: the GPU's compute mode admits one process"
  return 1
}

if want device && have device "$bin/loom_gpu_stream_check"; then
  # Stream semantics, graphs, failures and bandwidth on the device
  # (tools/gpu/gpu_stream_check.cc; each prints its figures in its log).
  for m in ${DEVICE_MODES:-latency graph abort kill bench}; do
    [ "$m" = kill ] && ! multi device-kill && continue
    limit=60
    [ "$m" = bench ] && limit=90
    rc=0
    run "device-$m" "$limit" "$bin/loom_gpu_stream_check" "$m" || rc=$?
    # The figures (a FAIL has shown its log's tail already).
    [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] && grep -E "^$m: " "$logs/device-$m.log" | grep -v ": ok$" | sed 's/^/  /'
  done
fi

if want torch; then
  if ! python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "SKIP torch-ddp: no PyTorch with CUDA here"
  elif multi torch-ddp && have torch-ddp "$build/lib/libnccl.so.2"; then
    # torch's NCCL calls must all resolve in loom's library (a torch built
    # against a newer NCCL may call what loom does not have).
    lib="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so"))')"
    missing=""
    if command -v nm >/dev/null && [ -f "$lib" ]; then
      missing="$(comm -23 <(nm -D --undefined-only "$lib" | awk '{print $NF}' | grep -E '^nccl' | sed 's/@.*//' | sort -u) \
        <(nm -D --defined-only "$build/lib/libnccl.so.2" | awk '{print $NF}' | sed 's/@.*//' | sort -u) | tr '\n' ' ')"
    fi
    if [ -n "$missing" ]; then
      echo "SKIP torch-ddp: this torch calls NCCL functions loom does not export: $missing"
    else
      run torch-ddp 150 env LD_PRELOAD="$build/lib/libnccl.so.2" python3 "$root/tools/gpu/ddp_check.py"
    fi
  fi
  # backend="cpu:loom,cuda:nccl": CPU tensors on loom_torch beside torch's
  # own NCCL for the CUDA ones, in one process (tests/torch).
  if compgen -G "$build/python/loom_torch/_C*.so" >/dev/null; then
    run torch-mixed 90 python3 "$root/tests/torch/lifecycle_test.py" --package-dir "$build/python" \
      --scenario mixed --ranks 1  # one GPU: NCCL allows one rank per device
  else
    echo "SKIP torch-mixed: loom_torch was not built (no torch or no Python.h at configure time)"
  fi
fi

if want topo && have loom-topo "$bin/loom-topo"; then
  # What loom sees of this GPU machine: the GPU with its PCI path, NVLinks
  # (through NVML), NICs; the picture is kept next to the log.
  run loom-topo 45 "$bin/loom-topo" --dot "$logs/machine.dot" --schedule-dot "$logs/schedule.dot" \
    --dump "$logs/machine.xml"
  if grep -qE "^ *gpu " "$logs/loom-topo.log"; then
    echo "PASS loom-topo-gpu"
  elif [ -z "$(ls /sys/bus/pci/devices 2>/dev/null)" ]; then
    echo "SKIP loom-topo-gpu: no /sys/bus/pci here (a sandbox), and NVML did not place the GPU"
  else
    echo "FAIL loom-topo-gpu (no GPU in the detected topology; log: $logs/loom-topo.log)"
    failed=1
  fi
  sed -n '1,40p' "$logs/loom-topo.log" | sed 's/^/  /'
  if command -v dot >/dev/null; then dot -Tpng "$logs/machine.dot" -o "$logs/machine.png"; fi
fi

if family perf; then
  # One GPU, 2 ranks as threads, device buffers (cuda mode), checking on.
  for t in all_reduce reduce_scatter all_gather broadcast sendrecv; do
    have "perf-$t" "$bin/${t}_perf" || continue
    ops=()
    [ "$t" = all_reduce ] || [ "$t" = reduce_scatter ] && ops=(-o all)
    perf "perf-$t" 90 env LOOM_DEVICE=cuda "$bin/${t}_perf" -t 2 -b 8 -e 8M -f 8 -c 1 -d all "${ops[@]}" -n 5 -w 1
  done
fi

if family procs && multi procs && have procs "$bin/loomrun" "$bin/all_reduce_perf"; then
  # 4 ranks as processes sharing the GPU, GPU to GPU through CUDA IPC.
  for t in float bfloat16 f8e4m3; do
    perf "procs4-all_reduce-$t" 60 env LOOM_DEVICE=cuda NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      "$bin/loomrun" -n 4 --timeout 55 -- "$bin/all_reduce_perf" -b 8 -e 32M -f 8 -c 1 -d "$t" -n 5 -w 1
    grep -q "via cudaipc" "$logs/procs4-all_reduce-$t.log" ||
      { echo "FAIL procs4-all_reduce-$t (no connection used cudaipc; log: $logs/procs4-all_reduce-$t.log)"; failed=1; }
  done
fi

if family algos && multi algos && have algos "$bin/loomrun" "$bin/all_reduce_perf"; then
  # Every AllReduce algorithm forced on device buffers (fan-in folds as
  # kernels), 4 ranks as processes over CUDA IPC, avg (pre-multiplied by
  # 1/n). Direct declines messages above 256 KiB (another algorithm would
  # run them), so its sizes stop there.
  for a in direct twoshot tree doubling halving; do
    top=4M
    [ "$a" = direct ] && top=256K
    perf "algo4-all_reduce-$a" 60 env LOOM_DEVICE=cuda NCCL_ALGO="allreduce:$a" "$bin/loomrun" -n 4 \
      --timeout 55 -- "$bin/all_reduce_perf" -b 8 -e "$top" -f 8 -c 1 -o avg -n 5 -w 1
  done
fi

if family network && multi network && have network "$bin/loomrun" "$bin/all_reduce_perf"; then
  # The same forced across the network path: no shared memory, no CUDA IPC
  # (pinned host slots over TCP).
  for t in float bfloat16 f8e4m3; do
    perf "network4-all_reduce-$t" 60 env LOOM_DEVICE=cuda NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      "$bin/loomrun" -n 4 --timeout 55 -- "$bin/all_reduce_perf" -b 8 -e 8M -f 8 -c 1 -d "$t" -n 5 -w 1
  done
fi
exit "$failed"
