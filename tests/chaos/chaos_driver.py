#!/usr/bin/env python3
"""The chaos driver: kill a random rank of a running job, and abort blocked
calls, and check that everything ends cleanly. Standard library only.

Kill rounds (each one bounded): 2-5 ranks of `loom_chaos_rank mix` on a
fresh NCCL_COMM_ID port and LOOM_COMM_SECRET, over shared memory or TCP
(NCCL_SHM_DISABLE), run a random mix of collectives, groups and splits of
0..8 MiB. Once all have joined, after 0-3 s, one running rank gets SIGKILL.
Every survivor must return an error naming the dead rank ("rank K") within
--bound-s of the kill and exit; a survivor still running then is a hang: its
stacks are dumped (gdb) and it is killed. Afterwards no process of the round
may be left, and no new /dev/shm entry or listening socket.

Shrink rounds (--shrink-rounds): 4 ranks (--shrink-ranks) of `loom_chaos_rank
shrink` run random collectives; one chosen rank gets SIGKILL; the others must
shrink it away (ncclCommShrink with NCCL_SHRINK_ABORT, or ncclCommRevoke then
NCCL_SHRINK_DEFAULT) and run one checked operation of every kind on the new
communicator, all within --bound-s of the kill. The report gives kill ->
first correct collective on the shrunk communicator (the last survivor's).

Abort test: `loom_chaos_rank abort` (100 tries of ncclCommAbort from another
thread while an AllReduce is blocked).

The report gives the distributions (kill -> failing call returns, kill ->
exit, abort times) in lines meant to be copied into a note. Exit status 0
when every check passed, 1 otherwise, 2 for bad usage.

  chaos_driver.py --rank-bin build/bin/loom_chaos_rank [--rounds N] [--seed S]
  chaos_driver.py --rank-bin ... --round-seed X      # replay one round
"""
import argparse
import collections
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

NCCL_CODES = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
              4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}
