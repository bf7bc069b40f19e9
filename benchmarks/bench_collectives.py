"""allreduce_ against mpi4py's in-place Allreduce on the same buffer, in the same run.

    mpiexec -n 2 python benchmarks/bench_collectives.py           # 4 KiB .. 64 MiB, powers of 4
    mpiexec -n 2 python benchmarks/bench_collectives.py --quick   # 4 KiB .. 1 MiB, fewer reps

float32, op sum, one buffer per size used by both. Repetitions alternate between the two
(ours, theirs, ours, ...) so that a change in machine load hits both alike; each repetition
times a loop of calls between barriers and takes the slowest rank's time. Reported: the
median over repetitions of the time per call (microseconds), ours / mpi4py, and the fastest
repetition of each (a hint of the noise on a shared machine). Rank 0 prints
one JSON line and writes it to benchmarks/results/bench_collectives.json (--quick:
bench_collectives.quick.json).
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


def timed(fn, iters, comm):
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = time.perf_counter() - t0
    return comm.allreduce(dt, op=MPI.MAX) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 KiB .. 1 MiB, 5 repetitions")
    ap.add_argument(
        "--reps", type=int, default=None, help="repetitions per size (default 11, quick 5)"
    )
    args = ap.parse_args()

    torch.set_num_threads(1)
    fm.Init()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    max_bytes = (1 << 20) if args.quick else (64 << 20)
    reps = args.reps or (5 if args.quick else 11)
    sizes = []
    b = 4 << 10
    while b <= max_bytes:
        sizes.append(b)
        b *= 4

    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        buf = torch.zeros(n, dtype=torch.float32)
        arr = buf.numpy()  # the same memory

        # Correctness first, on both paths: rank + 1 summed is size * (size + 1) / 2.
        expect = size * (size + 1) / 2
        buf.fill_(rank + 1)
        fm.allreduce_(buf)
        assert float(buf[0]) == expect and float(buf[-1]) == expect, "allreduce_ gave a wrong sum"
        buf.fill_(rank + 1)
        comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM)
        assert float(buf[0]) == expect and float(buf[-1]) == expect, "mpi4py gave a wrong sum"
        buf.zero_()  # zeros stay zeros, so repeated sums never overflow or go denormal

        ours = functools.partial(fm.allreduce_, buf)
        theirs = functools.partial(comm.Allreduce, MPI.IN_PLACE, arr, op=MPI.SUM)

        # About 20 ms of work per repetition, at least 2 calls: double the loop until it takes
        # 5 ms (this also warms both paths up), then scale.
        iters = 1
        while True:
            elapsed = timed(theirs, iters, comm) * iters
            timed(ours, iters, comm)
            if elapsed >= 0.005 or iters >= 4096:
                break
            iters *= 2
        iters = comm.bcast(max(2, min(4096, int(iters * 0.02 / max(elapsed, 1e-9)))), root=0)
        t_ours, t_theirs = [], []
        for _ in range(reps):
            t_ours.append(timed(ours, iters, comm))
            t_theirs.append(timed(theirs, iters, comm))
        mo, mt = statistics.median(t_ours), statistics.median(t_theirs)
        rows.append(
            {
                "bytes": nbytes,
                "iters": iters,
                "ours_us": round(mo * 1e6, 2),
                "mpi4py_us": round(mt * 1e6, 2),
                "ratio": round(mo / mt, 3),
                "ours_min_us": round(min(t_ours) * 1e6, 2),
                "mpi4py_min_us": round(min(t_theirs) * 1e6, 2),
            }
        )

    if rank == 0:
        big = [r["ratio"] for r in rows if r["bytes"] >= (1 << 20)]
        result = {
            "benchmark": "bench_collectives",
            "what": "allreduce_ vs mpi4py Allreduce(MPI.IN_PLACE), float32 sum, median time per call",
            "world_size": size,
            "quick": bool(args.quick),
            "reps": reps,
            "mpi_library": fm.build_info()["mpi_library"],
            "torch": torch.__version__,
            "sizes": rows,
            "ratio_4KiB": rows[0]["ratio"],
            "max_ratio_ge_1MiB": max(big) if big else None,
        }
        line = json.dumps(result)
        print(line, flush=True)
        out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
        os.makedirs(out_dir, exist_ok=True)
        name = "bench_collectives.quick.json" if args.quick else "bench_collectives.json"
        with open(os.path.join(out_dir, name), "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
