"""Our collectives against mpi4py's on the same buffers, in the same run.

    mpiexec -n 2 python benchmarks/bench_collectives.py           # 4 KiB .. 64 MiB, powers of 4
    mpiexec -n 2 python benchmarks/bench_collectives.py --quick   # 4 KiB .. 1 MiB, fewer reps
    mpiexec -n 2 python benchmarks/bench_collectives.py --op allgather   # or reduce_scatter,
        alltoall (4 KiB .. 16 MiB per rank), grouped (1000 tensors of 1024 floats: also
        through the ring over MPI datatypes and the pack path, hvd.grouped_allreduce_,
        allreduce_gradients and a pack + unpack alone)
    mpiexec -n 3 python benchmarks/bench_collectives.py --op sum_order   # allreduce_ in gloo's
        order (set_sum_order) vs the default order vs torch's gloo backend

--op allreduce (the default): allreduce_ against the in-place Allreduce; --op bcast: bcast_
against Bcast; --op reduce: reduce_ against Reduce (in place on the root). These three also
measure 8, 64 and 512 bytes: below 4 KiB a call's time is its fixed cost ("fixed_cost_us", at 8
bytes, ours and mpi4py's).

float32, op sum, one buffer per size used by both. Repetitions alternate between the two
(ours, theirs, ours, ...) so that a change in machine load hits both alike; each repetition
times a loop of calls between barriers and takes the slowest rank's time. Reported: the
median over repetitions of the time per call (microseconds), ours / mpi4py, and the fastest
repetition of each (a hint of the noise on a shared machine). "ratio_paired": the ratios of
the times taken next to each other in each repetition, their median, quartiles and range: the
spread that the machine's load puts on the ratio. Rank 0 prints
one JSON line and writes it to benchmarks/results/bench_collectives.json (other ops:
bench_collectives.<op>.json; --quick: .quick.json).
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi4py import MPI  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py._C as _C  # noqa: E402


def timed(fn, iters, comm):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = time.perf_counter() - t0
    return comm.allreduce(dt, op=MPI.MAX) / iters


# Row collectives: ours returns a new tensor, so mpi4py gets a new output array per call too
# (theirs); "theirs_prealloc" reuses one output array, the most mpi4py can do.
def row_ops(comm, size):
    """name -> (make(n floats) -> (ours, theirs, theirs_prealloc, check))."""
    import numpy as np

    def allgather(n):
        buf = torch.full((n,), float(comm.Get_rank()))
        arr, out = buf.numpy(), np.empty(n * size, dtype=np.float32)
        return (
            functools.partial(fm.allgather, buf),
            lambda: comm.Allgather(arr, np.empty(n * size, dtype=np.float32)),
            functools.partial(comm.Allgather, arr, out),
            lambda: float(fm.allgather(buf)[-1]) == size - 1,
        )

    def reduce_scatter(n):
        buf = torch.ones(n)
        arr, out = buf.numpy(), np.empty(n // size, dtype=np.float32)
        return (
            functools.partial(fm.reduce_scatter, buf),
            lambda: comm.Reduce_scatter_block(arr, np.empty(n // size, dtype=np.float32)),
            functools.partial(comm.Reduce_scatter_block, arr, out),
            lambda: float(fm.reduce_scatter(buf)[0]) == size,
        )

    def alltoall(n):
        buf = torch.full((n,), float(comm.Get_rank()))
        arr, out = buf.numpy(), np.empty(n, dtype=np.float32)
        return (
            functools.partial(fm.alltoall, buf),
            lambda: comm.Alltoall(arr, np.empty(n, dtype=np.float32)),
            functools.partial(comm.Alltoall, arr, out),
            lambda: float(fm.alltoall(buf)[-1]) == size - 1,
        )

    return {"allgather": allgather, "reduce_scatter": reduce_scatter, "alltoall": alltoall}


def calibrate(fns, comm):
    """Loop length for about 20 ms per repetition (at least 2 calls); also warms every path."""
    iters = 1
    while True:
        elapsed = timed(fns[-1], iters, comm) * iters
        for fn in fns[:-1]:
            timed(fn, iters, comm)
        if elapsed >= 0.005 or iters >= 4096:
            break
        iters *= 2
    return comm.bcast(max(2, min(4096, int(iters * 0.02 / max(elapsed, 1e-9)))), root=0)


def alternate(fns, iters, reps, comm, times=None):
    """Median and fastest time per call of each function, repetitions interleaved. `times`,
    when given, gets each function's list of times (one per repetition)."""
    times = [[] for _ in fns] if times is None else times
    times[:] = [[] for _ in fns]
    for _ in range(reps):
        for t, fn in zip(times, fns):
            t.append(timed(fn, iters, comm))
    return [statistics.median(t) for t in times], [min(t) for t in times]


