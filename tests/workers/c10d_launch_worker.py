"""init_process_group("fluxmpi") after fluxmpi_py.Init(), as launched by something other
than a plain mpiexec: with a MASTER_ADDR left in the environment under mpiexec (MPI's ranks
still serve), and under torchrun (a clear error naming mpiexec); with the argument
``scheme``, through the fluxmpi:// rendezvous without Init. Run by tests/test_c10d.py."""

import os
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
if sys.argv[1:] == ["scheme"]:
    assert "MASTER_ADDR" not in os.environ and "RANK" not in os.environ, os.environ
    dist.init_process_group("fluxmpi", init_method="fluxmpi://")
else:
    fm.Init()
    dist.init_process_group("fluxmpi")
t = torch.full((2,), float(dist.get_rank() + 1))
dist.all_reduce(t)
n = dist.get_world_size()
assert t.tolist() == [n * (n + 1) / 2] * 2, t
print(f"rank {dist.get_rank()} of {n}: all_reduce {t.tolist()}", flush=True)
dist.destroy_process_group()
