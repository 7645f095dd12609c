#!/usr/bin/env python3
"""Parses the result table of nccl-tests output the way scripts written for
nccl-tests do (one regular expression per row, summary lines by prefix),
and checks loom's perf tools keep its exact column layout.

Usage: perf_table.py FILE   -- parses FILE, prints a summary, exits 1 if the
                               output does not parse as nccl-tests output.
"""
import re
import sys

# A data row: size count type redop root, then time algbw busbw #wrong for
# out-of-place and in-place; -S adds a timestamp at the end.
ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)"
    r"\s+(?P<oop_time>\S+)\s+(?P<oop_algbw>\S+)\s+(?P<oop_busbw>\S+)\s+(?P<oop_wrong>\S+)"
    r"\s+(?P<ip_time>\S+)\s+(?P<ip_algbw>\S+)\s+(?P<ip_busbw>\S+)\s+(?P<ip_wrong>\S+)"
    r"(?:\s+(?P<timestamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d))?\s*$")
OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
AVG_BUSBW = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)")
CONCLUDED = re.compile(r"^# Collective test concluded: (\S+)")
RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+) Group\s+(\d+) Pid\s+(\d+) on\s+(\S+) device\s+(-?\d+) \[([^\]]*)\] (.*)$")
HEADER = re.compile(r"^#\s+size\s+count\s+type\s+redop\s+root\s+(cpu)?time\s+algbw\s+busbw\s+#wrong"
                    r"\s+(cpu)?time\s+algbw\s+busbw\s+#wrong\s+(timestamp)?\s*$")



class ParseError(Exception):
    pass


def check_columns(line, row):
    """Checks nccl-tests' fixed layout: "%12li  %12li  %8s  %6s  %6s", then per
    placement "  %7s  %6s  %6s  %6g" or, unchecked, "  %7s  %6s  %6s    N/A"
    (one character narrower)."""
    cells = [("size", 0, 12), ("count", 14, 26), ("type", 28, 36), ("redop", 38, 44), ("root", 46, 52)]
    position = 52
    for placement in ("oop", "ip"):
        cells += [(placement + "_time", position + 2, position + 9),
                  (placement + "_algbw", position + 11, position + 17),
                  (placement + "_busbw", position + 19, position + 25)]
        if line.startswith("    N/A", position + 25):
            cells.append((placement + "_wrong", position + 25, position + 32))
            position += 32
        else:
            cells.append((placement + "_wrong", position + 27, position + 33))
            position += 33
    for name, start, end in cells:
        cell = line[start:end]
        separated = start == 0 or line[start - 2:start] == "  " or cell == "    N/A"
        if len(cell) != end - start or cell.strip() != row[name] or not separated:
            raise ParseError("column %s is not at %d..%d in: %r" % (name, start, end, line))
    if len(line.rstrip()) != position and not row.get("timestamp"):
        raise ParseError("row is %d characters long, expected %d: %r" % (len(line.rstrip()), position, line))


def number(text):
    return float(text)  # accepts "inf", "1e+06", "123.45"


def parse(text):
    result = {"rows": [], "ranks": [], "out_of_bounds": None, "oob_ok": None, "avg_busbw": None,
              "concluded": None, "header": False}
    for line in text.splitlines():
        if line.startswith("#"):
            if HEADER.match(line):
                result["header"] = True
            m = OUT_OF_BOUNDS.match(line)
            if m:
                result["out_of_bounds"] = int(m.group(1))
                result["oob_ok"] = m.group(2) == "OK"
            m = AVG_BUSBW.match(line)
            if m:
                result["avg_busbw"] = number(m.group(1))
            m = CONCLUDED.match(line)
            if m:
                result["concluded"] = m.group(1)
            m = RANK_LINE.match(line)
            if m:
                result["ranks"].append(int(m.group(1)))
            continue
        m = ROW.match(line)
        if not m:
            continue  # nccl-tests parsers skip anything else
        row = m.groupdict()
        check_columns(line, row)
        for key in ("oop_time", "oop_algbw", "oop_busbw", "ip_time", "ip_algbw", "ip_busbw"):
            row[key] = number(row[key])
        for key in ("oop_wrong", "ip_wrong"):
            if row[key] != "N/A":
                row[key] = int(number(row[key]))
        row["size"], row["count"], row["root"] = int(row["size"]), int(row["count"]), int(row["root"])
        result["rows"].append(row)
    if not result["header"]:
        raise ParseError("no table header line")
    if result["out_of_bounds"] is None or result["avg_busbw"] is None or result["concluded"] is None:
        raise ParseError("missing footer lines")
    return result


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[1]) as f:
        text = f.read()
    try:
        table = parse(text)
    except ParseError as error:
        print("parse error:", error)
        return 1
    print("%d rows, %d rank lines, out of bounds %d (%s), avg busbw %g, test %s" % (
        len(table["rows"]), len(table["ranks"]), table["out_of_bounds"],
        "OK" if table["oob_ok"] else "FAILED", table["avg_busbw"], table["concluded"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
