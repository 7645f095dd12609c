#!/usr/bin/env python3
"""Several "hosts" on one machine: a cluster of network namespaces.

Each host is a network namespace with its own eth0, joined to the others
by a veth pair into a switch namespace holding a bridge; host i has the
address 10.213.0.(i+1)/24. Its ranks are plain processes started with
`ip netns exec`, each in a UTS namespace of its own whose hostname is the
host's name, with NCCL_HOSTID set to it and NCCL_COMM_ID pointing at host
0's address. Everything (processes, namespaces) is removed at the end, also
when a check fails or the script is interrupted; namespaces left by a
harness that was killed are removed by the next run.

Tests (one per run; standard library only; needs root and iproute2):
  suite     every rank runs loom_mp_rank's checked suite of collectives. The
            logs must show shared memory between ranks of one host and TCP
            across hosts, and every ring of the schedule must enter and
            leave each host once.
  linkdrop  ranks loop over collectives; once they run, host 1's link gets
            100% loss (tc netem; where the kernel lacks netem, the switch's
            port to host 1 goes down): TCP itself reports nothing. With
            LOOM_TIMEOUT_S=20 every rank must fail with ncclRemoteError
            within 30 s; host 1's ranks must name a rank of another host,
            the other ranks a rank of host 1.
  deterministic
            LOOM_DETERMINISTIC=1: the same 4 ranks (rank r with the same
            order-sensitive float, half and bfloat16 inputs) as 1 host x 4,
            2 x 2 and 4 x 1 run AllReduce, ReduceScatter and Reduce
            (loom_mp_rank digest); every layout must give each rank the same
            bits (AllReduce: every rank alike). Without the mode, 1 x 4 and
            2 x 2 must differ somewhere (so the check can fail).
            --hosts/--ranks-per-host are not used.
  init      (a measurement, not in CI) all ranks start at once and init
            one communicator; prints the init time of every rank (median,
            max) and the bootstrap traffic of the busiest rank, e.g. 64
            ranks on 4 hosts: --test init --hosts 4 --ranks-per-host 16.

  cluster_test.py --rank-bin build/bin/loom_mp_rank --test suite --hosts 3 --ranks-per-host 2

Exit status: 0 passed, 1 failed, 77 skipped (not root, or no network
namespaces here), 2 bad usage.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

SKIP = 77
PREFIX_RE = re.compile(r"^lm(\d+)(sw|h\d+)$")


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check, capture_output=True, text=True)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_stale_namespaces():
    """Namespaces of an earlier harness that was killed: its pid is gone, or
    reused by this one (which has created none yet)."""
    listed = ip("netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        m = PREFIX_RE.match(name)
        if m and (int(m.group(1)) == os.getpid() or not pid_alive(int(m.group(1)))):
            ip("netns", "del", name, check=False)


class Cluster:
    """N hosts on a bridge; a context manager that always tears down."""

    def __init__(self, hosts):
        self.prefix = "lm%d" % os.getpid()
        self.switch = self.prefix + "sw"
        self.hosts = ["%sh%d" % (self.prefix, i) for i in range(hosts)]
        self.addrs = ["10.213.0.%d" % (i + 1) for i in range(hosts)]
        self.procs = []

    def __enter__(self):
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.hosts):
                ip("netns", "add", ns)
                port = "p%d" % i
                ip("link", "add", port, "netns", self.switch, "type", "veth", "peer", "name", "eth0", "netns", ns)
                ip("-n", self.switch, "link", "set", port, "master", "br0")
                ip("-n", self.switch, "link", "set", port, "up")
                ip("-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc):
        self.destroy()

    def start(self, host, argv, env, log_path):
        """A process on `host`, in a UTS namespace named after the host."""
        wrapper = ["ip", "netns", "exec", self.hosts[host], "unshare", "--uts", "sh", "-c",
                   'hostname "$0" && exec "$@"', self.hosts[host]] + argv
        log = open(log_path, "wb")
        p = subprocess.Popen(wrapper, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        log.close()
        p.log_path = log_path
        self.procs.append(p)
        return p

    def destroy(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.hosts + [self.switch]:
            ip("netns", "del", ns, check=False)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


class Checks:
    def __init__(self):
        self.failures = []

    def expect(self, ok, what):
        if not ok:
            self.failures.append(what)
            print("FAIL: " + what, flush=True)
        return ok


def rank_env(cluster, host, secret, extra, port=29500):
    """A rank's environment on `host`: the rendezvous at host 0, its host id."""
    env = dict(os.environ)
    env.update({"NCCL_COMM_ID": "%s:%d" % (cluster.addrs[0], port), "LOOM_COMM_SECRET": secret,
                "NCCL_HOSTID": cluster.hosts[host], "NCCL_SOCKET_IFNAME": "eth0", "LOOM_DEVICE": "host",
                "LOOM_INIT_TIMEOUT_S": "60"})
    env.update(extra)
    return env