def paired(ours, theirs):
    """Ratios of the times taken next to each other in one repetition: the median and the
    range over repetitions, the spread that machine load puts on the ratio."""
    r = sorted(a / b for a, b in zip(ours, theirs))
    q = len(r) // 4
    return {
        "median": round(statistics.median(r), 3),
        "quartiles": [round(r[q], 3), round(r[-1 - q], 3)],
        "range": [round(r[0], 3), round(r[-1], 3)],
    }


def bench_rows(op, sizes, reps, comm):
    size = comm.Get_size()
    rows = []
    for nbytes in sizes:
        n = (nbytes // 4) // size * size  # divisible into equal parts
        ours, theirs, prealloc, check = row_ops(comm, size)[op](n)
        assert check(), f"{op} gave a wrong result"
        iters = calibrate([ours, prealloc, theirs], comm)
        times = []
        (mo, mt, mp), (lo, lt, _) = alternate([ours, theirs, prealloc], iters, reps, comm, times)
        rows.append(
            {
                "bytes": n * 4,
                "iters": iters,
                "ours_us": round(mo * 1e6, 2),
                "mpi4py_us": round(mt * 1e6, 2),
                "mpi4py_prealloc_us": round(mp * 1e6, 2),
                "ratio": round(mo / mt, 3),
                "ratio_prealloc": round(mo / mp, 3),
                "ratio_paired": paired(times[0], times[1]),
                "ratio_of_mins": round(lo / lt, 3),
                "ours_min_us": round(lo * 1e6, 2),
                "mpi4py_min_us": round(lt * 1e6, 2),
            }
        )
    return rows


def bench_grouped(reps, comm):
    """grouped_allreduce_ of 1000 tensors of 1024 floats, and the same list through
    hvd.grouped_allreduce_ and allreduce_gradients (as .grad of 1000 parameters), against one
    allreduce_ of the same bytes (ours and mpi4py's), op sum."""
    from mpi4py import MPI as _MPI

    import fluxmpi_py.horovod as hvd

    tensors = [torch.zeros(1024) for _ in range(1000)]
    params = [torch.nn.Parameter(torch.zeros(1024)) for _ in range(1000)]
    for p in params:
        p.grad = torch.zeros(1024)
    flat = torch.zeros(1024 * 1000)
    arr = flat.numpy()
    check = [torch.ones(1024) for _ in range(1000)]
    fm.grouped_allreduce_(check)
    assert all(float(t[0]) == comm.Get_size() for t in check), "grouped_allreduce_ is wrong"
    for p in params:
        p.grad.fill_(1.0)
    fm.allreduce_gradients(params, op="sum")
    assert all(float(p.grad[-1]) == comm.Get_size() for p in params), "allreduce_gradients"
    for p in params:
        p.grad.zero_()  # zeros stay zeros: repeated sums never overflow
    # The floor of any call that packs: one pack and one unpack of the list by the compiled
    # host loop (csrc/fusion/pack_cpu.*), no communication.
    plan = _C.plan_pack(tensors, torch.float32)
    staging = torch.empty(plan.numel)

    def pack_unpack():
        _C.pack(plan, tensors, staging)
        _C.unpack(plan, staging, tensors)

    # The same list through the ring over MPI datatypes instead of shared memory
    # (RingOptions.list_shared_memory=False), and through the pack path (list_min_bytes past it).
    shared, datatypes, packed = _C.ring_options(), _C.ring_options(), _C.ring_options()
    datatypes.list_shared_memory = False
    packed.list_min_bytes = 1 << 62

    def grouped_with(opts):
        _C.set_ring_options(opts)
        fm.grouped_allreduce_(tensors)
        _C.set_ring_options(shared)

    fns = {
        "grouped": functools.partial(fm.grouped_allreduce_, tensors),
        "grouped_datatypes": functools.partial(grouped_with, datatypes),
        "grouped_packed": functools.partial(grouped_with, packed),
        "pack_unpack": pack_unpack,
        "flat": functools.partial(fm.allreduce_, flat),
        "mpi4py_flat": functools.partial(comm.Allreduce, _MPI.IN_PLACE, arr, op=_MPI.SUM),
        "hvd_grouped": functools.partial(hvd.grouped_allreduce_, tensors, op=hvd.Sum),
        "allreduce_gradients": functools.partial(fm.allreduce_gradients, params, op="sum"),
    }
    names = list(fns)
    iters = calibrate(list(fns.values()), comm)
    times = []
    med, low = alternate(list(fns.values()), iters, reps, comm, times)
    t = dict(zip(names, times))
    out = {"tensors": 1000, "floats_each": 1024, "iters": iters}
    for name, m, lo in zip(names, med, low):
        out[f"{name}_us"] = round(m * 1e6, 1)
        out[f"{name}_min_us"] = round(lo * 1e6, 1)
    for name in ("grouped", "grouped_datatypes", "grouped_packed", "hvd_grouped",
                 "allreduce_gradients", "pack_unpack"):  # fmt: skip
        key = "ratio_to_flat" if name == "grouped" else f"{name}_ratio_to_flat"
        out[key] = paired(t[name], t["flat"])
    out["ratio_to_mpi4py_flat"] = paired(t["grouped"], t["mpi4py_flat"])
    return out


def inplace_ops(kind, buf, arr, comm):
    """(ours, theirs, check) for the in-place collective `kind` on `buf` (`arr` its memory):
    allreduce_ / Allreduce(IN_PLACE), bcast_ / Bcast from rank 0, reduce_ / Reduce onto rank 0
    (IN_PLACE there). `check()` runs both once on rank + 1 and asserts their results."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if kind == "allreduce":
        ours = functools.partial(fm.allreduce_, buf)
        theirs = functools.partial(comm.Allreduce, MPI.IN_PLACE, arr, op=MPI.SUM)
        expect = [size * (size + 1) / 2] * 2
    elif kind == "bcast":
        ours = functools.partial(fm.bcast_, buf, 0)
        theirs = functools.partial(comm.Bcast, arr, root=0)
        expect = [1.0, 1.0]
    else:
        ours = functools.partial(fm.reduce_, buf, "sum", 0)
        send = MPI.IN_PLACE if rank == 0 else arr
        theirs = functools.partial(
            comm.Reduce, send, arr if rank == 0 else None, op=MPI.SUM, root=0
        )
        expect = [size * (size + 1) / 2 if rank == 0 else rank + 1] * 2

    def check():
        for fn, who in ((ours, "ours"), (theirs, "mpi4py")):
            buf.fill_(rank + 1)
            fn()
            got = [float(buf[0]), float(buf[-1])]
            assert got == expect, f"{kind}: {who} gave {got}, expected {expect}"

    return ours, theirs, check


def bench_inplace(kind, sizes, reps, comm):
    rows = []
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)
        arr = buf.numpy()  # the same memory
        ours, theirs, check = inplace_ops(kind, buf, arr, comm)
        check()  # correctness first, on both paths
        buf.zero_()  # zeros stay zeros, so repeated sums never overflow or go denormal
        iters = calibrate([ours, theirs], comm)
        times = []
        (mo, mt), (lo, lt) = alternate([ours, theirs], iters, reps, comm, times)
        rows.append(
            {
                "bytes": buf.numel() * 4,
                "iters": iters,
                "ours_us": round(mo * 1e6, 2),
                "mpi4py_us": round(mt * 1e6, 2),
                "ratio": round(mo / mt, 3),
                "ratio_paired": paired(times[0], times[1]),
                "ours_min_us": round(lo * 1e6, 2),
                "mpi4py_min_us": round(lt * 1e6, 2),
            }
        )
    return rows


def bench_sum_order(sizes, reps, comm):
    """allreduce_ in gloo's order (fluxmpi_py.set_sum_order) against the default order and
    against torch.distributed.all_reduce on a gloo group, on the same buffer, alternating."""
    import torch.distributed as dist

    dist.init_process_group("fluxmpi")
    gloo = dist.new_group(backend="gloo")
    rank = comm.Get_rank()

    def in_order(order, buf):
        fm.set_sum_order(order)
        fm.allreduce_(buf)

    rows = []
    for nbytes in sizes:
        buf = torch.zeros(nbytes // 4, dtype=torch.float32)
        # Correctness first: gloo's order has gloo's bits.
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(buf.numel(), generator=g) * 1e3 ** torch.rand(buf.numel(), generator=g)
        ours_x, gloo_x = x.clone(), x.clone()
        in_order("gloo", ours_x)
        dist.all_reduce(gloo_x, group=gloo)
        assert torch.equal(ours_x, gloo_x), "the sum in gloo's order differs from gloo's"
        fns = [
            functools.partial(in_order, "gloo", buf),
            functools.partial(in_order, "fastest", buf),
            functools.partial(dist.all_reduce, buf, group=gloo),
        ]
        iters = calibrate(fns, comm)
        (mg, mf, mt), _ = alternate(fns, iters, reps, comm)
        rows.append(
            {
                "bytes": nbytes,
                "iters": iters,
                "gloo_order_us": round(mg * 1e6, 2),
                "fastest_us": round(mf * 1e6, 2),
                "torch_gloo_us": round(mt * 1e6, 2),
                "ratio": round(mg / mt, 3),  # ours in gloo's order / gloo itself
                "gloo_order_over_fastest": round(mg / mf, 3),
            }
        )
    fm.set_sum_order("fastest")
    return rows


INPLACE = ("allreduce", "bcast", "reduce")

WHAT = {
    "sum_order": "allreduce_ in gloo's order (set_sum_order) vs the default order vs "
    "torch.distributed.all_reduce on gloo, float32 sum; ratio = gloo's order / gloo",
    "allreduce": "allreduce_ vs mpi4py Allreduce(MPI.IN_PLACE), float32 sum, median time per call",
    "bcast": "bcast_ vs mpi4py Bcast, root 0, float32, median time per call",
    "reduce": "reduce_ vs mpi4py Reduce (IN_PLACE on the root), root 0, float32 sum, median time "
    "per call",
    "allgather": "allgather vs mpi4py Allgather (new output per call; prealloc: one output), "
    "float32, bytes = each rank's input",
    "reduce_scatter": "reduce_scatter vs mpi4py Reduce_scatter_block (new output per call; "
    "prealloc: one output), float32 sum, bytes = each rank's input",
    "alltoall": "alltoall vs mpi4py Alltoall (new output per call; prealloc: one output), "
    "float32, bytes = each rank's input",
    "grouped": "grouped_allreduce_ (and hvd.grouped_allreduce_, allreduce_gradients) of 1000 x "
    "1024 float32 vs one allreduce_ (and mpi4py Allreduce) of the same 4 MB, op sum; "
    "grouped_datatypes / grouped_packed: the same call through the ring over MPI datatypes / "
    "the pack path; pack_unpack: one pack and unpack of the list alone",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 KiB .. 1 MiB, 5 repetitions")
    ap.add_argument(
        "--reps", type=int, default=None, help="repetitions per size (default 11, quick 5)"
    )
    ap.add_argument("--op", choices=sorted(WHAT), default="allreduce", help="what to measure")
    ap.add_argument(
        "--sizes", type=int, nargs="+", default=None, help="bytes per rank (default: powers of 4)"
    )
    args = ap.parse_args()

    torch.set_num_threads(1)
    fm.Init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    max_bytes = (1 << 20) if args.quick else (64 << 20)
    if args.op in ("allgather", "alltoall", "reduce_scatter") and not args.quick:
        max_bytes = 16 << 20
    reps = args.reps or (5 if args.quick else 11)
    # Below 4 KiB a call's time is its fixed cost: 8 bytes (two floats) measures it.
    sizes = [] if args.op not in INPLACE or args.quick else [8, 64, 512]
    b = 4 << 10
    while b <= max_bytes:
        sizes.append(b)
        b *= 4
    sizes = args.sizes or sizes

    result = {
        "benchmark": "bench_collectives",
        "op": args.op,
        "what": WHAT[args.op],
        "world_size": size,
        "quick": bool(args.quick),
        "reps": reps,
        "mpi_library": fm.build_info()["mpi_library"],
        "torch": torch.__version__,
    }
    if args.op == "grouped":
        result.update(bench_grouped(reps, comm))
    else:
        if args.op in INPLACE:
            rows = bench_inplace(args.op, sizes, reps, comm)
        elif args.op == "sum_order":
            rows = bench_sum_order(sizes, reps, comm)
        else:
            rows = bench_rows(args.op, sizes, reps, comm)
        big = [r["ratio"] for r in rows if r["bytes"] >= (1 << 20)]
        from_4k = [r["ratio"] for r in rows if r["bytes"] >= (4 << 10)]
        at_4k = [r["ratio"] for r in rows if r["bytes"] == (4 << 10)]
        result.update(
            sizes=rows,
            ratio_4KiB=at_4k[0] if at_4k else None,
            max_ratio_ge_4KiB=max(from_4k) if from_4k else None,
            max_ratio_ge_1MiB=max(big) if big else None,
        )
        small = [r for r in rows if r["bytes"] < (4 << 10)]
        if small:  # the fixed cost of a call: the smallest size's time
            result["fixed_cost_us"] = {"ours": small[0]["ours_us"], "mpi4py": small[0]["mpi4py_us"]}

    if rank == 0:
        line = json.dumps(result)
        print(line, flush=True)
        out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
        os.makedirs(out_dir, exist_ok=True)
        stem = "bench_collectives" if args.op == "allreduce" else f"bench_collectives.{args.op}"
        name = f"{stem}.quick.json" if args.quick else f"{stem}.json"
        if args.sizes:
            name = f"{stem}.sizes.json"
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
