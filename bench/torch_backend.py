#!/usr/bin/env python3
"""loom's torch.distributed backend against gloo, side by side in one run.

Each rank holds two process groups over the same ranks, one loom (the
default group) and one gloo, and measures them alternately (loom, gloo,
gloo, loom, ... over the rounds): dist.all_reduce of float32 tensors from 1
KiB to 64 MiB, and a DistributedDataParallel training step of an MLP whose
gradients are about 40 MB (small batch, so that communication is a real
part of the step). A time is the slowest rank's mean over the iterations;
the ratio is gloo's time over loom's, the median over the rounds.

    bench/torch_backend.py --python build/torch-venv/bin/python \\
        --package-dir build/python --ranks 2 4 --rounds 3 --plot torch.png
"""
import argparse
import copy
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]


def iterations(nbytes):
    """Enough repetitions for a stable mean (loom's 1 KiB call takes ~15 us):
    at least ~30 ms of loom's calls from 256 KiB on (64 calls of 1 MiB, about
    10 ms, moved loom's mean by up to 2x between runs), little time at 64 MiB."""
    return max(4, min(2000, (1 << 28) // nbytes))


def rank_main(args):
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import loom_torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("loom", timeout=datetime.timedelta(seconds=600))
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"loom": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    results = {"allreduce": {}, "ddp": {}}

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=groups["gloo"])
        return float(t)

    def time_allreduce(group, nbytes):
        x = torch.ones(nbytes // 4)
        reps = iterations(nbytes)
        for _ in range(max(3, reps // 10)):  # warm-up: connections, buffers, waiting back to spinning
            dist.all_reduce(x, group=group)
        dist.barrier(group=groups["gloo"])
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x, group=group)
        return slowest((time.perf_counter() - start) / reps)

    width = args.ddp_width
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, 2 * width), nn.ReLU(),
                         nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, width))
    params = sum(p.numel() for p in base.parameters())
    models = {}
    for name, group in groups.items():  # the same model and data on both
        ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(base), process_group=group)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4))
    x = torch.randn(args.ddp_batch, width)
    y = torch.randn(args.ddp_batch, width)

    def time_ddp(name):
        model, opt = models[name]

        def step():
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        for _ in range(3):  # warm-up: the first steps of a model also grow the allocator's pools
            step()
        dist.barrier(group=groups["gloo"])
        start = time.perf_counter()
        for _ in range(args.ddp_steps):
            step()
        return slowest((time.perf_counter() - start) / args.ddp_steps)

    for rnd in range(args.rounds):
        order = ["loom", "gloo"] if rnd % 2 == 0 else ["gloo", "loom"]
        for nbytes in SIZES:
            for name in order:
                results["allreduce"].setdefault(str(nbytes), {}).setdefault(name, []).append(
                    time_allreduce(groups[name], nbytes))
        for name in order:
            results["ddp"].setdefault(name, []).append(time_ddp(name))
    results["ddp_params"] = params
    if rank == 0:
        print("RESULTS " + json.dumps(results), flush=True)
    dist.destroy_process_group()
    return 0


def run(args, nranks):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nranks):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(nranks),
                   LOCAL_RANK=str(r), LOOM_DEVICE="host", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                   PYTHONPATH=args.package_dir + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [args.python, os.path.abspath(__file__), "--rank-main", "--rounds", str(args.rounds), "--ddp-width",
               str(args.ddp_width), "--ddp-batch", str(args.ddp_batch), "--ddp-steps", str(args.ddp_steps)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=args.timeout)[0])
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for line in outputs[0].splitlines():
        if line.startswith("RESULTS "):
            return json.loads(line[len("RESULTS "):])
    sys.stderr.write("\n".join(outputs))
    raise SystemExit(f"{nranks} ranks: no results")


def human(nbytes):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="a Python with torch")
    ap.add_argument("--package-dir", default=os.path.join(os.path.dirname(__file__), "..", "build", "python"))
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ddp-width", type=int, default=1024, help="MLP width (1024: ~9.4M parameters, 38 MB)")
    ap.add_argument("--ddp-batch", type=int, default=8)
    ap.add_argument("--ddp-steps", type=int, default=20, help="timed DDP steps per round (5 gave ratios "
                    "that moved by 10%% between runs)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", help="also write the raw times here")
    ap.add_argument("--plot", help="draw bus bandwidth and time against size, loom and gloo, to this PNG "
                    "(tools/perf/perf_plot.py; needs matplotlib)")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        return rank_main(args)
    args.package_dir = os.path.abspath(args.package_dir)
    perf_plot = None
    if args.plot:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from compare_openmpi import load_perf_plot
        perf_plot = load_perf_plot()
        if "--python" not in sys.argv:  # ranks keep this Python if the plotter moves to another
            sys.argv += ["--python", args.python]
        perf_plot.ensure_matplotlib()  # before the runs, not after
    raw = {}
    for n in args.ranks:
        res = run(args, n)
        raw[n] = res
        print(f"\n{n} ranks, {args.rounds} rounds (loom and gloo alternating), time = slowest rank's mean")
        print(f"{'dist.all_reduce':>16} {'loom us':>11} {'gloo us':>11} {'gloo/loom':>10}")
        for nbytes in SIZES:
            t = res["allreduce"][str(nbytes)]
            ratio = statistics.median(g / l for l, g in zip(t["loom"], t["gloo"]))
            print(f"{human(nbytes):>16} {statistics.median(t['loom']) * 1e6:>11.1f} "
                  f"{statistics.median(t['gloo']) * 1e6:>11.1f} {ratio:>9.2f}x")
        d = res["ddp"]
        ratio = statistics.median(g / l for l, g in zip(d["loom"], d["gloo"]))
        mb = res["ddp_params"] * 4 / 1e6
        print(f"{'DDP step':>16} {statistics.median(d['loom']) * 1e3:>9.1f}ms {statistics.median(d['gloo']) * 1e3:>9.1f}ms "
              f"{ratio:>9.2f}x   ({res['ddp_params'] / 1e6:.1f}M parameters, {mb:.0f} MB of gradients, "
              f"batch {args.ddp_batch} per rank)")
    if perf_plot:
        series = []
        for n, res in raw.items():
            for name in ("loom", "gloo"):
                points = []
                for nbytes in SIZES:
                    t = statistics.median(res["allreduce"][str(nbytes)][name])
                    points.append((nbytes, t * 1e6, nbytes / t / 1e9 * 2 * (n - 1) / n))
                series.append(perf_plot.Series.from_points(f"{name}, {n} ranks", points, inplace=True))
        perf_plot.draw(series, args.plot, inplace=True,
                       title="torch.distributed all_reduce (float32, CPU): loom backend vs gloo")
        print(f"picture: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
