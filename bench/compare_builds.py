#!/usr/bin/env python3
"""Side-by-side AllReduce of two loom builds: before and after a change.

Runs all_reduce_perf of build A and build B alternately (A B, B A, A B ...,
--rounds rounds) through each build's loomrun, float sum, each size on its
own (-b = -e, buffers in place for both), and prints per size the medians
and the median of the per-round ratios B/A of bus bandwidth and of time,
out-of-place and in-place. busbw ratios > 1 (time ratios < 1) mean B is
faster. The first round of each build also checks the results (-c 1).

  bench/compare_builds.py --a /tmp/loom-before/build --b build --ranks 2,4 \\
      --sizes 8,64K,1M,64M --rounds 3

--a-env / --b-env KEY=VALUE[,KEY=VALUE] run a side with extra settings, so
one build can be compared with itself, e.g. the cost of deterministic mode:

  bench/compare_builds.py --a build --b build --b-env LOOM_DETERMINISTIC=1 \
      --ranks 2,4 --sizes 8,64K,1M,16M

--a-launch / --b-launch give a side loomrun options, e.g. how ranks that
outnumber the cores are placed:

  bench/compare_builds.py --a build --b build --a-launch="--bind-to none" \
      --ranks 4,8 --sizes 8,64K,1M,16M

--plot FILE.png also draws the medians (tools/perf/perf_plot.py): busbw and
time against size, A and B per rank count (out-of-place, or in-place with
--plot-inplace); needs matplotlib (python3-matplotlib).
"""
import argparse
import os
import shlex
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_openmpi import ROW, load_perf_plot, parse, parse_size, plot_series, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="build directory of the baseline")
    ap.add_argument("--b", required=True, help="build directory of the change")
    ap.add_argument("--a-env", default="", help="KEY=VALUE,... set for A's runs")
    ap.add_argument("--b-env", default="", help="KEY=VALUE,... set for B's runs")
    ap.add_argument("--a-launch", default="", help="loomrun options for A's runs, e.g. '--bind-to none'")
    ap.add_argument("--b-launch", default="", help="loomrun options for B's runs")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="8,64K,1M,64M")
    ap.add_argument("-n", default="50", help="timed iterations per size")
    ap.add_argument("-w", default="5", help="warm-up iterations per size")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--plot", metavar="PNG", help="also draw busbw and time against size to this PNG")
    ap.add_argument("--plot-inplace", action="store_true", help="draw the in-place columns")
    args = ap.parse_args()
    perf_plot = None
    if args.plot:
        perf_plot = load_perf_plot()
        perf_plot.ensure_matplotlib()  # before the runs, not after
    builds = {"A": args.a, "B": args.b}
    envs = {}
    for key, text in (("A", args.a_env), ("B", args.b_env)):
        env = dict(os.environ)
        for item in filter(None, text.split(",")):
            if "=" not in item:
                sys.exit("compare_builds: --%s-env wants KEY=VALUE, got %r" % (key.lower(), item))
            k, v = item.split("=", 1)
            env[k] = v
        envs[key] = env
    launch = {"A": shlex.split(args.a_launch), "B": shlex.split(args.b_launch)}
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = []
    for n in [int(x) for x in args.ranks.split(",")]:
        runs = {"A": [], "B": []}
        for r in range(args.rounds):
            # A B, then B A: a launch right after another runs differently
            # (4 ranks on 2 cores, AllReduce of 64 KiB: the second of two
            # identical runs took 1.3-1.5x the time), so neither side always
            # goes second.
            for key in ("A", "B") if r % 2 == 0 else ("B", "A"):
                build = builds[key]
                rows = {}
                for size in sizes:
                    rows.update(parse(run([os.path.join(build, "bin", "loomrun"), "-n", str(n)] + launch[key] + [
                                           os.path.join(build, "bin", "all_reduce_perf"), "-b", str(size),
                                           "-e", str(size), "-n", args.n, "-w", args.w,
                                           "-c", "1" if r == 0 else "0"], env=envs[key]), ROW))
                runs[key].append(rows)
        results.append((n, [("A", runs["A"]), ("B", runs["B"])]))
        print("\n# %d ranks, float sum, %d rounds (A B, then B A), each size alone; medians; ratio = B / A" %
              (n, args.rounds))
        print("#%11s  %9s %9s %7s %7s  %9s %9s %7s %7s" % ("size(B)", "A oop us", "B oop us", "busbw", "time",
                                                         "A ip us", "B ip us", "busbw", "time"))
        for size in sizes:
            if not all(size in x for x in runs["A"] + runs["B"]):
                continue
            med = lambda key, field: statistics.median(x[size][field] for x in runs[key])
            def ratio(field):
                r = [b[size][field] / a[size][field] for a, b in zip(runs["A"], runs["B"]) if a[size][field] > 0]
                return statistics.median(r) if r else float("nan")
            print("%12d  %9.2f %9.2f %7.2f %7.2f  %9.2f %9.2f %7.2f %7.2f" % (
                size, med("A", "oop_us"), med("B", "oop_us"), ratio("oop_bus"), ratio("oop_us"),
                med("A", "ip_us"), med("B", "ip_us"), ratio("ip_bus"), ratio("ip_us")))
    if perf_plot:
        title = "AllReduce float sum, medians of %d rounds: A = %s %s %s, B = %s %s %s" % (
            args.rounds, args.a, args.a_env, args.a_launch, args.b, args.b_env, args.b_launch)
        perf_plot.draw(plot_series(perf_plot, results, args.plot_inplace), args.plot, args.plot_inplace, title)
        print("# wrote %s" % args.plot)


if __name__ == "__main__":
    main()
