#!/usr/bin/env python3
"""2-rank DistributedDataParallel on one GPU through whatever libnccl.so.2
is loaded (tools/gpu_check.sh preloads loom's): after a few SGD steps on
half a batch each, both ranks' parameters must be identical, and equal
(within 1e-5 relative, as norms of the difference and of the reference) to
a 1-rank run on the full batch.
Prints "ddp: ok (relative difference ...)" and exits 0 on success.
Each rank first checks that loom is the NCCL it runs on (its extension
symbol is there, and the libnccl.so.2 mapped is the preloaded one); NVIDIA's
NCCL would refuse two ranks on one GPU anyway ("Duplicate GPU")."""
import ctypes
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 5
BATCH = 64


def exact_float32():
    # TF32 matmuls (allowed by some images) would blur the comparison.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def loom_loaded():
    try:
        ctypes.CDLL(None).loomSetBufferMode
    except AttributeError:
        return "loomSetBufferMode is not in this process: LD_PRELOAD did not bring loom's libnccl.so.2"
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if "libnccl" in line})
    preload = os.path.realpath(os.environ.get("LD_PRELOAD", ""))
    if any(os.path.realpath(m) != preload for m in mapped):
        return "another libnccl is mapped too: %s" % ", ".join(mapped)
    return None


def model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def data(device):
    g = torch.Generator().manual_seed(99)
    x = torch.randn(BATCH, 32, generator=g)
    y = torch.randn(BATCH, 8, generator=g)
    return x.to(device), y.to(device)


def train(net, x, y):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()


def rank_main(rank, world, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    why = loom_loaded()
    if why:
        raise SystemExit("ddp: FAILED: " + why)
    exact_float32()
    torch.cuda.set_device(0)  # both ranks on the one GPU
    dist.init_process_group("nccl", rank=rank, world_size=world)
    net = torch.nn.parallel.DistributedDataParallel(model().cuda(), device_ids=[0])
    x, y = data("cuda")
    half = BATCH // world
    train(net, x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])
    flat = torch.cat([p.detach().flatten() for p in net.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    torch.cuda.synchronize()
    if rank == 0:
        torch.save([g.cpu() for g in gathered], out)
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "loom_ddp_check_%d.pt" % os.getpid())
    mp.spawn(rank_main, args=(2, port, out), nprocs=2, join=True)
    ranks = torch.load(out)
    os.remove(out)
    if not torch.equal(ranks[0], ranks[1]):
        print("ddp: FAILED: the two ranks' parameters differ (max %g)" % (ranks[0] - ranks[1]).abs().max().item())
        return 1
    exact_float32()
    ref = model().cuda()
    x, y = data("cuda")
    train(ref, x, y)
    want = torch.cat([p.detach().flatten() for p in ref.parameters()]).cpu()
    rel = ((ranks[0] - want).norm() / want.norm()).item()
    if rel > 1e-5:
        print("ddp: FAILED: DDP and the full-batch run differ by %g relative" % rel)
        return 1
    print("ddp: ok (relative difference %g)" % rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
