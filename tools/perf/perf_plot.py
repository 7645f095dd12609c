#!/usr/bin/env python3
"""Draws bus bandwidth and time against message size from nccl-tests output.

  tools/perf/perf_plot.py -o out.png before.txt after.txt:patched
  build/bin/all_reduce_perf -t 2 -b 8 -e 16M | tools/perf/perf_plot.py -o ar.png -

Reads the result tables that nccl-tests (NVIDIA's) and loom's *_perf tools
print, and bench/mpi/mpi_coll_perf's table (size count, then time,
algbw, busbw out-of-place and in-place), and writes one PNG with two
panels: bus bandwidth (GB/s) and time (us, log scale) against size (bytes,
log2 scale), one line per series, several inputs overlaid. Out-of-place
columns by default, --inplace for the in-place ones.

Inputs: FILE, FILE:LABEL, or - (standard input; -:LABEL). A label may also
be given with --label, once per input, in order. The default label is the
file name without its extension.

Series: lines starting with # are comments, except that a
"# Collective test starting: NAME" line or a column header line starts a new
table. Inside a table, rows are grouped by (type, redop, root), so -d all,
-o all and -r -1 give one series per combination; a size seen again in the
same group (-N cycles, repeated runs pasted together) starts another series.
Only what differs between the series of one input is added to its label:
the collective, the type, the op, "root R", "#K" (the K-th table of that
collective) and "cycle K"; "-" placeholders are left out. Rows of size 0
are not drawn (log axis).

The comparison scripts' own ratio tables are not read: run
bench/compare_openmpi.py or bench/compare_builds.py with --plot FILE.png.

--print writes the parsed series as text instead of (or with -o, besides)
the picture. Exit status: 0, 1 for an input without data rows or that
cannot be read, 2 for bad usage, 3 when matplotlib is missing.

Needs matplotlib (Debian: python3-matplotlib) only to draw; when the running
python3 lacks it and /usr/bin/python3 has it, the tool runs again under
/usr/bin/python3.
"""
import argparse
import math
import os
import re
import sys

DATE = re.compile(r"^\d{4}-\d\d-\d\d$")
CLOCK = re.compile(r"^\d\d:\d\d:\d\d$")
STARTING = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
# "# mpi_coll_perf: allreduce, ..." names the table mpi_allreduce.
MPI_STARTING = re.compile(r"^#\s*(mpi_\w+):\s*(\w+)?")
COLUMN_HEADER = re.compile(r"^#\s*size(\(B\))?\s+count\b")
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p"]
PLACEMENT = {False: "out-of-place", True: "in-place"}


class InputError(Exception):
    pass


class Series:
    """One line on the plot: rows of one (collective, type, redop, root) run.

    rows: dicts with size, count, type, redop, root, and oop_/ip_ time
    (us), algbw and busbw (GB/s); a missing value ("-") is None."""

    def __init__(self, label, rows=None, **attributes):
        self.label = label
        self.rows = list(rows or [])
        self.attributes = attributes

    @classmethod
    def from_points(cls, label, points, inplace=False):
        """A series from (size, time_us, busbw) tuples, e.g. medians."""
        prefix = "ip_" if inplace else "oop_"
        return cls(label, [{"size": int(size), prefix + "time": time, prefix + "busbw": busbw}
                           for size, time, busbw in points])

    def points(self, inplace=False):
        """(size, time_us, busbw) sorted by size."""
        prefix = "ip_" if inplace else "oop_"
        return sorted((row["size"], row.get(prefix + "time"), row.get(prefix + "busbw")) for row in self.rows)


def number(text):
    if text in ("-", "N/A", "n/a"):
        return None
    try:
        return float(text)  # "inf", "1e+06" and "123.45" alike
    except ValueError:
        raise InputError("not a number: %r" % text)


def is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def parse_row(line):
    """A data row as a dict, or None when the line is not one."""
    tokens = line.split()
    if len(tokens) >= 2 and DATE.match(tokens[-2]) and CLOCK.match(tokens[-1]):
        tokens = tokens[:-2]  # -S timestamp
    if len(tokens) < 8 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    row = {"size": int(tokens[0]), "count": int(tokens[1])}
    if len(tokens) == 8 and all(is_number(t) for t in tokens):
        # bench/mpi/mpi_coll_perf: time algbw busbw, twice, no #wrong.
        row.update(type="-", redop="-", root="-")
        oop, ip = tokens[2:5], tokens[5:8]
    elif 11 <= len(tokens) <= 13 and not is_number(tokens[2]):
        # nccl-tests: type [redop] [root], then time algbw busbw #wrong, twice.
        names = tokens[2:-8]
        row["type"] = names[0]
        row["redop"], row["root"] = "-", "-"
        for name in names[1:]:
            if re.match(r"^-?\d+$", name) or name == "-":
                row["root"] = name
            else:
                row["redop"] = name
        oop, ip = tokens[-8:-5], tokens[-4:-1]
    else:
        return None
    try:
        for prefix, values in (("oop_", oop), ("ip_", ip)):
            row[prefix + "time"], row[prefix + "algbw"], row[prefix + "busbw"] = [number(v) for v in values]
    except InputError:
        return None
    return row


