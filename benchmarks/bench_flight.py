"""The flight recorder's cost (csrc/runtime/flight.h): a loop of small blocking collectives
with the recorder on (256 slots, the default) and off (FLUXMPI_FLIGHT_SIZE=0's state), in
alternating blocks of the same launch, so that the machine's drift hits both alike. Reports
the median time per call of each and their ratio. Run: mpiexec -n 2 python
benchmarks/bench_flight.py [calls per block] [rounds].
"""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import emit  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402


def block(calls, t):
    fm.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fm.allreduce_(t)
    return (time.perf_counter() - t0) / calls


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    torch.set_num_threads(1)
    fm.Init()
    t = torch.ones(8)
    block(200, t)  # warm-up
    per_call = {"on": [], "off": []}
    for i in range(rounds):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            C.set_flight_capacity(256 if mode == "on" else 0)
            per_call[mode].append(block(calls, t))
    C.set_flight_capacity(256)
    on, off = (statistics.median(per_call[m]) for m in ("on", "off"))
    emit(
        "bench_flight",
        {
            "bench": "flight",
            "ranks": fm.total_workers(),
            "calls_per_block": calls,
            "rounds": rounds,
            "collective": "allreduce_ of 8 floats",
            "off_us": round(off * 1e6, 2),
            "on_us": round(on * 1e6, 2),
            "ratio_on_off": round(on / off, 3),
            "on_blocks_us": [round(x * 1e6, 2) for x in per_call["on"]],
            "off_blocks_us": [round(x * 1e6, 2) for x in per_call["off"]],
        },
        fm.local_rank(),
    )


if __name__ == "__main__":
    main()
