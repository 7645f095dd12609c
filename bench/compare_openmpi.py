#!/usr/bin/env python3
"""Side-by-side collectives: loom's perf tools against Open MPI.

Runs the two alternately (A B, B A, A B ..., --rounds rounds) on the same sizes and
rank counts, floats (sum), both timed the nccl-tests way, and prints per size
the median ratio loom/MPI of bus bandwidth and of time, in-place against
in-place and out-of-place against out-of-place. Ratios > 1 for busbw (and
< 1 for time) mean loom is faster. The first round also checks loom's
results (-c 1, which fails the script on a wrong value); later rounds only
time, since building the check data costs more than the collectives
themselves. --coll picks the collectives: allreduce (all_reduce_perf
against MPI_Allreduce), broadcast (MPI_Bcast), allgather (MPI_Allgather),
reducescatter (MPI_Reduce_scatter_block); sizes mean what they mean in
nccl-tests (AllGather: the output, ReduceScatter: the input).

Both programs print times with 4 decimals (loom's --time_decimals, the
Open MPI program's -d), so calls of a tenth of a microsecond are not
compared as rounded numbers.

Both programs move their buffers between calls the way nccl-tests does
(call i uses offset (i % (max/size)) * size of a max-sized buffer), so a
small size is timed on data the previous call did not leave in the caches.
--hot runs every size on its own instead (-b = -e), which keeps the buffers
in place: the cache-resident case. --sizes lists the sizes to run that way
(min: the smallest with a 16-byte block per rank, nccl-tests' alignment),
with iterations scaled to the size (-n is then the least) and a tenth as
many warm-up calls (-w is then the least), for both programs.

  bench/compare_openmpi.py --build build --ranks 2,4 -b 1M -e 256M --rounds 3
  bench/compare_openmpi.py --coll allreduce,broadcast --ranks 2,4 --sizes min,64K,1M

Needs Debian's openmpi-bin and libopenmpi-dev (installed with apt-get when
run as root and missing). Open MPI runs with its shared-memory transport
(btl vader + self), as root with --allow-run-as-root --oversubscribe.
"""
import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)\s+\S+\s*$")
MPI_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")


def mpi_usable():
    # mpicc can be present without the headers (openmpi-bin without libopenmpi-dev).
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        return False
    probe = subprocess.run(["mpicc", "-E", "-x", "c", "-"], input="#include <mpi.h>\n", text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return probe.returncode == 0


def ensure_mpi():
    if mpi_usable():
        return
    if os.geteuid() != 0:
        sys.exit("compare_openmpi: mpicc, mpirun or mpi.h missing; install openmpi-bin and libopenmpi-dev")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openmpi-bin",
                    "libopenmpi-dev"], check=True, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


# --coll name: (loom perf tool, mpi_coll_perf -o name)
COLLECTIVES = {
    "allreduce": ("all_reduce_perf", "allreduce"),
    "broadcast": ("broadcast_perf", "bcast"),
    "allgather": ("all_gather_perf", "allgather"),
    "reducescatter": ("reduce_scatter_perf", "reducescatter"),
}


