"""What hvd.join() support costs a world ``hvd.allreduce`` when no rank has joined, and what
an allreduce costs while one has.

    mpiexec -n 2 python benchmarks/bench_hvd_join.py           # 1 KiB and 1 MiB
    mpiexec -n 2 python benchmarks/bench_hvd_join.py --quick   # fewer repetitions

Per size, in one launch, repetitions alternating between the variants so that a change in
machine load hits all alike: ``hvd`` (``hvd.allreduce``, average, a new tensor: join support
included) and ``plain`` (``fluxmpi_py.allreduce_`` of a clone, average: the same work without
the hvd face). (The per-call join round and its switch are gone: a joined rank answers
inside the agreement every collective starts with; docs/measurements.md has the before.)
Each repetition times a loop of calls between barriers and takes the slowest rank's time.
Then ``joined``: the highest rank has joined (``hvd.join()``) and the others run
``hvd.allreduce``, which the joined rank shadows with zeros. Reported: medians over
repetitions of the time per call (microseconds) and the ratios to ``plain``. Rank 0 prints
one JSON line and writes it to benchmarks/results/bench_hvd_join.json.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import emit, set_threads  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py.horovod as hvd  # noqa: E402


def timed(fn, iters):
    fm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    return fm.allreduce_(dt, "max").item() / iters


def variants(t):
    return {
        "hvd": lambda: hvd.allreduce(t),
        "plain": lambda: fm.allreduce_(t.clone(), "average"),
    }


def joined_time(t, iters, reps):
    """Median time per hvd.allreduce of the ranks below the highest, which has joined."""
    last = hvd.size() - 1
    times = []
    for _ in range(reps):
        if hvd.rank() == last:
            hvd.join()
            continue
        t0 = time.perf_counter()
        for _ in range(iters):
            hvd.allreduce(t)
        times.append((time.perf_counter() - t0) / iters)
        hvd.join()
    return statistics.median(times) if times else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    set_threads()
    hvd.init()
    reps = 3 if args.quick else 7
    record = {"bench": "hvd_join", "ranks": hvd.size(), "unit": "us per call", "sizes": {}}
    for nbytes, iters in ((1024, 400), (1 << 20, 60)):
        t = torch.ones(nbytes // 4)
        fns = variants(t)
        for fn in fns.values():  # warm up
            for _ in range(5):
                fn()
        times = {k: [] for k in fns}
        for _ in range(reps):
            for k, fn in fns.items():
                times[k].append(timed(fn, iters))
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        row = {k: round(v, 1) for k, v in med.items()}
        row.update(
            {f"{k}/plain": round(v / med["plain"], 2) for k, v in med.items() if k != "plain"}
        )
        if hvd.size() > 1:
            j = joined_time(t, iters, reps)
            got = [None] if j is None else [j]
            got = hvd.allgather_object(got[0])
            row["joined"] = round(statistics.median(x for x in got if x is not None) * 1e6, 1)
        record["sizes"][f"{nbytes // 1024} KiB"] = row
    emit("bench_hvd_join", record, hvd.rank())


if __name__ == "__main__":
    main()
