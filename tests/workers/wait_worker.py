"""How Open MPI waits after Init, by import order. Usage: wait_worker.py ORDER.

    fluxmpi_py_first   import fluxmpi_py, then start MPI in Init
    mpi4py_first       from mpi4py import MPI (starts MPI) before importing fluxmpi_py
Prints, per rank, Open MPI's own yield flag before and after Init and build_info's mpi_wait.
Then each rank in turn waits about a second for the other, which sleeps before joining (rank 0
in an allreduce, rank 1 in a DistributedOptimizer step), and prints the CPU time its process
used meanwhile, the time its threads were running or ready to run (Linux's schedstat: on a
busy machine a yielding wait gets less CPU, but it stays ready to run all along), and the
naps: the most voluntary context switches of one thread over the wait.
"""

import ctypes
import os
import sys
import time

if sys.argv[1] == "mpi4py_first":
    from mpi4py import MPI  # noqa: F401

import torch  # noqa: E402

LATE_S = 1.0  # how long the late rank sleeps before it joins


def yields():
    """Open MPI's flag, read from its library: does the progress loop yield when idle? Through
    a handle on the loaded libmpi, whose dependencies hold it (Open MPI 5's libopen-pal is not
    in the global scope, as 4.1's was)."""
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "/libmpi.so" in line})
    return ctypes.c_bool.in_dll(ctypes.CDLL(libs[0]), "opal_progress_yield_when_idle").value


before = yields() if sys.argv[1] == "mpi4py_first" else None
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

fm.Init()
fm.barrier()
print(
    f"rank {fm.local_rank()}: before={before} after={yields()} wait={fm.build_info()['mpi_wait']}"
)


def runnable_s():
    """Seconds this process's threads have been running or waiting for a core to run on."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu_ns, run_delay_ns = f.read().split()[:2]
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        total += int(on_cpu_ns) + int(run_delay_ns)
    return total / 1e9


def voluntary_switches():
    """Per thread of this process, how often it gave up its core to wait (Linux counts a sleep
    or a blocking call; a yield or a preemption is involuntary). A wait that naps adds one a
    nap to its thread, on a busy machine as on an idle one; a wait that yields or polls, none."""
    counts = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                line = next(x for x in f if x.startswith("voluntary_ctxt_switches:"))
        except (FileNotFoundError, StopIteration):  # a thread that ended meanwhile
            continue
        counts[tid] = int(line.split()[1])
    return counts


def waited(what, waiter, join):
    """Rank `waiter` runs join() at once, the other after LATE_S; the waiter prints the wall,
    CPU and runnable seconds (all its threads) that join() took."""
    fm.barrier()
    if fm.local_rank() != waiter:
        time.sleep(LATE_S)
        join()
        return
    wall, cpu, ready = time.monotonic(), time.process_time(), runnable_s()
    naps = voluntary_switches()
    join()
    wall, cpu, ready = time.monotonic() - wall, time.process_time() - cpu, runnable_s() - ready
    naps = max(n - naps.get(tid, 0) for tid, n in voluntary_switches().items())
    print(
        f"rank {waiter}: waited {wall:.2f} s in {what}, cpu {cpu:.2f} s ({cpu / wall:.0%}), "
        f"runnable {ready:.2f} s ({ready / wall:.0%}), naps {naps}"
    )


torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model)


def step():
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    opt.step()


step()  # the plan is made; the step below waits in its reduction only
waited("an allreduce", 0, lambda: fm.allreduce_(torch.ones(4)))
waited("a DistributedOptimizer step", 1, step)