def parse_text(text, label):
    """The series of one input, labelled from `label`; InputError when the
    text has no data rows."""
    tables = []  # [name, {key: [Series, ...]}]
    current = None

    def start_table(name=None):
        nonlocal current
        if current is None or any(current[1].values()):
            current = [name, {}]
            tables.append(current)
        elif name:
            current[0] = name

    for line in text.splitlines():
        if line.startswith("#"):
            m = STARTING.match(line)
            mpi = MPI_STARTING.match(line)
            if m:
                start_table(m.group(1))
            elif mpi:
                coll = mpi.group(1) == "mpi_coll_perf" and mpi.group(2)
                start_table("mpi_" + coll if coll else mpi.group(1))
            elif COLUMN_HEADER.match(line):
                start_table()
            continue
        row = parse_row(line)
        if row is None:
            continue
        if current is None:
            start_table()
        key = (row["type"], row["redop"], row["root"])
        runs = current[1].setdefault(key, [])
        if not runs or any(r["size"] == row["size"] for r in runs[-1].rows):
            runs.append(Series(None, cycle=len(runs) + 1))
        runs[-1].rows.append(row)
    series = []
    seen = {}
    for name, groups in tables:
        if not groups:
            continue
        collective = re.sub(r"_perf$", "", name or "")
        seen[collective] = seen.get(collective, 0) + 1
        for (type_name, redop, root), runs in groups.items():
            for s in runs:
                s.attributes.update(collective=collective, table=seen[collective], type=type_name,
                                    redop=redop, root=root)
                series.append(s)
    if not series:
        raise InputError("no data rows (expected nccl-tests output: "
                         "size count type redop root time algbw busbw #wrong time algbw busbw #wrong)")
    parts = [("collective", "%s"), ("type", "%s"), ("redop", "%s"), ("root", "root %s"),
             ("table", "#%s"), ("cycle", "cycle %s")]
    varying = [(key, fmt) for key, fmt in parts if len({s.attributes[key] for s in series}) > 1]
    for s in series:
        words = [fmt % s.attributes[key] for key, fmt in varying if s.attributes[key] not in ("-", "")]
        s.label = " ".join([label] + words)
    return series


def split_input(argument):
    """FILE, FILE:LABEL, - or -:LABEL -> (path, label or None)."""
    if argument == "-" or os.path.exists(argument) or ":" not in argument:
        return argument, None
    path, label = argument.split(":", 1)
    return ("-" if path == "/dev/stdin" else path), label or None


def default_label(path):
    if path == "-":
        return "stdin"
    return os.path.splitext(os.path.basename(path))[0]


def read_inputs(arguments, labels=()):
    """The series of every input, in order; InputError names the input."""
    labels = list(labels)
    if len(labels) > len(arguments):
        raise InputError("%d --label for %d inputs" % (len(labels), len(arguments)))
    series = []
    for index, argument in enumerate(arguments):
        path, label = split_input(argument)
        if label is None:
            label = labels[index] if index < len(labels) else default_label(path)
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, errors="replace") as f:
                    text = f.read()
            series += parse_text(text, label)
        except OSError as error:
            raise InputError("%s: %s" % (path, error.strerror or error))
        except InputError as error:
            raise InputError("%s: %s" % ("standard input" if path == "-" else path, error))
    return series


