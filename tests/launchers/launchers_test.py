#!/usr/bin/env python3
"""The perf tools under real launchers: Open MPI's mpirun, torchrun and
loomrun, with checking on; and launch environments that are wrong.

Each run starts N processes of a tool through the launcher, with nothing of
loom's own in between: the tool reads its rank and size from the variables
the launcher sets (OMPI_COMM_WORLD_RANK/SIZE, RANK/WORLD_SIZE,
LOOM_RANK/LOOM_WORLD_SIZE) and meets the others at NCCL_COMM_ID, a free
port of 127.0.0.1 (torchrun's own store gets another one). Every launcher
variable of the calling environment is removed first, so an outer job
cannot leak into the test.

Tests (one per run; standard library only):
  run       --launcher mpirun|torchrun|loomrun --ranks N --type T --tools a,b,...
            every tool with `-b 8 -e 64K -f 8 -n 2 -w 1 -c 1 -d T` (every
            root for the rooted ones). Exit status 0; the table parses as
            nccl-tests output (tests/tools/perf_table.py); its rows are the
            expected sizes, counts, type and roots in order, each with 0
            wrong elements out of place and 0 (or N/A) in place; the footer
            says 0 out of bounds OK; one "Rank" line per rank, each from a
            process of its own.
  errors-env        a single process told a wrong rank/size: RANK without
                    WORLD_SIZE, a rank not below the size, a size of 0, a
                    rank that is not a number, a bad NCCL_COMM_ID.
  errors-mpirun     mpirun without NCCL_COMM_ID; stale LOOM_RANK/
                    LOOM_WORLD_SIZE in the environment mpirun runs in.
  errors-torchrun   torchrun without NCCL_COMM_ID.
  errors-mismatch   processes started by hand that disagree: both told
                    WORLD_SIZE=3 while 2 run; one told 2, the other 3; two
                    told RANK=0. With LOOM_INIT_TIMEOUT_S=3 each must fail
                    within 20 s, every process naming the cause.
  Every error case must exit nonzero (where noted, with the tool's exact
  status) within a bounded time and print the expected text.

  launchers_test.py --bin-dir build/bin --test run --launcher mpirun --ranks 3 --type float --tools all
  launchers_test.py --bin-dir build/bin --torch-python /usr/bin/python3 --test errors-torchrun

Exit status: 0 passed, 1 failed, 77 skipped (the launcher is not here:
no Open MPI mpirun, or --torch-python empty), 2 bad usage. A --torch-python
that cannot import torch.distributed.run fails.
"""
import argparse
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

SKIP = 77
TOOLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "sendrecv", "alltoall", "gather",
         "scatter"]
# The count column is one rank's part; the size is every rank's.
PER_RANK_COUNT = {"all_gather", "reduce_scatter", "alltoall", "gather", "scatter"}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
REDUCING = {"all_reduce", "reduce_scatter", "reduce", "sendrecv"}  # redop column says sum
TYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
              "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
MIN_BYTES, MAX_BYTES, FACTOR = 8, 64 * 1024, 8
TOOL_ARGS = ["-b", str(MIN_BYTES), "-e", "64K", "-f", str(FACTOR), "-n", "2", "-w", "1", "-c", "1"]
RUN_TIMEOUT_S = 90  # one launch; a stuck one is killed with its whole process group
BUDGET_S = 240  # all launches of one test together: below CTest's TIMEOUT, so this harness kills them
_deadline = time.monotonic() + BUDGET_S

# Variables a launcher (or an outer job) sets that the tools or the launchers
# read: removed from the environment every run starts from.
LAUNCH_VARS = {"LOOM_RANK", "LOOM_WORLD_SIZE", "LOOM_LOCAL_RANK", "NCCL_COMM_ID", "PMI_RANK", "PMI_SIZE",
               "MPI_LOCALRANKID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}
LAUNCH_PREFIXES = ("OMPI_COMM_WORLD_", "PMIX_", "TORCHELASTIC_")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import perf_table  # noqa: E402

RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+) Group\s+(\d+) Pid\s+(\d+) on")

