"""Every c10d collective of the "ridge" backend against values computed here.

Inputs are small integers chosen per rank and element so that every dtype holds them and
every result exactly; the expected value is computed in float64 from the same formula.
Outputs are poisoned first (NaN, or a value no result can have) so that an operation that
writes nothing fails.

    tests/python/collectives_test.py --nprocs 3 --init tcp
"""

import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch  # noqa: E402

REDUCE_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"]
POISON = 111  # outside every result below


def value(r, i):
    """Rank r's element i: 1, 2 or 3 (so a product of 3 ranks fits in int8)."""
    return ((i + r) % 3) + 1


def make(torch, r, n, dtype):
    return torch.tensor([value(r, i) for i in range(n)], dtype=torch.float64).to(dtype)


def poisoned(torch, shape, dtype):
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype)
    return torch.full(shape, POISON, dtype=dtype)


def worker(args):
    import torch
    import torch.distributed as dist

    rank, world = launch.init_child("ridge", 60)
    failures = []

    def check(name, ok, detail=""):
        if not ok:
            failures.append(name)
            print(f"FAIL {name} {detail}", flush=True)

    def expect(name, got, want):
        want = want.to(got.dtype) if isinstance(want, torch.Tensor) else want
        ok = got.shape == want.shape and bool(torch.equal(got, want))
        check(name, ok, f"got {got.tolist()} want {want.tolist()}")

    def run(fn):
        try:
            fn()
            print(f"ok {fn.__name__}", flush=True)
        except Exception:
            failures.append(fn.__name__)
            print(f"FAIL {fn.__name__}\n{traceback.format_exc()}", flush=True)

    n = 11
    ranks = range(world)
    per_rank = torch.stack([make(torch, r, n, torch.float64) for r in ranks])

    def test_backend_name():
        check("backend", dist.get_backend() == "RIDGE" or dist.get_backend() == "ridge", dist.get_backend())

    def test_allreduce_ops_and_dtypes():
        reference = {
            dist.ReduceOp.SUM: per_rank.sum(0),
            dist.ReduceOp.PRODUCT: per_rank.prod(0),
            dist.ReduceOp.MIN: per_rank.min(0).values,
            dist.ReduceOp.MAX: per_rank.max(0).values,
        }
        for name in REDUCE_DTYPES:
            dtype = getattr(torch, name)
            for op, want in reference.items():
                t = make(torch, rank, n, dtype)
                dist.all_reduce(t, op=op)
                expect(f"allreduce {name} {op}", t, want)
            if dtype.is_floating_point:
                t = make(torch, rank, n, dtype)
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                # The float64 mean rounded once to the dtype, as a sum then one division does.
                expect(f"allreduce {name} AVG", t, (per_rank.sum(0) / world).to(dtype))

    def test_premul_sum():
        t = make(torch, rank, n, torch.float32)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        expect("premul_sum float factor", t, per_rank.sum(0) * 0.5)
        t = make(torch, rank, n, torch.float64)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum([torch.tensor([4.0], dtype=torch.float64)]))
        expect("premul_sum tensor factor", t, per_rank.sum(0) * 4)

    def test_allreduce_complex_sum():
        # torch sums complex tensors as their real view: two floats per element.
        t = torch.complex(make(torch, rank, n, torch.float32), -make(torch, rank, n, torch.float32))
        dist.all_reduce(t)
        expect("complex sum", t, torch.complex(per_rank.sum(0), -per_rank.sum(0)))

    def test_allreduce_bool():
        # Rank r holds True where i % world == r: any is all True, all is False (world > 1).
        t = torch.tensor([i % world == rank for i in range(n)])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        expect("bool sum (any)", t, torch.ones(n, dtype=torch.bool))
        t = torch.tensor([i % world == rank for i in range(n)])
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        expect("bool min (all)", t, torch.zeros(n, dtype=torch.bool))

    def test_allreduce_non_contiguous():
        base = torch.full((n, 2), -7.0)
        view = base[:, 0]  # stride 2
        view.copy_(make(torch, rank, n, torch.float32))
        dist.all_reduce(view)
        expect("non-contiguous result", base[:, 0], per_rank.sum(0))
        expect("non-contiguous neighbours untouched", base[:, 1], torch.full((n,), -7.0))

    def test_allreduce_async_future():
        t = make(torch, rank, n, torch.float32)
        work = dist.all_reduce(t, async_op=True)
        fut = work.get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        work.wait()
        check("is_completed", work.is_completed())
        expect("async result", t, per_rank.sum(0))
        expect("future then", doubled.wait(), per_rank.sum(0) * 2)
        # Many in flight at once complete in order, each with its own value.
        ts = [make(torch, rank, n, torch.float32) * (k + 1) for k in range(8)]
        works = [dist.all_reduce(x, async_op=True) for x in ts]
        for k, (x, w) in enumerate(zip(ts, works)):
            w.wait()
            expect(f"in flight {k}", x, per_rank.sum(0) * (k + 1))

    def test_allreduce_coalesced():
        ts = [make(torch, rank, n + k, torch.float32) for k in range(3)]
        dist.all_reduce_coalesced(ts)
        for k, x in enumerate(ts):
            want = torch.stack([make(torch, r, n + k, torch.float64) for r in ranks]).sum(0)
            expect(f"allreduce_coalesced {k}", x, want)

    def test_broadcast():
        for root in ranks:
            for dtype in (torch.float32, torch.bool, torch.complex64, torch.int64):
                src = (make(torch, root, n, torch.float64) > 1.5) if dtype == torch.bool else make(
                    torch, root, n, torch.float64).to(dtype)
                t = src.clone() if rank == root else poisoned(torch, (n,), torch.float64).to(dtype)
                if dtype == torch.bool and rank != root:
                    t = ~src  # the opposite: only a real broadcast makes it equal
                dist.broadcast(t, src=root)
                expect(f"broadcast root {root} {dtype}", t, src)
        base = torch.zeros(n, 3)
        if rank == 0:
            base[:, 1] = make(torch, 0, n, torch.float32)
        dist.broadcast(base[:, 1], src=0)
        expect("broadcast non-contiguous", base[:, 1], make(torch, 0, n, torch.float32))

    def test_reduce():
        for root in ranks:
            t = make(torch, rank, n, torch.float32)
            dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
            if rank == root:
                expect(f"reduce sum root {root}", t, per_rank.sum(0))
            else:
                expect(f"reduce leaves non-root {rank} as it was", t, per_rank[rank])
            t = make(torch, rank, n, torch.int32)
            dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
            if rank == root:
                expect(f"reduce max root {root}", t, per_rank.max(0).values)

    def test_allgather():
        outs = [poisoned(torch, (n,), torch.float32) for _ in ranks]
        dist.all_gather(outs, make(torch, rank, n, torch.float32))
        for r in ranks:
            expect(f"all_gather block {r}", outs[r], per_rank[r])
        flat = poisoned(torch, (world * n,), torch.float32)
        dist.all_gather_into_tensor(flat, make(torch, rank, n, torch.float32))
        expect("all_gather_into_tensor", flat, per_rank.reshape(-1))
        # In place: the input is this rank's block of the output.
        flat = poisoned(torch, (world * n,), torch.float32)
        flat[rank * n:(rank + 1) * n] = make(torch, rank, n, torch.float32)
        dist.all_gather_into_tensor(flat, flat[rank * n:(rank + 1) * n])
        expect("all_gather_into_tensor in place", flat, per_rank.reshape(-1))

    def test_allgather_coalesced():
        ins = [make(torch, rank, n, torch.float32), make(torch, rank, 3, torch.float32)]
        outs = [[poisoned(torch, (n,), torch.float32), poisoned(torch, (3,), torch.float32)] for _ in ranks]
        dist.all_gather_coalesced(outs, ins)
        for r in ranks:
            expect(f"all_gather_coalesced rank {r} 0", outs[r][0], per_rank[r])
            expect(f"all_gather_coalesced rank {r} 1", outs[r][1], make(torch, r, 3, torch.float64))

    def test_reduce_scatter():
        # Rank r's block b is make(r*world + b): every block of every rank is different.
        blocks = [make(torch, rank * world + b, n, torch.float32) for b in ranks]
        out = poisoned(torch, (n,), torch.float32)
        dist.reduce_scatter(out, blocks)
        want = torch.stack([make(torch, r * world + rank, n, torch.float64) for r in ranks]).sum(0)
        expect("reduce_scatter", out, want)
        out = poisoned(torch, (n,), torch.float32)
        dist.reduce_scatter_tensor(out, torch.cat(blocks))
        expect("reduce_scatter_tensor", out, want)
        out = poisoned(torch, (n,), torch.float32)
        dist.reduce_scatter_tensor(out, torch.cat(blocks), op=dist._make_nccl_premul_sum(2.0))
        expect("reduce_scatter_tensor premul_sum", out, want * 2)
        out = poisoned(torch, (n,), torch.float32)
        dist.reduce_scatter_tensor(out, torch.cat(blocks), op=dist.ReduceOp.MAX)
        want_max = torch.stack([make(torch, r * world + rank, n, torch.float64) for r in ranks]).max(0).values
        expect("reduce_scatter_tensor max", out, want_max)

    def test_alltoall_single_equal():
        inp = torch.cat([make(torch, rank * world + j, n, torch.float32) for j in ranks])
        out = poisoned(torch, (world * n,), torch.float32)
        dist.all_to_all_single(out, inp)
        want = torch.cat([make(torch, j * world + rank, n, torch.float64) for j in ranks])
        expect("all_to_all_single", out, want)

    def test_alltoall_single_splits():
        # Rank r sends rows(r, j) rows of width 2 to rank j; some blocks are empty.
        def rows(src, dst):
            return (src + 2 * dst) % 3

        in_splits = [rows(rank, j) for j in ranks]
        out_splits = [rows(j, rank) for j in ranks]
        inp = torch.cat([torch.full((rows(rank, j), 2), float(10 * rank + j)) for j in ranks])
        out = poisoned(torch, (sum(out_splits), 2), torch.float32)
        dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
        want = torch.cat([torch.full((rows(j, rank), 2), float(10 * j + rank)) for j in ranks])
        expect("all_to_all_single splits", out, want)

    def test_alltoall_list():
        ins = [torch.full((j + 1,), float(10 * rank + j)) for j in ranks]
        outs = [poisoned(torch, (rank + 1,), torch.float32) for _ in ranks]
        dist.all_to_all(outs, ins)
        for j in ranks:
            expect(f"all_to_all from {j}", outs[j], torch.full((rank + 1,), float(10 * j + rank)))

    def test_send_recv():
        # Ordered pairs: each pair (a < b) exchanges, a sending first.
        for a in ranks:
            for b in ranks:
                if a >= b or rank not in (a, b):
                    continue
                other = b if rank == a else a
                mine = make(torch, rank, n, torch.float32)
                got = poisoned(torch, (n,), torch.float32)
                if rank == a:
                    dist.send(mine, dst=other, tag=3)
                    dist.recv(got, src=other, tag=3)
                else:
                    dist.recv(got, src=other)
                    dist.send(mine, dst=other)
                expect(f"send/recv {other}->{rank}", got, make(torch, other, n, torch.float64))

    def test_batch_isend_irecv_ring():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = poisoned(torch, (n,), torch.float64)
        ops = [dist.P2POp(dist.isend, make(torch, rank, n, torch.float64), nxt),
               dist.P2POp(dist.irecv, got, prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        expect("batch_isend_irecv ring", got, make(torch, prv, n, torch.float64))

    def test_gather_scatter():
        root = world - 1
        outs = [poisoned(torch, (n,), torch.float32) for _ in ranks] if rank == root else None
        dist.gather(make(torch, rank, n, torch.float32), gather_list=outs, dst=root)
        if rank == root:
            for r in ranks:
                expect(f"gather block {r}", outs[r], per_rank[r])
        ins = [make(torch, 5 + r, n, torch.float32) for r in ranks] if rank == root else None
        out = poisoned(torch, (n,), torch.float32)
        dist.scatter(out, scatter_list=ins, src=root)
        expect("scatter", out, make(torch, 5 + rank, n, torch.float64))

    def test_barrier():
        for _ in range(3):
            dist.barrier()

    def test_new_group():
        members = [0, world - 1]
        group = dist.new_group(members, backend="ridge")
        t = make(torch, rank, n, torch.float32)
        if rank in members:
            dist.all_reduce(t, group=group)
            expect("subgroup allreduce", t, per_rank[members].sum(0))
        everyone = dist.new_group(list(ranks), backend="ridge")
        t = make(torch, rank, n, torch.float32)
        dist.all_reduce(t, group=everyone)
        expect("second full group", t, per_rank.sum(0))
        # Groups interleave: each has its own communicator.
        if rank in members:
            t = make(torch, rank, n, torch.float32)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            expect("subgroup after full", t, per_rank[members].max(0).values)
        # Dropping a group while its worker still runs an operation on a tensor that only
        # the worker holds: the worker frees the tensor (taking the GIL) while this thread
        # waits for it, which must not deadlock.
        pending = dist.all_reduce(torch.ones(1 << 20), group=everyone, async_op=True)
        del pending
        dist.destroy_process_group(everyone)

    def test_errors_are_clear():
        def raises(name, fn, *words):
            try:
                fn()
            except RuntimeError as e:
                text = str(e)
                check(name, all(w in text for w in words), f"message {text!r} lacks {words}")
                return
            check(name, False, "no RuntimeError")

        raises("bitwise op refused", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32),
                                                             op=dist.ReduceOp.BAND), "ridge", "BAND")
        raises("int16 reduce refused", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "ridge",
               "Short")
        raises("recv from any source refused", lambda: dist.recv(torch.zeros(2)), "ridge", "any source")
        raises("multi-tensor refused", lambda: dist.all_reduce_multigpu([torch.ones(2), torch.ones(2)]),
               "ridge", "one tensor")
        # After the refusals the group still works (they raised before anything was queued).
        t = make(torch, rank, n, torch.float32)
        dist.all_reduce(t)
        expect("allreduce after errors", t, per_rank.sum(0))

    tests = [test_backend_name, test_allreduce_ops_and_dtypes, test_premul_sum, test_allreduce_complex_sum, test_allreduce_bool,
             test_allreduce_non_contiguous, test_allreduce_async_future, test_allreduce_coalesced, test_broadcast,
             test_reduce, test_allgather, test_allgather_coalesced, test_reduce_scatter, test_alltoall_single_equal,
             test_alltoall_single_splits, test_alltoall_list, test_send_recv, test_batch_isend_irecv_ring,
             test_gather_scatter, test_barrier, test_new_group, test_errors_are_clear]
    for t in tests:
        run(t)
    dist.destroy_process_group()
    print(f"rank {rank}: {len(tests)} tests, {len(failures)} failed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    launch.main(worker, __doc__)
