"""One job of benchmarks/multi_host.py: allreduce_ across virtual hosts by each algorithm.

    (run by multi_host.py under mpiexec in the virtual cluster) multi_host_worker.py SIZES REPS

float32 sums. Algorithms: "mpi" (MPI_Allreduce: ring and node-aware path off), "ring"
(fluxmpi's ring at every size), "hierarchical" (the node-aware path at every size), "auto"
(the default options: what a user gets; the row says which path they took). Repetitions rotate through the algorithms, so that a
change in machine load hits all alike; each repetition times a loop of calls between barriers
and takes the slowest rank's time. Rank 0 prints one JSON line per size: the median time per
call of each algorithm (microseconds).
"""

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402

RING_OFF = C.RingOptions(enabled=False)
RING_ALWAYS = C.RingOptions(sum_min_bytes=1, average_min_bytes=1)
HIER_OFF = C.HierarchicalOptions(enabled=False, ring_across_hosts=True)
HIER_ALWAYS = C.HierarchicalOptions(min_bytes=0, max_bytes=1 << 62)
ALGORITHMS = {
    "mpi": (RING_OFF, HIER_OFF),
    "ring": (RING_ALWAYS, HIER_OFF),
    "hierarchical": (RING_OFF, HIER_ALWAYS),
    "auto": (C.RingOptions(), C.HierarchicalOptions()),
}


def slowest_rank(seconds):
    t = torch.tensor([seconds], dtype=torch.float64)
    return fm.allreduce_(t, "max").item()


def time_loop(buf, iters):
    fm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fm.allreduce_(buf)
    return slowest_rank(time.perf_counter() - t0) / iters


def main(sizes, reps):
    torch.set_num_threads(1)
    fm.Init()
    for nbytes in sizes:
        buf = torch.ones(nbytes // 4)
        iters = max(2, min(50, (8 << 20) // nbytes))
        times = {a: [] for a in ALGORITHMS}
        for rep in range(reps + 1):
            for name, (ring, hier) in ALGORITHMS.items():
                C.set_ring_options(ring)
                C.set_hierarchical_options(hier)
                counts = C.ring_calls(), C.hierarchical_calls()
                t = time_loop(buf, iters)
                if name == "auto":  # which path the default options took
                    took = ["ring", "hierarchical", "mpi"][
                        0
                        if C.ring_calls() > counts[0]
                        else 1
                        if C.hierarchical_calls() > counts[1]
                        else 2
                    ]
                if rep > 0:  # the first round warms up connections and caches
                    times[name].append(t)
        C.set_ring_options(C.RingOptions())
        C.set_hierarchical_options(C.HierarchicalOptions())
        if fm.local_rank() == 0:
            row = {"bytes": nbytes, "ranks": fm.total_workers(), "iters": iters, "reps": reps}
            row["auto took"] = took
            row.update({a: round(statistics.median(ts) * 1e6, 1) for a, ts in times.items()})
            print("RESULT " + json.dumps(row), flush=True)


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1].split(",")], int(sys.argv[2]))
