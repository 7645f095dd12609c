#!/usr/bin/env python3
"""Checks tools/perf/perf_plot.py on the stored nccl-tests sample and a loom
sample (loom_all_reduce_sample.txt: build/bin/all_reduce_perf -t 2 -b 8
-e 64K -f 4 -c 1, LOOM_DEVICE=host), and the comparison scripts' --plot
series.

Usage: perf_plot_test.py parse   -- --print output, errors, compare series
       perf_plot_test.py png     -- the picture; exits 77 (skipped) when
                                    no python3 here has matplotlib
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(ROOT, "tools", "perf", "perf_plot.py")
NVIDIA = os.path.join(HERE, "nccl_tests_sample.txt")
LOOM = os.path.join(HERE, "loom_all_reduce_sample.txt")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what)


def tool(*args, stdin=None):
    return subprocess.run([sys.executable, TOOL] + list(args), input=stdin, capture_output=True, text=True,
                          timeout=120)


def printed(output):
    """--print output -> {label: [(size, time, busbw), ...]} (strings)."""
    series, current = {}, None
    for line in output.splitlines():
        m = re.match(r"^# (.*) \((out-of-place|in-place)\): (\d+) rows$", line)
        if m:
            current = series.setdefault(m.group(1), [])
        elif not line.startswith("#") and line.strip():
            size, time, busbw = line.split()
            current.append((int(size), time, busbw))
    return series


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parse():
    p = tool("--print", LOOM + ":loom", NVIDIA)
    check(p.returncode == 0, "--print exits 0: %s" % p.stderr)
    series = printed(p.stdout)
    check(list(series) == ["loom", "nccl_tests_sample float sum root -1", "nccl_tests_sample float none root 3",
                           "nccl_tests_sample double avg root -1"], "series labels: %s" % list(series))
    loom = series.get("loom", [])
    check([row[0] for row in loom] == [8, 32, 128, 512, 2048, 8192, 32768], "loom sizes: %s" % loom)
    check((2048, "13.18", "0.16") in loom and (32768, "15.79", "2.08") in loom and (8, "7.41", "0") in loom,
          "loom out-of-place rows: %s" % loom)
    check(series.get("nccl_tests_sample float sum root -1") == [(134217728, "1234.56", "190.26")],
          "nccl-tests 128M row")
    check(series.get("nccl_tests_sample double avg root -1") == [(8, "12345.7", "123457")], "nccl-tests 8 B row")

    p = tool("--print", "--inplace", "--label", "a", "--label", "b", LOOM, NVIDIA)
    series = printed(p.stdout)
    check((32768, "11.35", "2.89") in series.get("a", []), "loom in-place 32K row: %s" % series.get("a"))
    check(series.get("b double avg root -1") == [(8, "1234568", "1000000")], "nccl-tests in-place 8 B row")

    # Two tables of one collective on standard input: one series each.
    with open(LOOM) as f:
        text = f.read()
    p = tool("--print", "-:twice", stdin=text + text)
    check(sorted(printed(p.stdout)) == ["twice #1", "twice #2"], "two tables: %s" % p.stdout[:200])
    # The same sizes again without a new table header: a second cycle.
    rows = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    series = printed(tool("--print", "-", stdin=rows + rows).stdout)
    check(sorted(series) == ["stdin cycle 1", "stdin cycle 2"] and len(series["stdin cycle 2"]) == 7,
          "two cycles: %s" % sorted(series))

    # Rows without redop/root, with "-" placeholders, and mpi_coll_perf's.
    odd = ("# Collective test starting: sendrecv_perf\n"
           "        1024           256     float     1.50    0.68    0.68       0     1.40    0.73    0.73    N/A\n"
           "        4096          1024     float     -       -       -          0     1.40    2.93    2.93    N/A\n"
           "# mpi_coll_perf: allreduce, 2 ranks, float sum, iters 20, warmup 2\n"
           "        1024           256       2.5    0.41    0.41       2.4    0.43    0.43\n")
    series = printed(tool("--print", "-:x", stdin=odd).stdout)
    check(series == {"x sendrecv float": [(1024, "1.5", "0.68"), (4096, "-", "-")],
                     "x mpi_allreduce": [(1024, "2.5", "0.41")]}, "odd rows: %s" % series)

    # No rows: a clear error and a nonzero exit.
    with tempfile.TemporaryDirectory() as tmp:
        empty = os.path.join(tmp, "empty.txt")
        with open(empty, "w") as f:
            f.write("# nccl-tests version 2.19.6\n# Collective test starting: all_reduce_perf\n"
                    "all_reduce_perf: invalid type\n")
        p = tool("--print", LOOM, empty)
        check(p.returncode == 1 and "empty.txt: no data rows" in p.stderr, "no rows: %d %s" % (p.returncode, p.stderr))
        p = tool("--print", os.path.join(tmp, "missing.txt"))
        check(p.returncode == 1 and "missing.txt" in p.stderr, "missing file: %s" % p.stderr)
    p = tool(LOOM)
    check(p.returncode == 2 and "-o PNG" in p.stderr, "nothing to do: %s" % p.stderr)

    # The comparison scripts' --plot series: medians over rounds, sizes all rounds have.
    perf_plot = load(TOOL, "perf_plot")
    compare = load(os.path.join(ROOT, "bench", "compare_openmpi.py"), "compare_openmpi")

    def rows(*values):
        return {size: {"oop_us": t, "oop_bus": b, "ip_us": t / 2, "ip_bus": b * 2} for size, t, b in values}

    loom_runs = [rows((8, 1.0, 0.1), (1024, 4.0, 2.0)), rows((8, 3.0, 0.3), (1024, 2.0, 4.0)),
                 rows((8, 2.0, 0.2), (1024, 3.0, 3.0), (2048, 9.0, 9.0))]
    mpi_runs = [rows((8, 5.0, 0.5), (1024, 6.0, 1.0), (2048, 1.0, 1.0))]
    series = compare.plot_series(perf_plot, [(2, [("loom", loom_runs), ("Open MPI", mpi_runs)])])
    check([s.label for s in series] == ["loom, 2 ranks", "Open MPI, 2 ranks"], "compare labels")
    check(series[0].points() == [(8, 2.0, 0.2), (1024, 3.0, 3.0)], "compare medians: %s" % series[0].points())
    series = compare.plot_series(perf_plot, [(4, [("A", loom_runs), ("B", mpi_runs)])], inplace=True)
    check(series[1].points(True) == [(8, 2.5, 1.0), (1024, 3.0, 2.0)], "compare in-place: %s" % series[1].points(True))


def test_png():
    with tempfile.TemporaryDirectory() as tmp:
        png = os.path.join(tmp, "out.png")
        p = tool("-o", png, "--title", "all_reduce", LOOM + ":loom", NVIDIA + ":nvidia")
        if p.returncode == 3 and "matplotlib" in p.stderr:
            print("skipped:", p.stderr.strip())
            return 77
        check(p.returncode == 0, "-o exits 0: %s" % p.stderr)
        data = open(png, "rb").read() if os.path.exists(png) else b""
        check(len(data) > 1000 and data.startswith(b"\x89PNG\r\n\x1a\n"), "a PNG of %d bytes" % len(data))
        # Width and height from the IHDR chunk: two panels side by side.
        if len(data) > 24:
            width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
            check(width > height > 300, "picture is %dx%d" % (width, height))
        p = tool("-o", os.path.join(tmp, "empty.png"), "-", stdin="# nothing\n")
        check(p.returncode == 1 and "no data rows" in p.stderr, "no rows with -o: %s" % p.stderr)
        check(not os.path.exists(os.path.join(tmp, "empty.png")), "no picture without rows")
    return 0


def main(argv):
    if len(argv) != 2 or argv[1] not in ("parse", "png"):
        print(__doc__)
        return 2
    status = test_parse() if argv[1] == "parse" else test_png()
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    return status or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
