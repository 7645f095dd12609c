#!/usr/bin/env python3
"""Every torch.distributed collective on the loom backend against gloo's
answer for the same inputs (the default group is loom, a second group over
the same ranks is gloo). Where gloo has no answer (AVG, PREMUL_SUM, the
types gloo lacks) the expected value is computed from every rank's inputs,
which each rank can rebuild (seeded by rank). Also: the errors loom raises
for what it does not support, synchronously and with its message.

    collectives_test.py --package-dir build/python --ranks 4
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ranks  # noqa: E402


def rank_main():
    import datetime

    import torch
    import torch.distributed as dist

    import loom_torch  # noqa: F401  (registers "loom")

    dist.init_process_group("loom", timeout=datetime.timedelta(seconds=120))
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    assert dist.get_backend() == "loom", dist.get_backend()
    failures, checks = [], [0]

    def expect(name, got, want, exact=True):
        checks[0] += 1
        if got.dtype != want.dtype or got.shape != want.shape:
            failures.append(f"{name}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}")
            return
        if exact:
            if got.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # no equal() on float8: compare bits
                got, want = got.view(torch.uint8), want.view(torch.uint8)
            ok = torch.equal(got, want)
        else:
            ok = torch.allclose(got.double(), want.double(), rtol=1e-2, atol=1e-2)
        if not ok:
            diff = (got.double() - want.double()).abs()
            idx = int(diff.argmax()) if diff.numel() else 0
            failures.append(f"{name}: differs (max at {idx}: got {got.flatten()[idx].item()}, "
                            f"want {want.flatten()[idx].item()})")

    def case(name, fn):
        try:
            fn()
        except Exception as e:  # a failure of one case, reported with the others
            failures.append(f"{name}: {type(e).__name__}: {e}")

    def data(dtype, numel, r, seed=0, lo=-4, hi=5):
        g = torch.Generator().manual_seed(1000 * seed + r)
        if dtype == torch.bool:
            return torch.randint(0, 2, (numel,), generator=g).bool()
        if dtype in (torch.uint8, torch.uint32, torch.uint64):
            lo = max(lo, 0)
        v = torch.randint(lo, hi, (numel,), generator=g)
        if dtype.is_complex:
            return torch.complex(v.float(), torch.randint(lo, hi, (numel,), generator=g).float()).to(dtype)
        return v.to(dtype)

    ops = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
           "MAX": dist.ReduceOp.MAX}
    gloo_types = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                  torch.int32, torch.int64]
    sizes = [1, 1000, 300_000]  # one element, small, and past loom's 1 MiB slices for float32

    def both(fn, x):
        """fn on loom and on gloo, each on its own copy of x."""
        a, b = x.clone(), x.clone()
        fn(a, None)
        fn(b, gloo)
        return a, b

    # ---- AllReduce: every gloo type, op and size -----------------------
    for dt in gloo_types:
        for opname, op in ops.items():
            for numel in sizes if dt == torch.float32 else sizes[:2]:
                lo, hi = (1, 3) if opname == "PRODUCT" else (-4, 5)
                x = data(dt, numel, rank, seed=numel, lo=lo, hi=hi)

                def run(x=x, op=op, dt=dt, opname=opname, numel=numel):
                    a, b = both(lambda t, g: dist.all_reduce(t, op=op, group=g), x)
                    expect(f"all_reduce {dt} {opname} n={numel}", a, b)
                case(f"all_reduce {dt} {opname}", run)

    # Random (not integer-valued) floats: the same bits as gloo on 2 ranks,
    # where both add the two values in either order; close on more.
    def random_floats():
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(5000, generator=g)
        a, b = both(lambda t, grp: dist.all_reduce(t, group=grp), x)
        expect("all_reduce float32 random", a, b, exact=(n == 2))
    case("all_reduce random", random_floats)

    # Non-contiguous and multi-dimensional tensors.
    def strided():
        x = data(torch.float32, 64 * 6, rank).view(64, 6)[:, ::2]  # a strided view
        a, b = x.clone(), x.clone()
        a = x.t()  # non-contiguous alias to reduce into
        b = x.clone().t()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        expect("all_reduce strided", a.contiguous(), b.contiguous())
    case("all_reduce strided", strided)

    # ---- Types gloo lacks and the ops it lacks: against the inputs -----
    def all_inputs(dt, numel, **kw):
        return [data(dt, numel, r, **kw) for r in range(n)]

    for dt in [torch.uint32, torch.uint64, torch.bool]:
        def run(dt=dt):
            xs = all_inputs(dt, 777, lo=0, hi=3)
            for opname, op in ops.items():
                t = xs[rank].clone()
                dist.all_reduce(t, op=op)
                if dt == torch.bool:
                    want = {"SUM": torch.stack(xs).any(0), "PRODUCT": torch.stack(xs).all(0),
                            "MIN": torch.stack(xs).all(0), "MAX": torch.stack(xs).any(0)}[opname]
                else:
                    s = torch.stack([v.to(torch.int64) for v in xs])
                    want = {"SUM": s.sum(0), "PRODUCT": s.prod(0), "MIN": s.min(0).values,
                            "MAX": s.max(0).values}[opname].to(dt)
                expect(f"all_reduce {dt} {opname}", t, want)
        case(f"all_reduce {dt}", run)

    for dt in [torch.float8_e4m3fn, torch.float8_e5m2]:
        def run(dt=dt):
            xs = [data(torch.float32, 500, r, lo=-2, hi=3).to(dt) for r in range(n)]
            t = xs[rank].clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            want = torch.stack([v.float() for v in xs]).max(0).values.to(dt)
            expect(f"all_reduce {dt} MAX", t, want)
        case(f"all_reduce {dt}", run)

    for dt in [torch.float32, torch.float64, torch.bfloat16]:
        def run(dt=dt):
            xs = all_inputs(dt, 1000)
            t = xs[rank].clone()
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            want = (torch.stack([v.double() for v in xs]).sum(0) / n).to(dt)
            expect(f"all_reduce {dt} AVG", t, want, exact=False)
            for factor in [0.5, torch.tensor([0.25], dtype=dt)]:
                t = xs[rank].clone()
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
                f = float(factor) if not torch.is_tensor(factor) else float(factor.item())
                want = (torch.stack([v.double() for v in xs]).sum(0) * f).to(dt)
                expect(f"all_reduce {dt} PREMUL_SUM({type(factor).__name__})", t, want, exact=False)
        case(f"all_reduce {dt} AVG/PREMUL_SUM", run)

    def complex_sum():
        xs = all_inputs(torch.complex64, 300)
        t = xs[rank].clone()
        dist.all_reduce(t)
        expect("all_reduce complex64 SUM", t, torch.stack(xs).sum(0))
    case("all_reduce complex64", complex_sum)

    # ---- The other collectives against gloo ----------------------------
    for dt in [torch.float32, torch.float16, torch.int64, torch.uint8]:
        x = data(dt, 1001, rank, seed=7)

        def run(dt=dt, x=x):
            root = n - 1
            a, b = both(lambda t, g: dist.broadcast(t, src=1 % n, group=g), x)
            expect(f"broadcast {dt}", a, b)
            a, b = both(lambda t, g: dist.reduce(t, dst=root, group=g), x)
            if rank == root:
                expect(f"reduce {dt}", a, b)
            else:
                expect(f"reduce {dt} (non-root keeps its input)", a, x)
            la = [torch.empty_like(x) for _ in range(n)]
            lb = [torch.empty_like(x) for _ in range(n)]
            dist.all_gather(la, x)
            dist.all_gather(lb, x, group=gloo)
            expect(f"all_gather {dt}", torch.stack(la), torch.stack(lb))
            fa, fb = torch.empty(n * x.numel(), dtype=dt), torch.empty(n * x.numel(), dtype=dt)
            dist.all_gather_into_tensor(fa, x)
            dist.all_gather_into_tensor(fb, x, group=gloo)
            expect(f"all_gather_into_tensor {dt}", fa, fb)
            big = data(dt, n * 333, rank, seed=8)
            oa, ob = torch.empty(333, dtype=dt), torch.empty(333, dtype=dt)
            dist.reduce_scatter_tensor(oa, big)
            dist.reduce_scatter_tensor(ob, big, group=gloo)
            expect(f"reduce_scatter_tensor {dt}", oa, ob)
            parts = list(big.chunk(n))
            oa, ob = torch.empty(333, dtype=dt), torch.empty(333, dtype=dt)
            dist.reduce_scatter(oa, parts)
            dist.reduce_scatter(ob, parts, group=gloo)
            expect(f"reduce_scatter {dt}", oa, ob)
            oa, ob = torch.empty_like(big), torch.empty_like(big)
            dist.all_to_all_single(oa, big)
            dist.all_to_all_single(ob, big, group=gloo)
            expect(f"all_to_all_single {dt}", oa, ob)
            # Uneven splits: rank r sends r + j + 1 rows to rank j.
            ins = [rank + j + 1 for j in range(n)]
            outs = [j + rank + 1 for j in range(n)]
            src = data(dt, sum(ins) * 3, rank, seed=9).view(-1, 3)
            oa, ob = torch.empty(sum(outs), 3, dtype=dt), torch.empty(sum(outs), 3, dtype=dt)
            dist.all_to_all_single(oa, src, outs, ins)
            dist.all_to_all_single(ob, src, outs, ins, group=gloo)
            expect(f"all_to_all_single uneven {dt}", oa, ob)
            la = [torch.empty(5, dtype=dt) for _ in range(n)]
            lb = [torch.empty(5, dtype=dt) for _ in range(n)]
            sends = [data(dt, 5, rank, seed=10 + j) for j in range(n)]
            dist.all_to_all(la, sends)
            dist.all_to_all(lb, sends, group=gloo)
            expect(f"all_to_all {dt}", torch.stack(la), torch.stack(lb))
            ga = [torch.empty_like(x) for _ in range(n)] if rank == root else None
            gb = [torch.empty_like(x) for _ in range(n)] if rank == root else None
            dist.gather(x, ga, dst=root)
            dist.gather(x, gb, dst=root, group=gloo)
            if rank == root:
                expect(f"gather {dt}", torch.stack(ga), torch.stack(gb))
            sa, sb = torch.empty_like(x), torch.empty_like(x)
            chunks = [data(dt, 1001, j, seed=11) for j in range(n)] if rank == 0 else None
            dist.scatter(sa, chunks, src=0)
            dist.scatter(sb, chunks, src=0, group=gloo)
            expect(f"scatter {dt}", sa, sb)
        case(f"collectives {dt}", run)

    # Send/recv around a ring, both directions, tags ignored as NCCL does.
    def ring():
        for dt in [torch.float32, torch.int16]:  # int16: no loom type, moved as bytes
            x = data(dt, 4097, rank, seed=12)
            got = torch.empty_like(x)
            right, left = (rank + 1) % n, (rank - 1) % n
            if rank % 2 == 0:
                dist.send(x, right)
                dist.recv(got, left)
            else:
                dist.recv(got, left)
                dist.send(x, right)
            expect(f"send/recv {dt}", got, data(dt, 4097, left, seed=12))
            reqs = [dist.isend(x, left), dist.irecv(got, right)]
            if rank % 2:
                reqs.reverse()
            for q in reqs:
                q.wait()
            expect(f"isend/irecv {dt}", got, data(dt, 4097, right, seed=12))
    case("send/recv", ring)

    # batch_isend_irecv: every rank sends to one neighbour and receives from
    # the other, 4 MiB each way (more than a transport buffer holds: only a
    # group lets both go at once).
    def batched_p2p():
        x = data(torch.float32, 1 << 20, rank, seed=16)
        got = [torch.empty_like(x), torch.empty_like(x)]
        right, left = (rank + 1) % n, (rank - 1) % n
        ops = [dist.P2POp(dist.isend, x, right), dist.P2POp(dist.irecv, got[0], left),
               dist.P2POp(dist.isend, x, left), dist.P2POp(dist.irecv, got[1], right)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        expect("batch_isend_irecv from the left", got[0], data(torch.float32, 1 << 20, left, seed=16))
        expect("batch_isend_irecv from the right", got[1], data(torch.float32, 1 << 20, right, seed=16))
    case("batch_isend_irecv", batched_p2p)

    # The caller's thread-local state reaches the worker: an async
    # all_gather into a list (copies on the worker) under inference mode.
    def inference_mode():
        with torch.inference_mode():
            x = data(torch.float32, 10, rank, seed=17)
            outs = [torch.empty_like(x) for _ in range(n)]
            dist.all_gather(outs, x, async_op=True).wait()
        expect("all_gather under inference_mode", torch.stack(outs),
               torch.stack([data(torch.float32, 10, r, seed=17) for r in range(n)]))
    case("inference_mode", inference_mode)

    # A future callback that runs another collective of the group and waits
    # for it (as PowerSGD's DDP hook does) must not hang the group.
    def nested_callback():
        t = torch.ones(8)

        def then(fut):
            inner = torch.full((4,), 2.0)
            dist.all_reduce(inner, async_op=True).get_future().wait()
            return inner
        inner = dist.all_reduce(t, async_op=True).get_future().then(then).wait()
        expect("all_reduce inside a future callback", inner, torch.full((4,), 2.0 * n))
        expect("the outer all_reduce", t, torch.full((8,), float(n)))
    case("nested callback", nested_callback)

    # The object collectives training scripts use (pickles in uint8 tensors
    # of per-rank sizes).
    def objects():
        checks[0] += 1
        got = [None] * n
        dist.all_gather_object(got, {"rank": rank, "pad": "x" * (rank * 37)})
        objs = [{"a": 1}, [1, 2, 3]] if rank == 0 else [None, None]
        dist.broadcast_object_list(objs, src=0)
        gathered = [None] * n if rank == 0 else None
        dist.gather_object(rank * 10, gathered, dst=0)
        mine = [None]
        dist.scatter_object_list(mine, [f"part{i}" for i in range(n)] if rank == 0 else None, src=0)
        want = [{"rank": r, "pad": "x" * (r * 37)} for r in range(n)]
        if got != want or objs != [{"a": 1}, [1, 2, 3]] or mine != [f"part{rank}"] or \
                (rank == 0 and gathered != [r * 10 for r in range(n)]):
            failures.append(f"object collectives: {got} {objs} {gathered} {mine}")
    case("object collectives", objects)

    def coalesced():
        ts = [data(torch.float32, 10, rank, seed=13), data(torch.float32, 20, rank, seed=14)]
        a = [t.clone() for t in ts]
        b = [t.clone() for t in ts]
        dist.all_reduce_coalesced(a)
        dist.all_reduce_coalesced(b, group=gloo)
        for i in range(2):
            expect(f"all_reduce_coalesced [{i}]", a[i], b[i])
    case("all_reduce_coalesced", coalesced)

    def barrier_and_async():
        dist.barrier()
        t = data(torch.float32, 100, rank, seed=15)
        works = [dist.all_reduce(t, async_op=True) for _ in range(3)]
        fut = works[-1].get_future()
        for w in works:
            w.wait()
        val = fut.wait()
        assert isinstance(val, list) and torch.equal(val[0], t), "the future's value is not the output tensor"
        # Three SUMs in a row, in order: S, then n·S, then n²·S.
        want = torch.stack([data(torch.float32, 100, r, seed=15) for r in range(n)]).sum(0) * n * n
        expect("three async all_reduce", t, want)
    case("barrier/async", barrier_and_async)

    # ---- What loom refuses, at the call, with its reason ----------------
    def refuses(name, fn, words):
        checks[0] += 1
        try:
            fn()
        except Exception as e:
            msg = str(e)
            if not all(w in msg for w in words):
                failures.append(f"{name}: raised {type(e).__name__} without {words}: {msg[:300]}")
            return
        failures.append(f"{name}: did not raise")

    refuses("BAND", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND),
            ["loom", "BAND", "not supported"])
    refuses("int16 SUM", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), ["loom", "no reduction"])
    refuses("bool AVG", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=dist.ReduceOp.AVG),
            ["loom", "AVG", "bool"])
    refuses("complex MAX", lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=dist.ReduceOp.MAX),
            ["complex"])  # torch refuses it before loom sees it
    refuses("sparse", lambda: dist.all_reduce(torch.ones(3).to_sparse()), ["loom"])
    refuses("recv any source", lambda: dist.recv(torch.ones(3)), ["loom", "any source"])
    refuses("broadcast root", lambda: dist.broadcast(torch.ones(3), src=n + 5), [])
    refuses("all_gather list", lambda: dist.all_gather([torch.ones(3)] * (n + 1), torch.ones(3)),
            ["loom", "one per rank"])
    refuses("all_to_all_single splits", lambda: dist.all_to_all_single(torch.ones(n), torch.ones(n), [1] * n, [2] * n),
            ["loom", "split sizes"])
    refuses("all_gather_into_tensor size",
            lambda: dist.all_gather_into_tensor(torch.ones(n + 1), torch.ones(1)), ["loom", "elements"])

    # Every rank learns every rank's failures (over gloo), so that all exit alike.
    counts = torch.tensor([len(failures)])
    dist.all_reduce(counts, group=gloo)
    for f in failures:
        print(f"rank {rank}: FAIL {f}")
    print(f"rank {rank}: {checks[0]} checks, {len(failures)} failed here, {int(counts)} on all ranks")
    dist.destroy_process_group()
    return 0 if int(counts) == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--package-dir", help="folder holding loom_torch (build/python)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_main:
        return rank_main()
    env = torch_ranks.torch_env(args.package_dir)
    results = torch_ranks.run_ranks([sys.executable, os.path.abspath(__file__), "--rank-main"], args.ranks, env,
                                    args.timeout)
    return 0 if torch_ranks.report(results, f"collectives, {args.ranks} ranks") else 1


if __name__ == "__main__":
    sys.exit(main())