def format_bytes(size):
    """8 -> "8", 1024 -> "1K", 1536 -> "1.5K", 1 << 30 -> "1G"."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return ("%.1f" % (size / scale)).rstrip("0").rstrip(".") + unit
    return "%g" % size


def format_number(value):
    if value is None:
        return "-"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def print_series(series, inplace=False, out=sys.stdout):
    for s in series:
        points = s.points(inplace)
        out.write("# %s (%s): %d rows\n" % (s.label, PLACEMENT[inplace], len(points)))
        out.write("#%11s  %10s  %10s\n" % ("size", "time(us)", "busbw"))
        for size, time, busbw in points:
            out.write("%12d  %10s  %10s\n" % (size, format_number(time), format_number(busbw)))


def size_ticks(low, high):
    """Powers of two between low and high, at most ~12, at exponents that
    are multiples of 1, 2, 5 or 10 (so 1K, 1M, 1G stay when thinned)."""
    first, last = math.floor(math.log2(low)), math.ceil(math.log2(high))
    for step in (1, 2, 5, 10):
        ticks = [2 ** e for e in range(first, last + 1) if e % step == 0 and low <= 2 ** e <= high]
        if len(ticks) <= 12:
            return ticks
    return ticks


def matplotlib_available():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def ensure_matplotlib():
    """Returns when matplotlib can be imported; otherwise runs this program
    again under /usr/bin/python3 (Debian's python3-matplotlib) when that is
    another interpreter, or exits with status 3."""
    if matplotlib_available():
        return
    system = "/usr/bin/python3"
    if (os.path.exists(system) and not os.environ.get("LOOM_PERF_PLOT_REEXEC")
            and os.path.realpath(sys.executable) != os.path.realpath(system)):
        os.environ["LOOM_PERF_PLOT_REEXEC"] = "1"
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(system, [system] + sys.argv)
    sys.stderr.write("perf_plot: matplotlib is missing (Debian: apt-get install python3-matplotlib)\n")
    sys.exit(3)


def draw(series, output, inplace=False, title=None):
    """Writes the two-panel PNG for `series` (Series objects) to `output`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    figure, (bw_axes, time_axes) = plt.subplots(1, 2, figsize=(14, 5.5), dpi=110)
    sizes = []
    for index, s in enumerate(series):
        points = [p for p in s.points(inplace) if p[0] > 0]
        style = dict(marker=MARKERS[index % len(MARKERS)], markersize=4, linewidth=1.4, label=s.label)
        bw = [(size, busbw) for size, _, busbw in points if busbw is not None and math.isfinite(busbw)]
        times = [(size, time) for size, time, _ in points if time is not None and math.isfinite(time) and time > 0]
        line = bw_axes.plot([p[0] for p in bw], [p[1] for p in bw], **style)[0]
        style["color"] = line.get_color()
        time_axes.plot([p[0] for p in times], [p[1] for p in times], **style)
        sizes += [p[0] for p in points]
    for axes in (bw_axes, time_axes):
        axes.set_xscale("log", base=2)
        if sizes:
            low, high = min(sizes), max(sizes)
            axes.set_xlim(low / 1.4, high * 1.4)
            axes.xaxis.set_major_locator(FixedLocator(size_ticks(low, high)))
        axes.xaxis.set_minor_locator(NullLocator())
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: format_bytes(value)))
        axes.set_xlabel("message size (bytes)")
        axes.grid(True, which="major", alpha=0.35)
    bw_axes.set_ylabel("bus bandwidth (GB/s)")
    bw_axes.set_ylim(bottom=0)
    bw_axes.set_title("bus bandwidth (%s)" % PLACEMENT[inplace])
    time_axes.set_yscale("log")
    time_axes.grid(True, which="minor", axis="y", alpha=0.15)
    time_axes.set_ylabel("time (us)")
    time_axes.set_title("time (%s)" % PLACEMENT[inplace])
    bw_axes.legend(fontsize="small", loc="best")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(output, format="png")
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="perf_plot.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [-h] [-o PNG] [--print] [--inplace] [--title TEXT] [--label LABEL]... "
              "INPUT[:LABEL] [INPUT[:LABEL] ...]")
    parser.add_argument("inputs", nargs="+", metavar="INPUT[:LABEL]", help="nccl-tests output file, or -")
    parser.add_argument("-o", "--output", metavar="PNG", help="the picture to write")
    parser.add_argument("--label", action="append", default=[], help="the N-th --label names the N-th input (unless it has :LABEL)")
    parser.add_argument("--inplace", action="store_true", help="the in-place columns (default out-of-place)")
    parser.add_argument("--title", help="a title above both panels")
    parser.add_argument("--print", dest="print_series", action="store_true", help="print the parsed series")
    # argparse takes "-:LABEL" for an option; /dev/stdin:LABEL reads the same.
    argv = ["/dev/stdin" + a[1:] if a.startswith("-:") else a for a in (sys.argv[1:] if argv is None else argv)]
    args = parser.parse_args(argv)
    if not args.output and not args.print_series:
        parser.error("nothing to do: give -o PNG and/or --print")
    if args.output:
        ensure_matplotlib()
    try:
        series = read_inputs(args.inputs, args.label)
    except InputError as error:
        sys.stderr.write("perf_plot: %s\n" % error)
        return 1
    if args.print_series:
        print_series(series, args.inplace)
    if args.output:
        draw(series, args.output, args.inplace, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
