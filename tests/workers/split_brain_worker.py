"""Training through a cut network in the shrink mode (tests/test_split_brain.py): five ranks on
three virtual hosts (2, 2, 1); the test cuts the link of a 2-rank host mid-training.

Every step allreduces ones (the sum is the world's live size) and adds it to a total. On
RanksLostError the ranks recover() and redo the step on the smaller world. A side that is not a
majority of the old world (nor exactly half holding its rank 0) is ended by recover() itself.
Each rank prints "rank R on HOST training" after 20 steps, then, at the end, "rank R of N
finished: steps S total T sizes [...]" on stderr (which the test sends to a file per rank). It trains until AFTER steps have passed on a smaller
world (or MAX_STEPS without a loss).
"""

import os
import socket
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

AFTER, MAX_STEPS = 30, 3000
fm.Init(on_failure="shrink")
me = fm.local_rank()
step, total, sizes, since = 0, 0, [], None
while step < MAX_STEPS and (since is None or step < since + AFTER):
    t = torch.ones(1)
    try:
        fm.allreduce_(t)
    except fm.RanksLostError:
        fm.recover()
        since = step if since is None else since
        continue
    total += int(t[0])
    if not sizes or sizes[-1][0] != int(t[0]):
        sizes.append([int(t[0]), step])
    step += 1
    if step == 20:
        print(f"rank {me} on {socket.gethostname()} training", flush=True)
    time.sleep(0.02)
print(
    f"rank {me} of {fm.total_workers()} finished: steps {step} total {total} sizes {sizes}",
    file=sys.stderr,
    flush=True,
)
