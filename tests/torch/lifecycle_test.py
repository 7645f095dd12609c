#!/usr/bin/env python3
"""The loom backend's life around the collectives, one scenario per run:

  timeout  the group timeout is loom's operation timeout: a rank that never
           joins an all_reduce makes the others raise, naming it, soon after
           the timeout (set_timeout changes it later)
  death    a rank that dies makes the others raise DistBackendError with
           loom's message naming it, not hang
  split    new_group and split_group over ncclCommSplit (the default
           group bound to cpu:0: torch then splits, as for ProcessGroupNCCL)
  groups   new_group through the store (not bound), also with
           use_local_synchronization
  init_methods  init_method tcp:// and file:// instead of env://
  fork     DataLoader workers (fork) while the group lives; the group works
           after them
  abort    aborting the group makes its queued and later work fail at once
  mixed    backend "cpu:loom,cuda:nccl": CPU tensors go to loom (skips
           where torch cannot make its NCCL backend, as on machines with no
           GPU, and says so)

    lifecycle_test.py --package-dir build/python --scenario timeout --ranks 3
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ranks  # noqa: E402


def rank_main(scenario):
    import datetime

    import torch
    import torch.distributed as dist

    import loom_torch  # noqa: F401

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    say = lambda msg: print(f"rank {rank}: {msg}", flush=True)  # noqa: E731

    def expect_raise(fn, words, within_s):
        start = time.monotonic()
        try:
            fn()
        except Exception as e:
            took = time.monotonic() - start
            msg = str(e)
            say(f"raised {type(e).__name__} after {took:.1f} s: {msg.splitlines()[0][:300]}")
            missing = [w for w in words if w not in msg]
            assert not missing, f"the error lacks {missing}: {msg[:500]}"
            assert took < within_s, f"it took {took:.1f} s, more than {within_s} s"
            return e
        raise AssertionError("it did not raise")

    if scenario in ("timeout", "settimeout"):
        # timeout: the group's own, 2 s; settimeout: 600 s at init, then
        # dist.set_timeout to 1 s. The last rank never joins the second
        # all_reduce: the others fail after that many seconds. The rank
        # waiting for the missing one names it; the others name the rank
        # they wait for, which waits for it.
        seconds = 2 if scenario == "timeout" else 1
        dist.init_process_group("loom", timeout=datetime.timedelta(seconds=2 if scenario == "timeout" else 600))
        if scenario == "settimeout":
            dist.set_timeout(datetime.timedelta(seconds=seconds))
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert backend.comm_timeout() == datetime.timedelta(seconds=seconds), backend.comm_timeout()
        t = torch.ones(10)
        dist.all_reduce(t)  # everyone: fine
        if rank == n - 1:
            time.sleep(seconds + 6)  # never joins the next one
            os._exit(0)
        e = expect_raise(lambda: dist.all_reduce(t), ["loom", f"made no progress for {seconds} s (LOOM_TIMEOUT_S)"],
                         within_s=seconds + 5)
        assert isinstance(e, dist.DistBackendError), type(e)
        os._exit(0)  # the group is failed; no clean destroy needed

    if scenario == "death":
        dist.init_process_group("loom", timeout=datetime.timedelta(seconds=120))
        t = torch.ones(1 << 16)
        dist.all_reduce(t)
        if rank == n - 1:
            os._exit(3)  # dies between collectives
        expect_raise(lambda: [dist.all_reduce(t) for _ in range(3)], ["loom", f"rank {n - 1}"], within_s=30)
        os._exit(0)

    if scenario == "split":
        # Bound to a device: torch splits the default group for new_group.
        dist.init_process_group("loom", device_id=torch.device("cpu:0"))
        evens = [r for r in range(n) if r % 2 == 0]
        g = dist.new_group(evens)
        if rank in evens:
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=g)
            assert t.item() == sum(evens), (t, evens)
            assert dist.get_backend(g) == "loom"
        parts = [list(range(0, n, 2)), list(range(1, n, 2))] if n > 1 else [[0]]
        sub = dist.split_group(split_ranks=parts)
        mine = next(p for p in parts if rank in p)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=sub)
        assert t.item() == sum(r + 1 for r in mine), (t, mine)
        assert dist.get_world_size(sub) == len(mine) and dist.get_rank(sub) == mine.index(rank)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [float(n)] * 2
        dist.destroy_process_group()
        say("split ok")
        return 0

    if scenario == "groups":
        # Not bound to a device: each new group is a new communicator made
        # through the store, also with only its members taking part.
        dist.init_process_group("loom")
        odds = [r for r in range(n) if r % 2 == 1]
        g = dist.new_group(odds)
        last = [n - 1, 0]
        h = dist.new_group(last, use_local_synchronization=True) if rank in last else None
        for group, members in ((g, odds), (h, last)):
            if rank in members and group is not None:
                t = torch.tensor([float(rank)])
                dist.all_reduce(t, group=group)
                assert t.item() == sum(members), (t, members)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [float(n)] * 2
        dist.destroy_process_group()
        say("groups ok")
        return 0

    if scenario == "init_methods":
        # init_method tcp:// and file:// instead of the environment.
        addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"loom-init-{port}")
        for method in (f"tcp://{addr}:{port}", f"file://{path}"):
            dist.init_process_group("loom", init_method=method, rank=rank, world_size=n)
            t = torch.ones(3)
            dist.all_reduce(t)
            assert t.tolist() == [float(n)] * 3, (method, t)
            dist.destroy_process_group()
            say(f"{method.split(':')[0]}: ok")
        if rank == 0 and os.path.exists(path):
            os.unlink(path)
        return 0

    if scenario == "fork":
        dist.init_process_group("loom")

        class Squares(torch.utils.data.Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                return torch.tensor([float(i * i)])

        loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2,
                                             multiprocessing_context="fork")
        total = torch.zeros(1)
        for batch in loader:
            total += batch.sum()
            dist.all_reduce(batch)  # collectives while the workers live
        dist.all_reduce(total)
        assert total.item() == n * sum(i * i for i in range(16)), total
        dist.destroy_process_group()
        say("fork ok")
        return 0

    if scenario == "abort":
        dist.init_process_group("loom", timeout=datetime.timedelta(seconds=60))
        t = torch.ones(4)
        dist.all_reduce(t)
        if rank == 0:
            # A collective the others never join, aborted while it waits.
            work = dist.all_reduce(t, async_op=True)
            time.sleep(0.5)
            start = time.monotonic()
            dist.distributed_c10d._abort_process_group()
            expect_raise(work.wait, ["loom"], within_s=10)
            say(f"abort released the waiting work in {time.monotonic() - start:.1f} s")
        os._exit(0)

    if scenario == "mixed":
        try:
            dist.init_process_group("cpu:loom,cuda:nccl")
        except Exception as e:
            if not torch.cuda.is_available():
                say(f"SKIP: torch made no NCCL backend here (no GPU): {str(e).splitlines()[0][:200]}")
                return torch_ranks.SKIP
            raise
        t = torch.ones(5)
        dist.all_reduce(t)
        assert t.tolist() == [float(n)] * 5
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert type(backend).__name__ == "LoomBackend", type(backend)
        if torch.cuda.is_available():
            c = torch.ones(5, device="cuda")
            dist.all_reduce(c)
            assert c.tolist() == [float(n)] * 5
        dist.destroy_process_group()
        say("mixed ok")
        return 0

    raise SystemExit(f"unknown scenario {scenario}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package-dir")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        return rank_main(args.scenario)
    env = torch_ranks.torch_env(args.package_dir, {"LOOM_STALL_WARN_S": "0"})
    if args.scenario == "mixed":
        env.pop("CUDA_VISIBLE_DEVICES", None)
    results = torch_ranks.run_ranks([sys.executable, os.path.abspath(__file__), "--rank-main", "--scenario",
                                     args.scenario], args.ranks, env, args.timeout)
    expected = {"death": {args.ranks - 1: 3}}.get(args.scenario, {})
    codes = [rc for rc, _ in results]
    torch_ranks.report(results, f"{args.scenario}, {args.ranks} ranks")
    if all(rc == torch_ranks.SKIP for rc in codes):
        return torch_ranks.SKIP
    bad = [r for r, rc in enumerate(codes) if rc != expected.get(r, 0)]
    if bad:
        print(f"FAIL: ranks {bad} exited {[codes[r] for r in bad]}")
        return 1
    print(f"{args.scenario}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