REMOTE_ERROR = 6
RESULT_RE = re.compile(r"^RESULT code=(-?\d+) t=([0-9.]+) op=(-?\d+) desc=(\S+) error=(.*)$", re.M)
INIT_TIMEOUT_S = 30     # all ranks must have joined by then
RANK_LIMIT_S = 40       # a mix rank that is never killed stops by itself
GDB_TIMEOUT_S = 30

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_driver():
    """In the child before exec: SIGKILL when the driver dies (PR_SET_PDEATHSIG),
    so that a driver killed by a CTest timeout leaves no rank behind."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def quantiles(values):
    """'n=.. min=.. median=.. p90=.. max=..' (nearest rank), or 'n=0'."""
    if not values:
        return "n=0"
    v = sorted(values)

    def q(p):
        return v[max(0, min(len(v) - 1, int(-(-p * len(v) // 1)) - 1))]
    return "n=%d min=%.3f median=%.3f p90=%.3f max=%.3f" % (len(v), v[0], q(0.5), q(0.9), v[-1])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_entries():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def hex_address(addr):
    """/proc/net/tcp's little-endian hex IPv4 address as a dotted quad (IPv6
    ones stay hex)."""
    if len(addr) != 8:
        return addr
    return ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0))


def listen_sockets():
    """{inode: 'addr:port'} of the TCP sockets in LISTEN state (IPv4 and IPv6)."""
    found = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A":
                addr, port = fields[1].rsplit(":", 1)
                found[fields[9]] = "%s:%d" % (hex_address(addr), int(port, 16))
    return found


def proc_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def socket_owners(inode):
    """Pids holding socket `inode` open."""
    target, owners = "socket:[%s]" % inode, []
    for pid in proc_pids():
        try:
            for fd in os.listdir("/proc/%d/fd" % pid):
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == target:
                    owners.append(pid)
                    break
        except OSError:
            continue
    return owners


def pids_with_secret(secret):
    """Live processes whose environment carries this round's secret: ours,
    even when reparented."""
    needle, pids = ("LOOM_COMM_SECRET=%s\0" % secret).encode(), []
    for pid in proc_pids():
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if needle in f.read() + b"\0":
                    with open("/proc/%d/stat" % pid) as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            pids.append(pid)
        except OSError:
            continue
    return pids


def dump_stacks(pid):
    """All threads' stacks of `pid` (gdb when installed, else kernel wait
    channels), as text."""
    out = ["---- stacks of pid %d ----" % pid]
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                                "-ex", "thread apply all bt"], capture_output=True, text=True,
                               timeout=GDB_TIMEOUT_S)
            out.append(r.stdout.strip())
            if r.returncode != 0 or "Thread" not in r.stdout:
                out.append("(gdb exit %d) %s" % (r.returncode, r.stderr.strip()[-2000:]))
        except subprocess.TimeoutExpired:
            out.append("(gdb did not finish within %d s)" % GDB_TIMEOUT_S)
    else:
        out.append("(gdb not installed; kernel wait channels per thread)")
        try:
            for tid in sorted(os.listdir("/proc/%d/task" % pid), key=int):
                with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                    out.append("thread %s: %s" % (tid, f.read()))
        except OSError as e:
            out.append("(cannot read /proc/%d/task: %s)" % (pid, e))
    return "\n".join(out)


def read_log(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def tail(text, lines=15):
    return "\n".join("      | " + line for line in text.strip().splitlines()[-lines:])


class Report:
    """Everything measured and every problem found, over all rounds."""

    def __init__(self, bound_s):
        self.bound_s = bound_s
        self.rounds = self.killed = self.all_done_before_kill = 0
        self.by_n = collections.Counter()
        self.by_transport = collections.Counter()
        self.survivors = self.errored = self.done_before_kill = self.done_after_kill = 0
        self.kill_to_error = collections.defaultdict(list)  # transport -> seconds
        self.kill_to_exit = []
        self.abort_after_error = []
        self.codes = collections.Counter()
        self.named_rank = self.named_pid = self.named_host = self.named_child_rank = 0
        self.problems = collections.defaultdict(list)  # kind -> descriptions
        self.notes = []
        self.abort_summary = None
        self.abort_tries = []
        self.abort_error = None
        self.foreign_sockets = 0
        self.shrink_rounds = 0
        self.kill_to_shrunk = []  # per round: the last survivor's first correct operation
        self.shrink_calls = []    # each survivor's ncclCommShrink time

    def problem(self, kind, text):
        self.problems[kind].append(text)
        print("  PROBLEM [%s] %s" % (kind, text), flush=True)

    def failed(self):
        return any(self.problems.values())


class Ranks:
    """The processes of one job, with their logs."""

    def __init__(self, rank_bin, argv_for, n, env, logdir, tag):
        self.logs = [os.path.join(logdir, "%s.rank%d.log" % (tag, r)) for r in range(n)]
        self.procs, self.exit_time = [], [None] * n
        for r in range(n):
            with open(self.logs[r], "wb") as log:
                self.procs.append(subprocess.Popen([rank_bin] + argv_for(r), stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, env=env,
                                                   preexec_fn=_die_with_driver))

    def poll(self):
        """Notes the exit time of ranks that ended; returns the running ones."""
        running = []
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                running.append(r)
            elif self.exit_time[r] is None:
                self.exit_time[r] = time.monotonic()
        return running

    def log(self, r):
        return read_log(self.logs[r])

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def wait_until(deadline, done, step=0.01):
    while not done() and time.monotonic() < deadline:
        time.sleep(step)
    return done()


def round_env(args, secret, port, shm_disable):
    env = dict(os.environ)
    env.update({"NCCL_COMM_ID": "127.0.0.1:%d" % port, "LOOM_COMM_SECRET": secret,
                "NCCL_SHM_DISABLE": shm_disable, "LOOM_TIMEOUT_S": "60",
                "LOOM_INIT_TIMEOUT_S": str(INIT_TIMEOUT_S), "NCCL_DEBUG": "WARN"})
    return env


def check_leftovers(rep, label, secret, shm_before, listen_before, port):
    """No process carrying the secret, no new /dev/shm entry, no new
    listening socket owned by us (or by nobody) may remain."""
    left = pids_with_secret(secret)
    if left:
        rep.problem("leftover", "%s: processes still alive: %s" % (label, left))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    new_shm = shm_entries() - shm_before
    if new_shm:
        time.sleep(0.5)  # another program's short-lived entry would be gone by now
        new_shm &= shm_entries()
    if new_shm:
        rep.problem("leftover", "%s: new /dev/shm entries: %s" % (label, sorted(new_shm)))
    for inode, addr in listen_sockets().items():
        if inode in listen_before:
            continue
        owners = socket_owners(inode)
        if not owners:  # closed meanwhile by a program that just ended?
            time.sleep(0.2)
            if inode not in listen_sockets():
                continue
            owners = socket_owners(inode)
        ours = [p for p in owners if p in left]
        if ours or not owners or addr.endswith(":%d" % port):
            rep.problem("leftover", "%s: new listening socket %s (owners %s)" % (label, addr, owners or "none"))
        else:
            rep.foreign_sockets += 1  # e.g. tests running beside us


def handle_hangs(rep, ranks, label, running, t_ref, what):
    """Dumps the stacks of the ranks in `running` that still run, then kills
    every rank. Returns the ranks that were hung (one that ended while
    another's stacks were dumped is only late: check_survivor judges it)."""
    hung = []
    for r in running:
        if ranks.procs[r].poll() is not None:
            continue
        pid = ranks.procs[r].pid
        stacks = dump_stacks(pid)
        rep.problem("hang", "%s: rank %d (pid %d) still running %.1f s after %s\n%s\n%s"
                    % (label, r, pid, time.monotonic() - t_ref, what, tail(ranks.log(r)), stacks))
        hung.append(r)
    ranks.kill_all()
    return hung


def start_round(args, rep, index, round_seed, logdir):
    """Starts the ranks of one kill round; returns its plan and the ranks."""
    rng = random.Random(round_seed)
    plan = {"n": rng.randint(2, 5), "shm_disable": rng.choice("01"),
            # now and then a short job, so that ranks also end before the kill
            "ops": 1000000 if rng.random() < 0.95 else rng.randint(5, 40),
            "delay": rng.uniform(0.0, 3.0), "victim_pick": rng.random(), "op_seed": rng.getrandbits(63),
            "port": free_port(), "secret": "chaos-%d-%s" % (index, os.urandom(8).hex())}
    plan["transport"] = "tcp" if plan["shm_disable"] == "1" else "shm"
    plan["label"] = "round %d (--round-seed %d, %d ranks, %s)" % (index, round_seed, plan["n"], plan["transport"])
    if plan["ops"] < 1000000:
        plan["label"] = plan["label"][:-1] + ", %d ops)" % plan["ops"]
    plan["shm_before"], plan["listen_before"] = shm_entries(), listen_sockets()
    plan["started"] = time.monotonic()
    rep.rounds += 1
    rep.by_n[plan["n"]] += 1
    rep.by_transport[plan["transport"]] += 1
    env = round_env(args, plan["secret"], plan["port"], plan["shm_disable"])

    def argv_for(r):
        return ["mix", "rank=%d" % r, "nranks=%d" % plan["n"], "seed=%d" % plan["op_seed"], "ops=%d" % plan["ops"],
                "max_bytes=%d" % args.max_bytes, "split=1", "limit_s=%d" % RANK_LIMIT_S]
    return plan, Ranks(args.rank_bin, argv_for, plan["n"], env, logdir, "round%d" % index)


def kill_phase(rep, plan, ranks):
    """Waits for INIT ok everywhere, then 0-3 s (or until a rank ends), then
    SIGKILLs a running rank. Returns (victim, victim pid, kill time), victim
    None when nobody was left to kill; None when init failed."""
    label, n = plan["label"], plan["n"]
    init_deadline = time.monotonic() + INIT_TIMEOUT_S + 5
    all_joined = wait_until(init_deadline, lambda: all("INIT ok" in ranks.log(r) for r in range(n))
                            or len(ranks.poll()) < n, 0.02)
    missing = [r for r in range(n) if "INIT ok" not in ranks.log(r)]
    if missing:
        details = "\n".join("    rank %d:\n%s" % (r, tail(ranks.log(r))) for r in missing)
        rep.problem("init", "%s: ranks %s did not join\n%s" % (label, missing, details))
        if not all_joined:  # nobody ended, init itself is stuck
            handle_hangs(rep, ranks, label, ranks.poll(), plan["started"], "the start")
        return None
    joined = time.monotonic()
    wait_until(joined + plan["delay"], lambda: len(ranks.poll()) < n)
    running = ranks.poll()
    plan["killed_after"] = time.monotonic() - joined
    if not running:
        rep.all_done_before_kill += 1
        return None, None, time.monotonic()
    victim = running[int(plan["victim_pick"] * len(running))]
    pid = ranks.procs[victim].pid
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    ranks.procs[victim].wait(10)
    if ranks.procs[victim].returncode != -signal.SIGKILL:
        rep.notes.append("%s: rank %d had finished just before the kill" % (label, victim))
        return None, None, t_kill
    rep.killed += 1
    return victim, pid, t_kill


def names(text, victim, pid):
    """(names 'rank K' as a whole word, names its pid, names this host)."""
    return (re.search(r"(?<![\w])rank %d(?!\d)" % victim, text) is not None,
            re.search(r"\bpid[ =:]*%d(?!\d)" % pid, text) is not None,
            re.search(r"\bhost[ =:]*%s\b" % re.escape(socket.gethostname()), text) is not None)


def check_survivor(rep, plan, ranks, r, victim, pid, t_kill):
    label, out = plan["label"], ranks.log(r)
    rc = ranks.procs[r].returncode
    for line in re.findall(r"^WRONG .*$", out, re.M):
        rep.problem("wrong", "%s: rank %d: %s" % (label, r, line))
    results = RESULT_RE.findall(out)
    if rc is not None and rc < 0:
        rep.problem("crash", "%s: rank %d died of signal %d\n%s" % (label, r, -rc, tail(out)))
    if not results:
        rep.problem("no-result", "%s: rank %d printed no RESULT (exit %s)\n%s" % (label, r, rc, tail(out)))
        return
    code, t, op, desc, error = results[-1]
    code, t = int(code), float(t)
    rep.survivors += 1
    if code == 0:  # it finished all its operations
        if victim is not None and t > t_kill:
            rep.done_after_kill += 1
        else:
            rep.done_before_kill += 1
        return "done"
    if victim is None or t < t_kill:
        rep.problem("early-error", "%s: rank %d failed before any kill (op %s %s, code %d): %s"
                    % (label, r, op, desc, code, error))
        return
    rep.errored += 1
    rep.codes[code] += 1
    rep.kill_to_error[plan["transport"]].append(t - t_kill)
    if ranks.exit_time[r] is not None:
        rep.kill_to_exit.append(ranks.exit_time[r] - t_kill)
    aborted = re.search(r"^ABORTED seconds=([0-9.]+)", out, re.M)
    if aborted:
        rep.abort_after_error.append(float(aborted.group(1)))
    if t - t_kill > rep.bound_s:
        rep.problem("slow", "%s: rank %d returned %.1f s after the kill (bound %g s)" % (label, r, t - t_kill,
                                                                                          rep.bound_s))
    by_rank, by_pid, by_host = names(error, victim, pid)
    if not by_rank and desc.endswith("/child") and r % 2 == victim % 2:
        # Failed inside the child of ncclCommSplit(color = rank % 2), whose
        # messages number the ranks of the child: the dead rank is victim // 2.
        by_rank = names(error, victim // 2, pid)[0]
        rep.named_child_rank += by_rank
    rep.named_rank += by_rank
    rep.named_pid += by_pid
    rep.named_host += by_host
    # The pid identifies the dead process whatever communicator's numbering
    # the message uses (a split child, or a peer's relayed last error).
    if not by_rank and not by_pid:
        rep.problem("unnamed", "%s: rank %d's error does not name the dead rank %d (pid %d): code %d, %s: %s"
                    % (label, r, victim, pid, code, desc, error))
    if code != REMOTE_ERROR:
        rep.notes.append("%s: rank %d returned %s (not ncclRemoteError): %s"
                         % (label, r, NCCL_CODES.get(code, code), error[:300]))
    if rc not in (0, None):
        rep.problem("exit", "%s: rank %d exited with status %s\n%s" % (label, r, rc, tail(out)))
    return t - t_kill


def kill_round(args, rep, index, round_seed, logdir):
    plan, ranks = start_round(args, rep, index, round_seed, logdir)
    label, n = plan["label"], plan["n"]
    problems_before = sum(map(len, rep.problems.values()))
    try:
        killed = kill_phase(rep, plan, ranks)
        if killed is None:
            return
        victim, pid, t_kill = killed
        wait_until(t_kill + rep.bound_s, lambda: not ranks.poll())
        hung = handle_hangs(rep, ranks, label, ranks.poll(), t_kill,
                            "the kill" if victim is not None else "the start")
        outcomes = [check_survivor(rep, plan, ranks, r, victim, pid, t_kill)
                    for r in range(n) if r != victim and r not in hung]
        errored = [x for x in outcomes if isinstance(x, float)]
        what = ("rank %d (pid %d) killed" % (victim, pid)) if victim is not None else "no rank left to kill"
        print("%s: %s after %.2f s; survivors: %d errored, %d finished, %d hung; kill->error max %s"
              % (label, what, plan["killed_after"], len(errored), outcomes.count("done"), len(hung),
                 "%.3f s" % max(errored) if errored else "-"), flush=True)
    finally:
        ranks.kill_all()
        check_leftovers(rep, label, plan["secret"], plan["shm_before"], plan["listen_before"], plan["port"])
        if sum(map(len, rep.problems.values())) != problems_before:
            rep.notes.append("%s: logs in %s" % (label, logdir))


SHRUNK_RE = re.compile(r"^SHRUNK code=(-?\d+) first_t=([0-9.]+) shrink_s=([0-9.]+) rank=(-?\d+) nranks=(\d+) "
                       r"ops=(\d+) kinds=(\d+) wrong=(\d+) destroy_s=([0-9.]+) error=(.*)$", re.M)


def shrink_round(args, rep, index, round_seed, logdir):
    """One shrink round: kill a rank of a running job, check that the
    survivors shrink it away and that everything then runs correctly."""
    rng = random.Random(round_seed)
    n = args.shrink_ranks
    plan = {"n": n, "shm_disable": rng.choice("01"), "delay": rng.uniform(0.3, 1.5), "victim": rng.randrange(n),
            "revoke": int(rng.random() < 0.3), "op_seed": rng.getrandbits(63), "port": free_port(),
            "secret": "chaos-shrink-%d-%s" % (index, os.urandom(8).hex())}
    plan["transport"] = "tcp" if plan["shm_disable"] == "1" else "shm"
    label = "shrink round %d (seed %d, %d ranks, %s, rank %d killed, %s)" % (
        index, round_seed, n, plan["transport"], plan["victim"],
        "revoke + NCCL_SHRINK_DEFAULT" if plan["revoke"] else "NCCL_SHRINK_ABORT")
    shm_before, listen_before = shm_entries(), listen_sockets()
    rep.shrink_rounds += 1
    env = round_env(args, plan["secret"], plan["port"], plan["shm_disable"])

    def argv_for(r):
        return ["shrink", "rank=%d" % r, "nranks=%d" % n, "seed=%d" % plan["op_seed"], "victim=%d" % plan["victim"],
                "max_bytes=%d" % (1 << 20), "limit_s=%d" % RANK_LIMIT_S, "revoke=%d" % plan["revoke"]]
    ranks = Ranks(args.rank_bin, argv_for, n, env, logdir, "shrink%d" % index)
    problems_before = sum(map(len, rep.problems.values()))
    started = time.monotonic()
    try:
        wait_until(started + INIT_TIMEOUT_S + 5, lambda: all("INIT ok" in ranks.log(r) for r in range(n))
                   or len(ranks.poll()) < n, 0.02)
        missing = [r for r in range(n) if "INIT ok" not in ranks.log(r)]
        if missing:
            rep.problem("init", "%s: ranks %s did not join\n%s" % (label, missing, "\n".join(
                tail(ranks.log(r)) for r in missing)))
            return
        joined = time.monotonic()
        wait_until(joined + plan["delay"], lambda: len(ranks.poll()) < n)
        victim = plan["victim"]
        if ranks.procs[victim].poll() is not None:
            rep.problem("shrink", "%s: rank %d ended before the kill\n%s" % (label, victim, tail(ranks.log(victim))))
            return
        t_kill = time.monotonic()
        os.kill(ranks.procs[victim].pid, signal.SIGKILL)
        ranks.procs[victim].wait(10)
        wait_until(t_kill + rep.bound_s, lambda: not ranks.poll())
        hung = handle_hangs(rep, ranks, label, ranks.poll(), t_kill, "the kill")
        firsts = []
        for r in range(n):
            if r == victim or r in hung:
                continue
            out, rc = ranks.log(r), ranks.procs[r].returncode
            for line in re.findall(r"^WRONG .*$", out, re.M):
                rep.problem("wrong", "%s: rank %d: %s" % (label, r, line))
            m = SHRUNK_RE.search(out)
            if not m:
                rep.problem("shrink", "%s: rank %d printed no SHRUNK line (exit %s)\n%s" % (label, r, rc, tail(out)))
                continue
            code, first_t, shrink_s, new_rank, new_n, _, kinds, wrong, _, error = m.groups()
            if int(code) != 0 or int(kinds) != 8 or int(wrong) != 0 or int(new_n) != n - 1 or rc != 0:
                rep.problem("shrink", "%s: rank %d: %s (exit %s)" % (label, r, m.group(0)[:600], rc))
                continue
            if int(new_rank) != r - (r > victim):
                rep.problem("shrink", "%s: rank %d became rank %s (expected %d)" % (label, r, new_rank,
                                                                                   r - (r > victim)))
            firsts.append(float(first_t) - t_kill)
            rep.shrink_calls.append(float(shrink_s))
        if len(firsts) == n - 1:
            rep.kill_to_shrunk.append(max(firsts))
            if max(firsts) > rep.bound_s:
                rep.problem("slow", "%s: the shrunk communicator worked only %.1f s after the kill" % (
                    label, max(firsts)))
        print("%s: killed after %.2f s; survivors shrunk and checked: %d/%d; kill -> first correct collective "
              "(last survivor) %s" % (label, plan["delay"], len(firsts), n - 1,
                                      "%.3f s" % max(firsts) if firsts else "-"), flush=True)
    finally:
        ranks.kill_all()
        check_leftovers(rep, label, plan["secret"], shm_before, listen_before, plan["port"])
        if sum(map(len, rep.problems.values())) != problems_before:
            rep.notes.append("%s: logs in %s" % (label, logdir))


def abort_test(args, rep, logdir):
    """`loom_chaos_rank abort`: one process, blocked AllReduce + abort from
    another thread, args.abort_tries times."""
    secret = "chaos-abort-%s" % os.urandom(8).hex()
    env = round_env(args, secret, 0, "0")
    del env["NCCL_COMM_ID"]
    seed = random.Random(args.seed).getrandbits(63)
    shm_before, listen_before = shm_entries(), listen_sockets()
    argv = ["abort", "tries=%d" % args.abort_tries, "seed=%d" % seed, "bound_s=%d" % int(rep.bound_s)]
    label = "abort test (tries=%d seed=%d)" % (args.abort_tries, seed)
    print("%s: running" % label, flush=True)
    ranks = Ranks(args.rank_bin, lambda r: argv, 1, env, logdir, "abort")
    deadline = time.monotonic() + 60 + args.abort_tries * (1.0 + 2 * rep.bound_s / 10)
    try:
        finished = wait_until(deadline, lambda: not ranks.poll() or "HANG" in ranks.log(0), 0.05)
        out = ranks.log(0)
        if not finished or ranks.poll():
            hang = re.search(r"^HANG .*$", out, re.M)
            handle_hangs(rep, ranks, label, [0], deadline, hang.group(0) if hang else "its deadline")
        rep.abort_tries = [dict(kv.split("=", 1) for kv in line.split()[2:])
                           for line in re.findall(r"^TRY \d+ delay_ms=.*$", out, re.M)]
        first = re.search(r"^ERROR try=0 (.*)$", out, re.M)
        rep.abort_error = first.group(1) if first else None
        summary = re.search(r"^SUMMARY (.*)$", out, re.M)
        rep.abort_summary = summary.group(1) if summary else None
        rc = ranks.procs[0].returncode
        if rc != 0 and not rep.problems["hang"]:
            bad = [line for line in out.splitlines() if line.startswith("TRY") and
                   ("code=0" in line or "init failed" in line)]
            rep.problem("abort", "%s: exit status %s; %s\n%s" % (label, rc, summary.group(0) if summary else
                                                                  "no SUMMARY", "\n".join(bad[:10]) or tail(out)))
    finally:
        ranks.kill_all()
        check_leftovers(rep, label, secret, shm_before, listen_before, -1)


def print_report(args, rep):
    p = rep.problems
    print("\n==== loom chaos report (seed %d) ====" % args.seed)
    if rep.rounds:
        print("kill rounds: %d (killed %d, nothing left to kill %d); ranks %s; transports %s"
              % (rep.rounds, rep.killed, rep.all_done_before_kill,
                 " ".join("n%d=%d" % kv for kv in sorted(rep.by_n.items())),
                 " ".join("%s=%d" % kv for kv in sorted(rep.by_transport.items()))))
        print("survivors: %d (returned an error %d, finished all ops before the kill %d, after it %d)"
              % (rep.survivors, rep.errored, rep.done_before_kill, rep.done_after_kill))
        every = [x for v in rep.kill_to_error.values() for x in v]
        print("kill -> failing call returned (s): %s" % quantiles(every))
        for transport in sorted(rep.kill_to_error):
            print("  over %-3s                      : %s" % (transport, quantiles(rep.kill_to_error[transport])))
        print("kill -> survivor exited (s):       %s" % quantiles(rep.kill_to_exit))
        print("ncclCommAbort after the error (s): %s" % quantiles(rep.abort_after_error))
        print("error codes: %s" % (", ".join("%s x%d" % (NCCL_CODES.get(c, c), k) for c, k in
                                            sorted(rep.codes.items())) or "-"))
        print("errors naming the dead rank: %d/%d (%d of them by its rank in a split child), its pid: %d/%d, "
              "this host: %d/%d" % (rep.named_rank, rep.errored, rep.named_child_rank, rep.named_pid, rep.errored,
                                    rep.named_host, rep.errored))
    if args.abort_tries and not args.kill_only and not args.shrink_only:
        t = rep.abort_tries
        print("abort test: tries %d; %s" % (len(t), rep.abort_summary or "no SUMMARY line"))
        for key, name in (("abort_s", "ncclCommAbort took"), ("release_s", "abort -> blocked call returned"),
                          ("teardown_s", "the peer's destroy/abort took")):
            print("  %-31s (s): %s" % (name, quantiles([float(x[key]) for x in t if key in x])))
        if rep.abort_error is not None:
            print("  the blocked call's error (try 0): %s" % rep.abort_error[:300])
    if rep.shrink_rounds:
        print("shrink rounds: %d; kill -> first correct collective on the shrunk communicator (s, last survivor): %s"
              % (rep.shrink_rounds, quantiles(rep.kill_to_shrunk)))
        print("  ncclCommShrink took (s, each survivor): %s" % quantiles(rep.shrink_calls))
    kinds = ("hang", "leftover", "unnamed", "slow", "wrong", "crash", "early-error", "no-result", "init", "exit",
             "abort", "shrink")
    print("problems: " + ", ".join("%s %d" % (k, len(p[k])) for k in kinds))
    if rep.foreign_sockets:
        print("note: ignored %d new listening sockets of other programs (not ours: their owners do not carry "
              "our LOOM_COMM_SECRET)" % rep.foreign_sockets)
    for note in rep.notes:
        print("note: " + note)
    print("CHAOS %s" % ("FAILED" if rep.failed() else "PASSED"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank-bin", required=True, help="path of loom_chaos_rank")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("LOOM_CHAOS_ROUNDS", "30")),
                    help="kill rounds (default: LOOM_CHAOS_ROUNDS or 30)")
    ap.add_argument("--seed", type=int, default=None, help="driver seed (default: random, printed)")
    ap.add_argument("--round-seed", type=int, default=None, help="run only the kill round with this seed")
    ap.add_argument("--bound-s", type=float, default=15.0, help="a survivor must end within this of the kill")
    ap.add_argument("--max-bytes", type=int, default=8 << 20, help="largest buffer of an operation")
    ap.add_argument("--abort-tries", type=int, default=100, help="tries of the abort test (0: skip it)")
    ap.add_argument("--kill-only", action="store_true", help="only the kill rounds")
    ap.add_argument("--abort-only", action="store_true", help="only the abort test")
    ap.add_argument("--shrink-rounds", type=int, default=0, help="shrink rounds (default 0)")
    ap.add_argument("--shrink-ranks", type=int, default=4, help="ranks of a shrink round (default 4)")
    ap.add_argument("--shrink-only", action="store_true", help="only the shrink rounds")
    ap.add_argument("--keep-logs", action="store_true", help="keep the rank logs even when all passed")
    args = ap.parse_args()
    if not os.access(args.rank_bin, os.X_OK):
        ap.error("--rank-bin %s is not an executable" % args.rank_bin)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    rep = Report(args.bound_s)
    logdir = tempfile.mkdtemp(prefix="loom-chaos-")
    print("chaos driver: seed %d, logs in %s" % (args.seed, logdir), flush=True)
    started = time.monotonic()
    if args.shrink_only:
        args.kill_only = args.abort_only = False
        args.abort_tries = 0
    if not args.abort_only and not args.shrink_only:
        if args.round_seed is not None:
            kill_round(args, rep, 0, args.round_seed, logdir)
        else:
            seeds = random.Random(args.seed)
            for i in range(args.rounds):
                kill_round(args, rep, i, seeds.getrandbits(48), logdir)
    if not args.kill_only and args.abort_tries > 0:
        abort_test(args, rep, logdir)
    if not args.kill_only and not args.abort_only:
        seeds = random.Random(args.seed + 1)
        for i in range(args.shrink_rounds):
            shrink_round(args, rep, i, seeds.getrandbits(48), logdir)
    print_report(args, rep)
    print("wall time %.1f s" % (time.monotonic() - started))
    if rep.failed() or args.keep_logs:
        print("logs kept in %s" % logdir)
    else:
        shutil.rmtree(logdir, ignore_errors=True)
    return 1 if rep.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
