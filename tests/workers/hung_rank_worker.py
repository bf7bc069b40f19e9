"""A rank that hangs without dying, in the shrink mode (tests/test_elastic.py): the last rank
stops itself (SIGSTOP) before call 3 of 8 allreduce_ calls of ones; Open MPI's failure detector
(python -m fluxmpi_py.run --elastic turns it on) declares it failed once its heartbeats stop,
and the survivors recover and go on. Usage: hung_rank_worker.py

The stopped rank prints "rank R pid P stops at T" first (T: time.time()); each survivor prints
"rank R: first call after the loss at T" and, at the end, "rank R of N: sums [...]".
"""

import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

fm.Init(on_failure="shrink")
me, victim = fm.local_rank(), fm.total_workers() - 1
sums, lost = [], False
call = 0
while call < 8:
    if me == victim and call == 3:
        print(f"rank {me} pid {os.getpid()} stops at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    t = torch.ones(4)
    try:
        fm.allreduce_(t)
    except fm.RanksLostError:
        fm.recover()
        lost = True
        continue
    if lost:
        print(f"rank {me}: first call after the loss at {time.time():.3f}", flush=True)
        lost = False
    sums.append(int(t[0]))
    call += 1
print(f"rank {me} of {fm.total_workers()}: sums {sums}", flush=True)
