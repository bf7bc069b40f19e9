"""Rank 1 sleeps past init_process_group's timeout in front of a torch.distributed
collective on the "fluxmpi" backend: the job must end with fluxmpi's timeout report.

Run by tests/test_c10d.py on 2 ranks.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fluxmpi_py  # noqa: F401  (registers the backend and the fluxmpi:// rendezvous)

# no Init first: the fluxmpi:// rendezvous starts fluxmpi_py, with this timeout as the job's
dist.init_process_group("fluxmpi", init_method="fluxmpi://", timeout=timedelta(seconds=4))
if dist.get_rank() == 1:
    time.sleep(60)
t = torch.ones(3)
dist.all_reduce(t)
os.write(1, f"rank {dist.get_rank()} done\n".encode())
