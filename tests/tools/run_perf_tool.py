#!/usr/bin/env python3
"""Runs one perf tool (as threads, or as processes through loomrun) and
checks its output like a script written for nccl-tests would.

run_perf_tool.py --tool PATH [--loomrun PATH --procs N] [--threads T]
                 [--expect-exit K] [--expect TEXT]... [--preload LIB]
                 [--env NAME=VALUE]... -- TOOL ARGS...

With --expect-exit 0 (the default): the exit status is 0, the table parses
(perf_table.py), every row reports 0 wrong elements (or N/A), the footer says
"# Out of bounds values : 0 OK", and there is one "Rank" line per rank.
Otherwise: the exit status is K and each --expect TEXT is in the output.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_table  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--loomrun")
    parser.add_argument("--procs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--expect-exit", type=int, default=0)
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--preload")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("args", nargs="*")
    options = parser.parse_args()

    command = [options.tool, "-t", str(options.threads)] + options.args
    if options.loomrun:
        command = [options.loomrun, "-n", str(options.procs), "--timeout", str(options.timeout - 30),
                   "--"] + command
    env = dict(os.environ)
    env.setdefault("LOOM_TIMEOUT_S", "120")  # a stuck library call fails instead of hanging
    if options.preload:
        env["LD_PRELOAD"] = options.preload
    for item in options.env:
        name, _, value = item.partition("=")
        env[name] = value
    print("+", " ".join(command), flush=True)
    try:
        run = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=options.timeout, universal_newlines=True)
    except subprocess.TimeoutExpired:
        print("FAIL: no result within %d s" % options.timeout)
        return 1
    print(run.stdout)

    failures = []
    if run.returncode != options.expect_exit:
        failures.append("exit status %d, expected %d" % (run.returncode, options.expect_exit))
    for text in options.expect:
        if text not in run.stdout:
            failures.append("output lacks %r" % text)
    if options.expect_exit == 0:
        try:
            table = perf_table.parse(run.stdout)
        except perf_table.ParseError as error:
            failures.append("table does not parse: %s" % error)
        else:
            if not table["rows"]:
                failures.append("no result rows")
            if table["out_of_bounds"] != 0 or not table["oob_ok"]:
                failures.append("footer does not say '# Out of bounds values : 0 OK'")
            for row in table["rows"]:
                for key in ("oop_wrong", "ip_wrong"):
                    if row[key] not in (0, "N/A"):
                        failures.append("row with %s wrong elements: %s" % (row[key], row))
            expected_ranks = list(range(options.procs * options.threads * options_gpus(options.args)))
            if sorted(table["ranks"]) != expected_ranks:
                failures.append("rank lines %s, expected %s" % (table["ranks"], expected_ranks))
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


def options_gpus(args):
    for i, arg in enumerate(args):
        if arg == "-g" and i + 1 < len(args):
            return int(args[i + 1])
    return 1


if __name__ == "__main__":
    sys.exit(main())