_running = None  # the launch in progress, for the signal handler


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def base_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith(LAUNCH_PREFIXES)}
    env.setdefault("LOOM_TIMEOUT_S", "60")  # a stuck library call fails instead of hanging
    env.setdefault("LOOM_INIT_TIMEOUT_S", "60")
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"  # Open MPI refuses root without both
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"  # more ranks than cores is fine here
    return env


def free_ports(n):
    """n distinct ports of 127.0.0.1 that nothing listens on: the kernel
    picks each (bind to port 0); all are held until every one is picked."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Launch:
    """Processes started in a process group of their own; on timeout or when
    the harness is stopped the whole group is killed, so nothing outlives
    the test."""

    def __init__(self, commands, env, timeout=RUN_TIMEOUT_S):
        self.commands = commands if isinstance(commands[0], list) else [commands]
        self.env = env if isinstance(env, list) else [env] * len(self.commands)
        self.timeout = max(1.0, min(timeout, _deadline - time.monotonic()))

    def run(self):
        global _running
        procs = []
        start = time.monotonic()
        _running = procs
        try:
            for command, env in zip(self.commands, self.env):
                print("+", " ".join(command), flush=True)
                procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True,
                                              universal_newlines=True))
            results = []
            for proc in procs:
                left = max(0.1, self.timeout - (time.monotonic() - start))
                try:
                    out, _ = proc.communicate(timeout=left)
                    results.append((proc.returncode, out))
                except subprocess.TimeoutExpired:
                    kill_groups(procs)
                    out, _ = proc.communicate()
                    results.append((None, out))
            return results, time.monotonic() - start
        finally:
            kill_groups(procs)  # whatever a launcher left behind in its group
            _running = None


def kill_groups(procs):
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def on_signal(signum, _frame):
    if _running:
        kill_groups(_running)
    sys.exit(128 + signum)


# --- launchers -------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def open_mpi(path):
    """Open MPI's mpirun at path, or the reason to skip."""
    if not path:
        raise Skip("no mpirun on PATH (Debian: apt-get install openmpi-bin)")
    try:
        version = subprocess.run([path, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 universal_newlines=True, env=base_env(), timeout=30).stdout
    except OSError as error:  # configured, so expected to be there
        raise Failure("cannot run %s: %s" % (path, error))
    if "Open MPI" not in version and "OpenRTE" not in version:
        raise Skip("%s is not Open MPI's mpirun (says %r); these tests pass Open MPI's options"
                   % (path, version.strip()[:80]))
    return path


def mpirun_path(options):
    path = options.mpirun or shutil.which("mpirun")
    # Open MPI takes its prefix from the folder it runs from: /bin/mpirun
    # (a merged-/usr link to /usr/bin) gives "/", which it refuses.
    return open_mpi(path and os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))


