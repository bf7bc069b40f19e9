"""The shrink mode (Init(on_failure="shrink")), run by tests/test_elastic.py under
`mpiexec --with-ft ulfm`. Usage: elastic_worker.py MODE [ARGS].

    collectives VICTIMS [LINGER]  allreduce_ of ones, 8 calls; each rank of VICTIMS (comma-
                           separated world ranks) SIGKILLs itself before call 3 (the next after
                           5); the survivors recover and redo the call: every result is the live
                           count. LINGER: seconds the survivors wait before they end
    no_ulfm                Init(on_failure="shrink") where the job was started without ULFM
    bad_value              Init(on_failure="sometimes")
    ddp                    init_process_group("fluxmpi") in the mode: refused on every rank
    group                  a group of ranks 0, 1 made on 4 ranks; rank 3 SIGKILLs itself; after the
                           recovery every survivor's allreduce_ on the old group raises (prints
                           "rank R: stale: ..."), and one on a group made again sums 2
Prints one line per rank at the end: "rank R of N: sums [...] lost [...]".
"""

import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

mode = sys.argv[1]
if mode == "no_ulfm":
    try:
        fm.Init(on_failure="shrink")
    except RuntimeError as e:
        print(f"RuntimeError: {e}", flush=True)
        sys.exit(0)
    sys.exit("Init(on_failure='shrink') without ULFM did not raise")
if mode == "bad_value":
    try:
        fm.Init(on_failure="sometimes")
    except ValueError as e:
        print(f"ValueError: {e}", flush=True)
        sys.exit(0)
    sys.exit("Init(on_failure='sometimes') did not raise")

fm.Init(on_failure="shrink")
assert fm.on_failure() == "shrink"
if mode == "ddp":
    import torch.distributed as dist

    try:
        dist.init_process_group("fluxmpi")
    except RuntimeError as e:
        print(f"RuntimeError: {e}", flush=True)
        sys.exit(0)
    sys.exit("init_process_group('fluxmpi') in the shrink mode did not raise")
if mode == "group":
    g = fm.new_group([0, 1])
    fm.allreduce_(torch.ones(1), group=g) if fm.local_rank() < 2 else None
    if fm.local_rank() == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        fm.allreduce_(torch.ones(1))
    except fm.RanksLostError:
        fm.recover()
    try:
        fm.allreduce_(torch.ones(1), group=g)
        print(f"rank {fm.local_rank()}: the stale group did not raise", flush=True)
    except RuntimeError as e:
        print(f"rank {fm.local_rank()}: stale: {e}", flush=True)
    g = fm.new_group([0, 1])
    if fm.local_rank() < 2:
        t = torch.ones(1)
        fm.allreduce_(t, group=g)
        print(f"rank {fm.local_rank()}: the new group sums {int(t[0])}", flush=True)
    fm.barrier()
    sys.exit(0)
victims = [int(v) for v in sys.argv[2].split(",")]
me = fm.local_rank()  # this rank's number in the first world
sums, lost = [], []
call = 0
while call < 8:
    if me in victims and call == (3 if me == victims[0] else 5):
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(4)
    try:
        fm.allreduce_(t)
    except fm.RanksLostError:
        info = fm.recover()
        lost += [info["lost"]]
        continue  # the call again, on the smaller world
    sums.append(int(t[0]))
    call += 1
print(f"rank {me} of {fm.total_workers()}: sums {sums} lost {lost}", flush=True)
if len(sys.argv) > 3:
    fm.barrier()
    time.sleep(float(sys.argv[3]))
