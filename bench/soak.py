#!/usr/bin/env python3
"""Soak: many small collectives on a few local ranks; does anything grow?

Runs `loom_chaos_rank soak` (tests/chaos) on --ranks processes (default 4)
for --ops random operations each (default 100000: AllReduce, AllGather,
ReduceScatter, Broadcast, Reduce, AlltoAll, Send/Recv and grouped pairs,
mostly <= 64 KiB, sometimes up to 1 MiB, results checked), and prints every
rank's resident memory, open file descriptors and threads after 100 warm-up
operations, half-way (growth that stops by then is not a leak) and at the
end, plus the wall time. A measurement, not a test:
it asserts nothing about the numbers; it exits non-zero only when a rank
failed (an error or a wrong result).

  bench/soak.py --build build                  # build/bin/loom_chaos_rank
  bench/soak.py --rank-bin PATH --ops 2000 --transport tcp
"""
import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

STATS_RE = re.compile(r"^STATS phase=(\w+) rss_kb=(-?\d+) fds=(-?\d+) threads=(-?\d+)$", re.M)
SOAK_RE = re.compile(r"^SOAK ops=(\d+) seconds=([0-9.]+) ops_per_s=([0-9.]+) wrong=(\d+)$", re.M)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory holding bin/loom_chaos_rank")
    ap.add_argument("--rank-bin", help="path of loom_chaos_rank (overrides --build)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--ops", type=int, default=100000, help="operations per rank after 100 warm-up ones")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-bytes", type=int, default=1 << 20, help="largest buffer of the occasional big operation")
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm", help="tcp sets NCCL_SHM_DISABLE=1")
    ap.add_argument("--timeout-s", type=float, default=7200, help="kill the ranks after this long")
    args = ap.parse_args()
    rank_bin = args.rank_bin or os.path.join(args.build, "bin", "loom_chaos_rank")
    if not os.access(rank_bin, os.X_OK):
        ap.error("%s is not an executable (build the loom_chaos_rank target)" % rank_bin)

    env = dict(os.environ)
    env.update({"NCCL_COMM_ID": "127.0.0.1:%d" % free_port(), "LOOM_COMM_SECRET": "soak-%s" % os.urandom(8).hex(),
                "NCCL_SHM_DISABLE": "1" if args.transport == "tcp" else "0", "NCCL_DEBUG": env.get("NCCL_DEBUG",
                                                                                                     "WARN")})
    logdir = tempfile.mkdtemp(prefix="loom-soak-")
    print("soak: %d ranks x %d ops over %s, seed %d, logs in %s" % (args.ranks, args.ops, args.transport, args.seed,
                                                                    logdir), flush=True)
    procs, logs = [], []
    started = time.monotonic()
    for r in range(args.ranks):
        logs.append(os.path.join(logdir, "rank%d.log" % r))
        with open(logs[-1], "wb") as log:
            procs.append(subprocess.Popen([rank_bin, "soak", "rank=%d" % r, "nranks=%d" % args.ranks,
                                           "seed=%d" % args.seed, "ops=%d" % args.ops,
                                           "max_bytes=%d" % args.max_bytes],
                                          stdout=log, stderr=subprocess.STDOUT, env=env))
    failed = False
    for r, p in enumerate(procs):
        try:
            p.wait(max(1.0, started + args.timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            print("rank %d still running after %.0f s: killed" % (r, args.timeout_s))
            for q in procs:
                q.kill()
            p.wait()
        failed |= p.returncode != 0
    wall = time.monotonic() - started

    print("%-4s  %10s %8s %8s %8s  %7s %5s  %7s %5s  %8s  %s" % ("rank", "rss_kb:pre", "half", "post", "delta",
                                                                "fds:pre", "post", "thr:pre", "post", "ops/s",
                                                                "status"))
    for r, p in enumerate(procs):
        with open(logs[r], errors="replace") as f:
            out = f.read()
        stats = {m[0]: [int(x) for x in m[1:]] for m in STATS_RE.findall(out)}
        soak = SOAK_RE.search(out)
        pre, half, post = (stats.get(k, [-1] * 3) for k in ("before", "half", "after"))
        status = "ok" if p.returncode == 0 else "FAILED (exit %s)" % p.returncode
        print("%-4d  %10d %8d %8d %+8d  %7d %5d  %7d %5d  %8s  %s"
              % (r, pre[0], half[0], post[0], post[0] - pre[0], pre[1], post[1], pre[2], post[2],
                 soak.group(3) if soak else "-", status))
        if p.returncode != 0:
            tail = [line for line in out.splitlines() if line.startswith(("RESULT", "WRONG", "STATS"))][-5:]
            print("\n".join("      | " + line for line in tail))
    print("wall time %.1f s" % wall)
    if failed:
        print("logs kept in %s" % logdir)
    else:
        shutil.rmtree(logdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
