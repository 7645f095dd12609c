#!/usr/bin/env python3
"""Trains a small MLP with DistributedDataParallel on the loom backend (CPU).

    torchrun --nproc-per-node 4 examples/torch/ddp_train.py
    mpirun -np 4 python3 examples/torch/ddp_train.py
    python3 examples/torch/ddp_train.py --reference    # one process, full batch

loom_torch must be importable (PYTHONPATH=build/python, or installed with
`cmake --install build --component torch`). Under mpirun the rank and size
come from Open MPI's variables and the rendezvous from MASTER_ADDR /
MASTER_PORT (default 127.0.0.1:29500).

The dataset is fixed (seeded) and split into equal contiguous shards, one per
rank; DDP averages the gradients, so every step equals a full-batch step of
one process (--reference), up to float rounding. --out DIR writes each
rank's final parameters and losses to DIR/rank<R>.pt (reference.pt).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def launch_env():
    """Rank, size and local rank from torchrun's or Open MPI's variables."""
    for rank, size, local in (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
                              ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size]), int(os.environ.get(local, os.environ[rank]))
    sys.exit("ddp_train.py: no launcher variables (RANK/WORLD_SIZE from torchrun, OMPI_COMM_WORLD_* from mpirun); "
             "use --reference for one process")


def make_model(seed, width):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 4))


def make_data(samples):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 32, generator=g)
    w = torch.randn(32, 4, generator=g)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(samples, 4, generator=g)
    return x, y


def train(model, x, y, steps, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="loom", help="loom (default) or any torch backend, e.g. gloo")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--samples", type=int, default=96, help="global batch (divided among the ranks)")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-mb", type=float, default=0.005, help="DDP bucket size (small: several buckets)")
    ap.add_argument("--out", help="folder for the final parameters and losses")
    ap.add_argument("--reference", action="store_true", help="one process, the whole batch, no torch.distributed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, y = make_data(args.samples)

    if args.reference:
        model = make_model(0, args.width)
        losses = train(model, x, y, args.steps, args.lr)
        name = "reference"
    else:
        rank, size, _ = launch_env()
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        if args.backend == "loom" or args.backend.startswith("cpu:loom"):
            import loom_torch  # noqa: F401  (registers the backend)
        dist.init_process_group(args.backend, rank=rank, world_size=size)
        if args.samples % size:
            sys.exit(f"--samples {args.samples} is not divisible by {size} ranks")
        shard = args.samples // size
        # Each rank starts from a different init: DDP's broadcast of rank 0's
        # (which is the reference's) must make them equal.
        model = nn.parallel.DistributedDataParallel(make_model(rank, args.width), bucket_cap_mb=args.bucket_mb)
        losses = train(model, x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard], args.steps,
                       args.lr)
        name = f"rank{rank}"
        model = model.module
        if rank == 0:
            print(f"ddp_train: {size} ranks on {dist.get_backend()}, {args.steps} steps, "
                  f"rank 0 loss {losses[0]:.6f} -> {losses[-1]:.6f}", flush=True)
        dist.destroy_process_group()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses},
                   os.path.join(args.out, f"{name}.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
