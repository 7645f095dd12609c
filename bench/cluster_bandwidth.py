#!/usr/bin/env python3
"""AllReduce across "hosts" of a network-namespace cluster against iperf3
over the same link, alternating A B A B in one run (needs root, iperf3).

  shaped    2 hosts x 2 ranks, each host's eth0 shaped to 1 Gbit/s (tc tbf,
            both directions): AllReduce busbw at 64 MiB against iperf3's
            goodput with as many streams as loom opens per connection (2).
  unshaped  2 hosts x 1 rank on plain veth: AllReduce busbw at 16-256 MiB
            against iperf3's goodput with 2 streams, and the 8-byte time.

Prints each round and the median of the per-round ratios.

  bench/cluster_bandwidth.py --build build --mode shaped --rounds 3
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "cluster"))
from cluster_test import Cluster, rank_env, remove_stale_namespaces  # noqa: E402

STREAMS = 2  # loom's sockets per connection (LinkOptions::socketsPerPeer)


def iperf(cluster, seconds):
    """TCP goodput host 0 -> host 1 in bytes/s."""
    server = subprocess.Popen(["ip", "netns", "exec", cluster.hosts[1], "iperf3", "-s", "-1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    try:
        out = subprocess.run(["ip", "netns", "exec", cluster.hosts[0], "iperf3", "-c", cluster.addrs[1], "-P",
                              str(STREAMS), "-t", str(seconds), "-J"], capture_output=True, text=True, timeout=60)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8
    finally:
        server.kill()
        server.wait()


def allreduce(cluster, build, per_host, size, iters):
    """(time us, busbw bytes/s) of an out-of-place float AllReduce of `size`."""
    n = len(cluster.hosts) * per_host
    procs = []
    secret = os.urandom(8).hex()
    for r in range(n):
        env = rank_env(cluster, r // per_host, secret,
                       {"LOOM_RANK": str(r), "LOOM_WORLD_SIZE": str(n), "LOOM_LOCAL_RANK": str(r % per_host)}, 29600)
        cmd = ["ip", "netns", "exec", cluster.hosts[r // per_host], os.path.join(build, "bin", "all_reduce_perf"),
               "-b", str(size), "-e", str(size), "-n", str(iters), "-w", "2", "-c", "0", "-d", "float"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for line in outs[0].splitlines():
        f = line.split()
        if len(f) >= 8 and f[0] == str(size) and f[2] == "float":
            return float(f[5]), float(f[7]) * 1e9
    raise RuntimeError("no result row from rank 0:\n" + outs[0][-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--mode", choices=["shaped", "unshaped"], required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    remove_stale_namespaces()
    per_host = 2 if args.mode == "shaped" else 1
    sizes = [64 << 20] if args.mode == "shaped" else [16 << 20, 64 << 20, 256 << 20]
    with Cluster(2) as cluster:
        if args.mode == "shaped":
            for ns in cluster.hosts:
                subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "1gbit",
                                "burst", "256kb", "latency", "50ms"], check=True)
        ratios = {s: [] for s in sizes}
        for rnd in range(args.rounds):
            goodput = iperf(cluster, 5)
            print("round %d: iperf3 -P %d goodput %.3f GB/s" % (rnd + 1, STREAMS, goodput / 1e9), flush=True)
            for size in sizes:
                iters = 5 if size >= (64 << 20) else 10
                us, busbw = allreduce(cluster, args.build, per_host, size, iters)
                ratios[size].append(busbw / goodput)
                print("round %d: AllReduce %d MiB, %d hosts x %d: %.0f us, busbw %.3f GB/s = %.3f x iperf3"
                      % (rnd + 1, size >> 20, 2, per_host, us, busbw / 1e9, busbw / goodput), flush=True)
        if args.mode == "unshaped":
            us = [allreduce(cluster, args.build, per_host, 8, 2000)[0] for _ in range(3)]
            print("AllReduce 8 B across the veth: %s us (median %.1f)" % (us, statistics.median(us)))
        for size in sizes:
            print("median ratio busbw / iperf3 goodput at %d MiB: %.3f (rounds %s)"
                  % (size >> 20, statistics.median(ratios[size]), ["%.3f" % x for x in ratios[size]]))


if __name__ == "__main__":
    main()
