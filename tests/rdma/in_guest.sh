#!/usr/bin/env bash
# The rdma tier, run inside the soft-RoCE guest by tests/rdma/guest.sh:
#   in_guest.sh BUILD_DIR
# 1. the transport conformance suite over verbs, with 1 and 3 queue pairs
#    per connection;
# 2. communicators forced onto verbs through the public API, with the
#    device's resource counts checked after destroy and abort, and ranks
#    killed mid-run (the survivors fail naming them);
# 3. all nine perf tools with 2 and 3 ranks (processes, loomrun) forced onto
#    verbs (NCCL_NET=IB NCCL_SHM_DISABLE=1), checking every result, for
#    float, int8 and half, messages up to 1 MiB;
# 4. NCCL_IB_TC's traffic class, NCCL_IB_ADDR_FAMILY's GID and relaxed
#    ordering;
# 5. the port going down under a running job.
# Emulated verbs move tens of MB/s: sizes and counts are kept small. Exits
# non-zero when anything failed, after running everything.
set -uo pipefail
build="$(cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"
tools="$here/../tools"
export LOOM_TIMEOUT_S=120
# ACK timeout 67 ms: a peer that dies is noticed within seconds here.
export NCCL_IB_TIMEOUT=14
failed=()
run() {
  local name="$1"; shift
  local t0=$SECONDS
  echo "== $name"
  if "$@"; then
    echo "== $name: passed ($((SECONDS - t0)) s)"
  else
    echo "== $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
}

echo "== verbs devices"
rdma link show
rdma resource show

run conformance timeout 300 "$build/bin/loom_ib_conformance_test"
run "conformance, 3 queue pairs per connection" env NCCL_IB_QPS_PER_CONNECTION=3 timeout 300 \
  "$build/bin/loom_ib_conformance_test"
run communicators timeout 300 "$build/bin/loom_ib_comm_test"
# A rank killed mid-run: every survivor fails with a remote error naming it
# (multi-process suite's test; with shared memory off the pairs use verbs).
run "killed rank over verbs" env NCCL_NET=IB timeout 300 "$build/bin/mp_failure_test" \
  --gtest_filter='Ranks/KillRank.*_tcp'

for ranks in 2 3; do
  for tool in all_reduce all_gather reduce_scatter broadcast reduce alltoall gather scatter sendrecv; do
    for type in float int8 half; do
      run "${tool}_perf ${ranks} ranks ${type}" timeout 200 python3 "$tools/run_perf_tool.py" \
        --tool "$build/bin/${tool}_perf" --loomrun "$build/bin/loomrun" --procs "$ranks" --timeout 180 \
        --env NCCL_NET=IB --env NCCL_SHM_DISABLE=1 -- -b 8 -e 1M -f 32 -d "$type" -n 2 -w 1 -c 1
    done
  done
done

# NCCL's queue pair settings reach the device: the traffic class it holds
# once connected is NCCL_IB_TC's (RoCE packets carry no service level: rxe
# keeps 0 for NCCL_IB_SL=3, and the log says so), and with
# NCCL_IB_ADDR_FAMILY=AF_INET6 the GID auto-selection finds the guest's
# link-local RoCE v2 GID without falling back (it has no IPv4 one).
# Registrations ask for PCIe relaxed ordering (as every run here does by
# default; rxe takes the flag and has no use for it).
queue_pair_settings() {
  local log
  log="$(NCCL_NET=IB NCCL_SHM_DISABLE=1 NCCL_IB_SL=3 NCCL_IB_TC=106 NCCL_IB_ADDR_FAMILY=AF_INET6 \
    NCCL_IB_PCI_RELAXED_ORDERING=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET,INIT \
    timeout 120 "$build/bin/loomrun" -n 2 "$build/bin/all_reduce_perf" -b 8 -e 64K -f 8 -n 2 -w 1 -c 1 2>&1)" ||
    { echo "$log"; return 1; }
  grep "verbs" <<<"$log"
  ! grep "verbs connection .* ready" <<<"$log" | grep -v -q "traffic class 106" &&
    grep -q "verbs connection .* ready" <<<"$log" && ! grep -q "no GID of" <<<"$log" &&
    grep -q "verbs port rxe0:1 (.* RoCE v2)" <<<"$log" && grep -q "registrations ask for PCIe relaxed ordering: yes" <<<"$log"
}
run "queue pair settings (NCCL_IB_TC=106, NCCL_IB_ADDR_FAMILY=AF_INET6, NCCL_IB_PCI_RELAXED_ORDERING=1)" queue_pair_settings

echo "== device resources at the end (every process has exited)"
rdma resource show

# Last, as it takes the link down: a port that goes down under a running
# job fails it with an error that says so.
port_down() {
  local out=/tmp/port-down.out
  NCCL_NET=IB NCCL_SHM_DISABLE=1 LOOM_TIMEOUT_S=60 timeout 120 "$build/bin/loomrun" -n 2 -- \
    "$build/bin/all_reduce_perf" -b 64K -e 64K -n 1000000 -w 1 >"$out" 2>&1 &
  local job=$!
  sleep 6
  ip link set dummy0 down
  wait $job
  local status=$?
  grep -v '^ ' "$out" | tail -5
  [ $status -ne 0 ] && [ $status -ne 124 ] && grep -q "port rxe0:1 went down" "$out"
}
run "port going down" port_down
if [ ${#failed[@]} -ne 0 ]; then
  echo "rdma tier: ${#failed[@]} failed: ${failed[*]}"
  exit 1
fi
echo "rdma tier: everything passed"