def start_ranks(cluster, args, scenario, extra_args, extra_env, logdir):
    n = args.hosts * args.ranks_per_host
    secret = "cluster-%s" % os.urandom(8).hex()
    procs = []
    for r in range(n):
        host = r // args.ranks_per_host
        argv = [args.rank_bin, scenario, "rank=%d" % r, "nranks=%d" % n] + extra_args
        procs.append(cluster.start(host, argv, rank_env(cluster, host, secret, extra_env),
                                   os.path.join(logdir, "rank%d.log" % r)))
    return procs


def wait_all(procs, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    return all(p.poll() is not None for p in procs)


def test_suite(args, cluster, logdir, checks):
    n, per = args.hosts * args.ranks_per_host, args.ranks_per_host
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,TUNING", "LOOM_TIMEOUT_S": "60"}
    if args.algo:
        # Tree also runs Broadcast and Reduce (on the topology's trees, hung
        # from their roots).
        kinds = ["allreduce", "broadcast", "reduce"] if args.algo == "tree" else ["allreduce"]
        env["NCCL_ALGO"] = ";".join("%s:%s" % (k, args.algo) for k in kinds)
    procs = start_ranks(cluster, args, "suite", [], env, logdir)
    if not checks.expect(wait_all(procs, 120), "the suite did not end within 120 s"):
        return
    kinds = {"shm": 0, "tcp": 0}
    for r, p in enumerate(procs):
        out = read(p.log_path)
        checks.expect(p.returncode == 0 and "RESULT code=0" in out,
                      "rank %d: exit %s\n%s" % (r, p.returncode, "\n".join(out.splitlines()[-15:])))
        for peer, kind in re.findall(r"connection to rank (\d+) \(host \S+, pid \d+\) on channel \d+ via (\w+)", out):
            peer = int(peer)
            if peer == r:
                continue
            want = "shm" if peer // per == r // per else "tcp"
            checks.expect(kind == want, "rank %d reaches rank %d via %s, expected %s" % (r, peer, kind, want))
            kinds[kind] = kinds.get(kind, 0) + 1
    checks.expect(kinds["shm"] > 0 and kinds["tcp"] > 0, "connections seen: %s" % kinds)
    rings = re.findall(r"Channel \d+/\d+ :((?: +\d+)+)", read(procs[0].log_path))
    checks.expect(len(rings) > 0, "rank 0 logged no ring (NCCL_DEBUG_SUBSYS=GRAPH)")
    for ring in rings:
        order = [int(x) for x in ring.split()]
        checks.expect(sorted(order) == list(range(n)), "ring %s is not a permutation of the ranks" % order)
        crossings = sum(order[i] // per != order[(i + 1) % n] // per for i in range(n))
        checks.expect(crossings == args.hosts, "ring %s crosses host boundaries %d times, expected %d"
                      % (order, crossings, args.hosts))
    # With NCCL_ALGO, every AllReduce of the suite takes the algorithm it names.
    chosen = re.findall(r"AllReduce of (\d+) bytes on \d+ ranks \(net\): (\w+)", read(procs[0].log_path))
    if args.algo:
        checks.expect(len(chosen) >= 3 and all(a == args.algo for _, a in chosen),
                      "AllReduce choices %s, NCCL_ALGO names %s" % (chosen, args.algo))
    print("suite: %d hosts x %d ranks: every rank's checked collectives passed; connections %s; rings %s; "
          "AllReduce algorithms %s" % (args.hosts, per, kinds, [r.split() for r in rings], sorted(set(chosen))),
          flush=True)


def test_linkdrop(args, cluster, logdir, checks):
    n, per = args.hosts * args.ranks_per_host, args.ranks_per_host
    procs = start_ranks(cluster, args, "loop", ["count=4096", "limit_s=90", "agree=1"],
                        {"LOOM_TIMEOUT_S": "20", "NCCL_DEBUG": "WARN"}, logdir)
    joined = time.monotonic() + 60
    while time.monotonic() < joined and not all("INIT ok" in read(p.log_path) for p in procs):
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    if not checks.expect(all("INIT ok" in read(p.log_path) for p in procs), "not every rank joined"):
        return
    time.sleep(1.0)
    t_drop = time.monotonic()
    # 100% loss on host 1's link where the kernel has netem; else the
    # switch's port to host 1 goes down. Either way TCP is told nothing.
    how = "tc netem loss 100% on host 1's eth0"
    if subprocess.run(["tc", "-n", cluster.hosts[1], "qdisc", "add", "dev", "eth0", "root", "netem", "loss", "100%"],
                      capture_output=True).returncode != 0:
        how = "the switch's port to host 1 set down (no netem in this kernel)"
        ip("-n", cluster.switch, "link", "set", "p1", "down")
    ended = wait_all(procs, 40)
    took = time.monotonic() - t_drop
    checks.expect(ended, "ranks still running 40 s after the link dropped")
    for r, p in enumerate(procs):
        out = read(p.log_path)
        m = re.search(r"^RESULT code=(\d+) seconds=[0-9.]+ step=\d+ error=(.*)$", out, re.M)
        if not checks.expect(m is not None, "rank %d printed no RESULT\n%s" % (r, "\n".join(out.splitlines()[-10:]))):
            continue
        code, error = int(m.group(1)), m.group(2)
        checks.expect(code == 6, "rank %d: code %d, expected ncclRemoteError (6): %s" % (r, code, error[:300]))
        # Host 1's ranks must name a rank elsewhere; the others, one on host 1.
        wanted = [h for h in cluster.hosts if h != cluster.hosts[1]] if r // per == 1 else [cluster.hosts[1]]
        checks.expect(any("host %s" % h in error for h in wanted), "rank %d's error names no rank of %s: %s"
                      % (r, " or ".join(wanted), error[:400]))
    checks.expect(took <= 31, "the last rank ended %.1f s after the link dropped (bound 30 s)" % took)
    print("linkdrop: %d hosts x %d ranks, %s: every rank ended %.1f s after the drop" % (args.hosts, per, how, took),
          flush=True)


def test_init(args, cluster, logdir, checks):
    n = args.hosts * args.ranks_per_host
    procs = start_ranks(cluster, args, "init", [], {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT",
                                                    "LOOM_TIMEOUT_S": "60"}, logdir)
    if not checks.expect(wait_all(procs, 180), "the ranks did not end within 180 s"):
        return
    times, traffic = [], []
    for r, p in enumerate(procs):
        out = read(p.log_path)
        m = re.search(r"^INIT ok seconds=([0-9.]+)", out, re.M)
        if not checks.expect(p.returncode == 0 and m is not None, "rank %d: exit %s\n%s"
                             % (r, p.returncode, "\n".join(out.splitlines()[-10:]))):
            continue
        times.append(float(m.group(1)))
        t = re.search(r"bootstrap sent (\d+) messages \((\d+) bytes\), received (\d+) \((\d+) bytes\)", out)
        if t:
            traffic.append(tuple(int(x) for x in t.groups()))
    if times:
        times.sort()
        busiest = max(traffic, key=lambda t: t[0] + t[2]) if traffic else None
        print("init: %d hosts x %d ranks = %d processes: init median %.3f s, max %.3f s; busiest rank's bootstrap: "
              "%s" % (args.hosts, args.ranks_per_host, n, times[len(times) // 2], times[-1],
                      "sent %d messages (%d B), received %d (%d B)" % busiest if busiest else "not logged"),
              flush=True)


def test_deterministic(args, logdir, checks):
    digests = {}  # layout -> {rank: {case: hash}}
    for hosts, per, mode in ((1, 4, "1"), (2, 2, "1"), (4, 1, "1"), (1, 4, "0"), (2, 2, "0")):
        layout = "%dx%d%s" % (hosts, per, "" if mode == "1" else " without the mode")
        run = argparse.Namespace(**vars(args))
        run.hosts, run.ranks_per_host = hosts, per
        os.makedirs(os.path.join(logdir, layout.replace(" ", "_")), exist_ok=True)
        with Cluster(hosts) as cluster:
            procs = start_ranks(cluster, run, "digest", [], {"LOOM_DETERMINISTIC": mode, "LOOM_TIMEOUT_S": "60"},
                                os.path.join(logdir, layout.replace(" ", "_")))
            if not checks.expect(wait_all(procs, 180), "%s: the ranks did not end within 180 s" % layout):
                return
        digests[layout] = {}
        for r, p in enumerate(procs):
            out = read(p.log_path)
            checks.expect(p.returncode == 0 and "RESULT code=0" in out,
                          "%s rank %d: exit %s\n%s" % (layout, r, p.returncode, "\n".join(out.splitlines()[-10:])))
            digests[layout][r] = dict(re.findall(r"^DIGEST (\S+) ([0-9a-f]+)$", out, re.M))
    free = [digests.pop(k) for k in list(digests) if "without" in k]
    checks.expect(free[0] != free[1], "without LOOM_DETERMINISTIC, 1x4 and 2x2 gave the same bits: the check "
                  "cannot tell (inputs not order-sensitive?)")
    layouts = list(digests)
    ref = digests[layouts[0]]
    cases = 0
    for layout in layouts[1:]:
        for r in range(4):
            checks.expect(digests[layout][r] == ref[r] and ref[r],
                          "%s rank %d differs from %s: %s" % (layout, r, layouts[0],
                                                             sorted(set(digests[layout][r].items()) ^ set(ref[r].items()))[:4]))
            cases += len(digests[layout][r])
    for r in range(1, 4):
        mine = {k: v for k, v in ref[r].items() if k.startswith("allreduce/")}
        checks.expect(mine and mine == {k: v for k, v in ref[0].items() if k.startswith("allreduce/")},
                      "AllReduce bits differ between rank 0 and rank %d" % r)
    print("deterministic: layouts %s gave the same bits for %d results" % (", ".join(layouts), cases), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank-bin", required=True, help="path of loom_mp_rank")
    ap.add_argument("--test", choices=["suite", "linkdrop", "init", "deterministic"], required=True)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=2)
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--algo", help="suite: NCCL_ALGO for AllReduce (allreduce:NAME; tree: Broadcast and Reduce too)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: network namespaces need root")
        return SKIP
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        print("SKIP: 'ip netns' does not work here")
        return SKIP
    if args.test == "linkdrop" and subprocess.run(["which", "tc"], capture_output=True).returncode != 0:
        print("SKIP: no tc (iproute2) here")
        return SKIP
    remove_stale_namespaces()
    logdir = "/tmp/loom-cluster-%d" % os.getpid()
    os.makedirs(logdir, exist_ok=True)
    checks = Checks()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))  # unwinds through Cluster.__exit__
    if args.test == "deterministic":
        test_deterministic(args, logdir, checks)
    else:
        with Cluster(args.hosts) as cluster:
            {"suite": test_suite, "linkdrop": test_linkdrop, "init": test_init}[args.test](args, cluster, logdir, checks)
    if checks.failures or args.keep_logs:
        print("logs in %s" % logdir)
    else:
        subprocess.run(["rm", "-rf", logdir])
    print("CLUSTER %s" % ("FAILED" if checks.failures else "PASSED"))
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
