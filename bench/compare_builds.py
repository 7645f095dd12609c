#!/usr/bin/env python3
"""Side-by-side AllReduce of two loom builds: before and after a change.

Runs all_reduce_perf of build A and build B alternately (A B A B ...,
--rounds rounds) through each build's loomrun, float sum, each size on its
own (-b = -e, buffers in place for both), and prints per size the medians
and the median of the per-round ratios B/A of bus bandwidth and of time,
out-of-place and in-place. busbw ratios > 1 (time ratios < 1) mean B is
faster. The first round of each build also checks the results (-c 1).

  bench/compare_builds.py --a /tmp/loom-before/build --b build --ranks 2,4 \\
      --sizes 8,64K,1M,64M --rounds 3
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_openmpi import ROW, parse, parse_size, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="build directory of the baseline")
    ap.add_argument("--b", required=True, help="build directory of the change")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="8,64K,1M,64M")
    ap.add_argument("-n", default="50", help="timed iterations per size")
    ap.add_argument("-w", default="5", help="warm-up iterations per size")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    builds = {"A": args.a, "B": args.b}
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    for n in [int(x) for x in args.ranks.split(",")]:
        runs = {"A": [], "B": []}
        for r in range(args.rounds):
            for key in ("A", "B"):
                build = builds[key]
                rows = {}
                for size in sizes:
                    rows.update(parse(run([os.path.join(build, "bin", "loomrun"), "-n", str(n),
                                           os.path.join(build, "bin", "all_reduce_perf"), "-b", str(size),
                                           "-e", str(size), "-n", args.n, "-w", args.w,
                                           "-c", "1" if r == 0 else "0"]), ROW))
                runs[key].append(rows)
        print("\n# %d ranks, float sum, %d rounds (A B alternating), each size alone; medians; ratio = B / A" %
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


if __name__ == "__main__":
    main()