def build_mpi(build):
    exe = os.path.join(build, "bin", "mpi_coll_perf")
    src = os.path.join(HERE, "mpi", "mpi_coll_perf.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run(["mpicc", "-O2", "-o", exe, src], check=True)
    return exe


def parse_size(text):
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def parse(text, pattern):
    rows = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = pattern.match(line)
        if m:
            size = int(m.group(1))
            vals = [float(x) for x in m.group(3, 4, 5, 6, 7, 8)]
            rows[size] = {"oop_us": vals[0], "oop_bus": vals[2], "ip_us": vals[3], "ip_bus": vals[5]}
    return rows


def load_perf_plot():
    """tools/perf/perf_plot.py, imported by path."""
    path = os.path.join(HERE, "..", "tools", "perf", "perf_plot.py")
    spec = importlib.util.spec_from_file_location("perf_plot", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plot_series(perf_plot, results, inplace=False):
    """results: [(ranks, [(name, runs), ...])], runs as parse() returns them,
    one per round. Returns perf_plot Series, one per (ranks, name): the
    median time and busbw over the rounds of every size all rounds of all
    names have."""
    time_key, bus_key = ("ip_us", "ip_bus") if inplace else ("oop_us", "oop_bus")
    series = []
    for ranks, named in results:
        every = [rows for _, runs in named for rows in runs]
        sizes = sorted(s for s in every[0] if all(s in rows for rows in every)) if every else []
        for name, runs in named:
            points = [(size, statistics.median(r[size][time_key] for r in runs),
                       statistics.median(r[size][bus_key] for r in runs)) for size in sizes]
            series.append(perf_plot.Series.from_points("%s, %d ranks" % (name, ranks), points, inplace))
    return series


# A launch that starts right after another one ends runs slower on this
# 2-core host (4 ranks, AllReduce of 64 KiB: the second of two identical
# loom runs took longer in 5 of 6 pairs, up to 1.7x the first's time; with
# a second between them, 0.91-1.13x either way). Every launch waits this
# long first, and the rounds alternate which side goes first.
SETTLE_S = 1.0


def run(cmd, env=None):
    time.sleep(SETTLE_S)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        sys.exit("compare_openmpi: command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
    return p.stdout


def size_ranges(args, coll, n):
    """[(b, e, iters, warm-ups)] for one collective on n ranks."""
    if args.sizes:
        out = []
        for text in args.sizes.split(","):
            size = 16 * n if text == "min" and coll in ("allgather", "reducescatter") else (
                8 if text == "min" else parse_size(text))
            # Enough calls to time small sizes (at least -n), after a tenth as
            # many warm-ups (at least -w): a run of 20000 calls of 0.2 us lasts
            # 4 ms, less than the kernel may take to move one of two ranks
            # that started on the same CPU to the other (a 32-byte
            # ReduceScatter out of place on 2 ranks, unbound, measured 1.5-2.4
            # us in 1 run of 5 with 2 warm-ups, 0.2 us otherwise).
            iters = max(int(args.n), min(20000, (1 << 26) // max(size, 1)))
            out.append((str(size), str(size), str(iters), str(max(int(args.w), iters // 10))))
        return out
    if args.hot:
        out = []
        size, end = parse_size(args.b), parse_size(args.e)
        while size <= end:
            out.append((str(size), str(size), args.n, args.w))
            size *= 2
        return out
    return [(args.b, args.e, args.n, args.w)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--coll", default="allreduce", help="comma-separated: " + ", ".join(COLLECTIVES))
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="256M")
    ap.add_argument("-n", default="20", help="timed iterations per size")
    ap.add_argument("-w", default="2", help="warm-up iterations per size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hot", action="store_true", help="one run per size: buffers stay in place (cache-hot)")
    ap.add_argument("--sizes", help="comma-separated sizes, each run on its own (hot); 'min' = smallest")
    ap.add_argument("--plot", metavar="PNG", help="also draw busbw and time against size to this PNG")
    ap.add_argument("--plot-inplace", action="store_true", help="draw the in-place columns")
    ap.add_argument("--bind-to", choices=["default", "none", "core"], default="default",
                    help="default: each launcher's own placement (loomrun: ranks that fit on the cores get "
                    "equal shares of them, more are spread as with core; mpirun: 2 ranks get a core each, "
                    "more are left to the kernel); core: both bind rank r to core r %% cores "
                    "(loomrun --bind-to core, mpirun --bind-to core:overload-allowed), which spreads more "
                    "ranks than cores evenly; none: the kernel places every rank of both")
    args = ap.parse_args()
    colls = [c.strip() for c in args.coll.split(",") if c.strip()]
    for c in colls:
        if c not in COLLECTIVES:
            sys.exit("compare_openmpi: unknown collective %r (use %s)" % (c, ", ".join(COLLECTIVES)))
    perf_plot = None
    if args.plot:
        perf_plot = load_perf_plot()
        perf_plot.ensure_matplotlib()  # before the runs, not after
    build = os.path.abspath(args.build)
    ensure_mpi()
    mpi_exe = build_mpi(build)
    loomrun = os.path.join(build, "bin", "loomrun")
    mpi_env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    hot = bool(args.hot or args.sizes)
    loom_bind = {"core": ["--bind-to", "core"], "none": ["--bind-to", "none"]}.get(args.bind_to, [])
    mpi_bind = {"core": ["--bind-to", "core:overload-allowed"], "none": ["--bind-to", "none"]}.get(args.bind_to, [])
    results = []
    for coll in colls:
        tool, mpi_name = COLLECTIVES[coll]
        perf = os.path.join(build, "bin", tool)
        for n in [int(x) for x in args.ranks.split(",")]:
            ranges = size_ranges(args, coll, n)
            loom_runs, mpi_runs = [], []
            for r in range(args.rounds):
                loom, mpi = {}, {}
                for b, e, iters, warm in ranges:
                    def run_loom():
                        loom.update(parse(run([loomrun, "-n", str(n)] + loom_bind + [
                            perf, "-b", b, "-e", e, "-f", "2", "-n", iters, "-w", warm,
                            "-c", "1" if r == 0 else "0", "--time_decimals", "4"]), ROW))
                    def run_mpi():
                        mpi.update(parse(run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(n)] +
                                             mpi_bind + ["--mca", "btl", "self,vader", "--mca", "pml", "ob1",
                                                         mpi_exe, "-o", mpi_name, "-b", b, "-e", e, "-f", "2",
                                                         "-n", iters, "-w", warm, "-d", "4"], env=mpi_env), MPI_ROW))
                    # loom first, then Open MPI first: a launch right after
                    # another runs differently, so neither always goes second.
                    for step in (run_loom, run_mpi) if r % 2 == 0 else (run_mpi, run_loom):
                        step()
                loom_runs.append(loom)
                mpi_runs.append(mpi)
            results.append((n, [("loom " + coll, loom_runs), ("Open MPI " + coll, mpi_runs)]))
            print("\n# %s, %d ranks, float%s, %d rounds (A B, then B A)%s%s; medians; ratio = loom / Open MPI" %
                  (coll, n, " sum" if coll in ("allreduce", "reducescatter") else "", args.rounds,
                   ", hot buffers" if hot else "", {"core": ", ranks bound to cores", "none": ", ranks unbound"}.get(args.bind_to, "")))
            print("#%11s  %9s %9s %7s %7s  %9s %9s %7s %7s" % ("size(B)", "loom oop", "mpi oop", "busbw", "time",
                                                             "loom ip", "mpi ip", "busbw", "time"))
            print("#%11s  %9s %9s %7s %7s  %9s %9s %7s %7s" % ("", "us", "us", "ratio", "ratio",
                                                             "us", "us", "ratio", "ratio"))
            for size in sorted(loom_runs[0]):
                if not all(size in x for x in loom_runs + mpi_runs):
                    continue
                med = lambda runs, key: statistics.median(x[size][key] for x in runs)
                def ratio(key):
                    # Tiny sizes print a busbw of 0.00: no ratio then.
                    vals = [la[size][key] / mb[size][key] for la, mb in zip(loom_runs, mpi_runs) if mb[size][key] > 0
                            and la[size][key] > 0]
                    return statistics.median(vals) if vals else float("nan")
                print("%12d  %9.3f %9.3f %7.2f %7.2f  %9.3f %9.3f %7.2f %7.2f" % (
                    size, med(loom_runs, "oop_us"), med(mpi_runs, "oop_us"), ratio("oop_bus"),
                    ratio("oop_us"), med(loom_runs, "ip_us"), med(mpi_runs, "ip_us"),
                    ratio("ip_bus"), ratio("ip_us")))
            sys.stdout.flush()
    if perf_plot:
        title = "%s, float: loom vs Open MPI, medians of %d rounds%s" % (
            ", ".join(colls), args.rounds, ", hot buffers" if hot else "")
        perf_plot.draw(plot_series(perf_plot, results, args.plot_inplace), args.plot, args.plot_inplace, title)
        print("# wrote %s" % args.plot)


if __name__ == "__main__":
    main()