@functools.lru_cache(maxsize=None)
def torch_ready(python):
    """Whether python runs torchrun (checked once: importing torch takes seconds)."""
    check = subprocess.run([python, "-c", "import torch.distributed.run"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    return check.returncode, check.stdout.strip()[-300:]


def torch_python(options):
    if not options.torch_python:
        raise Skip("no Python with torch: LOOM_TORCH_PYTHON was empty at configure time "
                   "(cmake -DLOOM_TORCH_PYTHON=/path/to/python)")
    status, output = torch_ready(options.torch_python)
    if status != 0:  # configured as one that imports torch: that it no longer does is a failure
        raise Failure("%s (LOOM_TORCH_PYTHON) cannot import torch.distributed.run: %s"
                      % (options.torch_python, output))
    return options.torch_python


def launch_command(options, launcher, ranks, command, comm_id=True):
    """The command line and environment that start `ranks` processes of
    `command` under `launcher`; with comm_id, NCCL_COMM_ID names a free
    port on every process."""
    env = base_env()
    ports = free_ports(2)
    exported = {}
    if comm_id:
        exported["NCCL_COMM_ID"] = "127.0.0.1:%d" % ports[0]
    exported["LOOM_TIMEOUT_S"] = env["LOOM_TIMEOUT_S"]
    exported["LOOM_INIT_TIMEOUT_S"] = env["LOOM_INIT_TIMEOUT_S"]
    env.update(exported)
    if launcher == "mpirun":
        line = [mpirun_path(options), "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
        for name in sorted(exported):
            line += ["-x", name]  # as a remote node would need it
        return line + command, env
    if launcher == "torchrun":
        line = [torch_python(options), "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                str(ranks), "--master-addr", "127.0.0.1", "--master-port", str(ports[1]), "--max-restarts", "0",
                "--monitor-interval", "0.1", "--no-python"]
        env["OMP_NUM_THREADS"] = "1"  # quiets torchrun's banner about it
        return line + command, env
    if launcher == "loomrun":
        env.pop("NCCL_COMM_ID", None)  # loomrun picks the port itself
        return [options.loomrun, "-n", str(ranks), "--timeout", str(RUN_TIMEOUT_S - 10), "--"] + command, env
    raise Failure("unknown launcher %r" % launcher)


# --- checks ----------------------------------------------------------------

def expected_rows(tool, ranks, dtype):
    width = TYPE_BYTES[dtype]
    rows = []
    for root in (range(ranks) if tool in ROOTED else [-1]):
        size = MIN_BYTES
        while size <= MAX_BYTES:
            count = size // width
            if tool in PER_RANK_COUNT:
                # nccl-tests' rounding: a rank's part, in whole 16-byte units
                count = (count // ranks) & -(16 // width)
                rows.append((count * ranks * width, count, root))
            else:
                rows.append((count * width, count, root))
            size *= FACTOR
    return rows


def check_table(tool, ranks, dtype, rc, output):
    problems = []
    if rc != 0:
        problems.append("exit status %s, expected 0" % rc)
    try:
        table = perf_table.parse(output)
    except perf_table.ParseError as error:
        return problems + ["the output does not parse as nccl-tests output: %s" % error]
    rows = [(r["size"], r["count"], r["root"]) for r in table["rows"]]
    want = expected_rows(tool, ranks, dtype)
    if rows != want:
        problems.append("rows (size, count, root) %s, expected %s" % (rows, want))
    for row in table["rows"]:
        if row["type"] != dtype or row["redop"] != ("sum" if tool in REDUCING else "none"):
            problems.append("row of type %s redop %s: %s" % (row["type"], row["redop"], row))
        if row["oop_wrong"] != 0 or row["ip_wrong"] not in (0, "N/A"):
            problems.append("row with wrong elements (out of place %s, in place %s): size %d root %d"
                            % (row["oop_wrong"], row["ip_wrong"], row["size"], row["root"]))
    if table["out_of_bounds"] != 0 or not table["oob_ok"]:
        problems.append("footer does not say '# Out of bounds values : 0 OK'")
    pids = {}
    for line in output.splitlines():
        m = RANK_LINE.match(line)
        if m:
            pids[int(m.group(1))] = int(m.group(3))
    if sorted(pids) != list(range(ranks)) or len(table["ranks"]) != ranks:
        problems.append("rank lines for ranks %s, expected 0..%d once each" % (table["ranks"], ranks - 1))
    elif len(set(pids.values())) != ranks:
        problems.append("the %d ranks run in %d processes (pids %s), expected one each"
                        % (ranks, len(set(pids.values())), sorted(pids.values())))
    return problems


def test_run(options):
    tools = TOOLS if options.tools == "all" else options.tools.split(",")
    failed = []
    for tool in tools:
        binary = os.path.join(options.bin_dir, tool + "_perf")
        args = TOOL_ARGS + ["-d", options.type] + (["-r", "-1"] if tool in ROOTED else [])
        command, env = launch_command(options, options.launcher, options.ranks, [binary] + args)
        launch = Launch(command, env)
        [(rc, output)], seconds = launch.run()
        problems = (["no result within %.0f s (process group killed)" % launch.timeout] if rc is None
                    else check_table(tool, options.ranks, options.type, rc, output))
        print("%-15s %s, %d ranks, %s: %s (%.1f s)" % (tool, options.launcher, options.ranks, options.type,
                                                       "FAIL" if problems else "ok", seconds), flush=True)
        if problems:
            print(output)
            for problem in problems:
                print("  FAIL:", problem)
            failed.append(tool)
    if failed:
        raise Failure("%d of %d tools failed: %s" % (len(failed), len(tools), ", ".join(failed)))


def expect(name, results, seconds, texts, limit_s, statuses=None, each=False):
    """Every process exited nonzero (or with statuses[i]) within limit_s and
    the output holds each text (with each=True, every process's output)."""
    problems = []
    outputs = [out for _, out in results]
    for i, (rc, _) in enumerate(results):
        if rc is None:
            problems.append("process %d did not finish (killed)" % i)
        elif statuses is not None and rc != statuses[i]:
            problems.append("process %d: exit status %d, expected %d" % (i, rc, statuses[i]))
        elif statuses is None and rc == 0:
            problems.append("process %d: exit status 0, expected a failure" % i)
    if seconds > limit_s:
        problems.append("took %.1f s, expected at most %d s" % (seconds, limit_s))
    for text in texts:
        missing = [i for i, out in enumerate(outputs) if text not in out] if each else (
            [] if any(text in out for out in outputs) else ["all"])
        if missing:
            problems.append("output of process(es) %s lacks %r" % (missing, text))
    print("%-60s %s (%.1f s)" % (name, "FAIL" if problems else "ok", seconds), flush=True)
    if problems:
        for i, out in enumerate(outputs):
            print("--- output of process %d, exit status %s:\n%s" % (i, results[i][0], out))
        for problem in problems:
            print("  FAIL:", problem)
    return not problems


def tool(options, name="all_reduce"):
    return [os.path.join(options.bin_dir, name + "_perf"), "-b", "8", "-e", "1K", "-f", "8", "-c", "1", "-n", "1",
            "-w", "1"]


def test_errors_env(options):
    ok = True
    cases = [
        ("RANK without WORLD_SIZE", {"RANK": "1"}, 6, ["all_reduce_perf: RANK is set but WORLD_SIZE is not; "
                                                       "set both or neither"]),
        ("WORLD_SIZE without RANK", {"WORLD_SIZE": "2"}, 6, ["WORLD_SIZE is set but RANK is not"]),
        ("RANK not below WORLD_SIZE", {"RANK": "3", "WORLD_SIZE": "3"}, 6,
         ["RANK=3 is not below WORLD_SIZE=3 (process ranks run from 0 to 2)"]),
        ("OMPI rank not below size", {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, 6,
         ["OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2"]),
        ("WORLD_SIZE=0", {"RANK": "0", "WORLD_SIZE": "0"}, 6,
         ["WORLD_SIZE=0: the number of processes must be at least 1"]),
        ("RANK not a number", {"RANK": "one", "WORLD_SIZE": "2"}, 6, ["RANK='one' is not a non-negative integer"]),
        ("2 processes without NCCL_COMM_ID", {"RANK": "0", "WORLD_SIZE": "2"}, 6,
         ["2 processes (from RANK/WORLD_SIZE) need a rendezvous: set NCCL_COMM_ID=host:port on every process"]),
        ("NCCL_COMM_ID without a port", {"RANK": "0", "WORLD_SIZE": "2", "NCCL_COMM_ID": "127.0.0.1"}, 3,
         ["NCCL_COMM_ID='127.0.0.1' is not a valid host:port"]),
    ]
    for name, variables, status, texts in cases:
        env = base_env()
        env.update(variables)
        results, seconds = Launch(tool(options), env, timeout=30).run()
        ok &= expect(name, results, seconds, texts, 15, statuses=[status])
    return ok


def test_errors_mpirun(options):
    ok = True
    command, env = launch_command(options, "mpirun", 3, tool(options), comm_id=False)
    results, seconds = Launch(command, env, timeout=60).run()
    ok &= expect("mpirun -np 3 without NCCL_COMM_ID", results, seconds,
                 ["3 processes (from OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE) need a rendezvous: "
                  "set NCCL_COMM_ID=host:port on every process"], 30)
    # LOOM_RANK/LOOM_WORLD_SIZE left over in the shell come before mpirun's
    # own: every process is rank 0 of a world of its own. Each says so.
    command, env = launch_command(options, "mpirun", 2, tool(options), comm_id=False)
    env.update({"LOOM_RANK": "0", "LOOM_WORLD_SIZE": "1"})
    results, seconds = Launch(command, env, timeout=60).run()
    ok &= expect("mpirun -np 2 under stale LOOM_RANK=0 LOOM_WORLD_SIZE=1", results, seconds,
                 ["note: OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=2 are ignored: LOOM_RANK/LOOM_WORLD_SIZE "
                  "come first and say rank 0 of 1" % r for r in range(2)], 30, statuses=[0])
    return ok


def test_errors_torchrun(options):
    command, env = launch_command(options, "torchrun", 2, tool(options), comm_id=False)
    results, seconds = Launch(command, env, timeout=90).run()
    return expect("torchrun --nproc-per-node 2 without NCCL_COMM_ID", results, seconds,
                  ["2 processes (from RANK/WORLD_SIZE) need a rendezvous: set NCCL_COMM_ID=host:port"], 60)


def test_errors_mismatch(options):
    """Processes started by hand with RANK/WORLD_SIZE, the way a launcher
    that gets them wrong would start them."""
    ok = True
    timeout_text = "init timed out after 3 s"

    def start(name, pairs, texts, each):
        port = free_ports(1)[0]
        envs = []
        for rank, size in pairs:
            env = base_env()
            env.update({"RANK": str(rank), "WORLD_SIZE": str(size), "NCCL_COMM_ID": "127.0.0.1:%d" % port,
                        "LOOM_INIT_TIMEOUT_S": "3"})
            envs.append(env)
        results, seconds = Launch([tool(options)] * len(pairs), envs, timeout=40).run()
        return expect(name, results, seconds, texts, 20, statuses=[3] * len(pairs), each=each)

    ok &= start("2 processes, both told WORLD_SIZE=3", [(0, 3), (1, 3)],
                [timeout_text + ": 2 of 3 ranks joined; missing ranks: 2"], each=True)
    # Whichever joins first sets the size and the other is refused at once;
    # then rank 1 waits for a rank that never comes, or rank 0 is the one
    # refused and leaves, taking the rendezvous with it.
    ok &= start("rank 0 told WORLD_SIZE=2, rank 1 told 3", [(0, 2), (1, 3)],
                ["says nranks=", "but other ranks said"], each=False)
    ok &= start("2 processes, both told RANK=0", [(0, 2), (0, 2)],
                ["rank 0 cannot listen there", timeout_text + ": 1 of 2 ranks joined; missing ranks: 1"], each=False)
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", required=True, help="folder of the *_perf tools")
    parser.add_argument("--loomrun", help="loomrun (default: BIN_DIR/loomrun)")
    parser.add_argument("--mpirun", help="Open MPI's mpirun (default: the one on PATH)")
    parser.add_argument("--torch-python", default="", help="a Python that imports torch; empty: skip torchrun")
    parser.add_argument("--test", required=True,
                        choices=["run", "errors-env", "errors-mpirun", "errors-torchrun", "errors-mismatch"])
    parser.add_argument("--launcher", choices=["mpirun", "torchrun", "loomrun"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--type", default="float", choices=sorted(TYPE_BYTES))
    parser.add_argument("--tools", default="all", help="all, or a comma list of " + ",".join(TOOLS))
    options = parser.parse_args()
    if options.test == "run" and not options.launcher:
        parser.error("--test run needs --launcher")
    if options.tools != "all" and not set(options.tools.split(",")) <= set(TOOLS):
        parser.error("--tools: unknown tool in %r" % options.tools)
    options.loomrun = options.loomrun or os.path.join(options.bin_dir, "loomrun")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    try:
        if options.test == "run":
            test_run(options)
            ok = True
        else:
            ok = {"errors-env": test_errors_env, "errors-mpirun": test_errors_mpirun,
                  "errors-torchrun": test_errors_torchrun, "errors-mismatch": test_errors_mismatch}[options.test](
                      options)
    except Skip as skip:
        print("SKIP:", skip)
        return SKIP
    except Failure as failure:
        print("FAIL:", failure)
        return 1
    print("%s in %.1f s" % ("passed" if ok else "FAILED", time.monotonic() - started))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
