"""torch.distributed on the "fluxmpi" backend (fluxmpi_py/c10d.py, csrc/c10d/): collectives,
Work and futures, send/recv, object collectives, agreement errors on every rank, and DDP /
ZeroRedundancyOptimizer / FSDP against gloo or one process, at 1, 2 and 3 ranks and without
mpiexec. The cases live in tests/workers/c10d_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

WORKER = "c10d_worker.py"


@pytest.mark.parametrize("case", worker_params(WORKER, [None, 1, 2, 3], timeout=400))
def test_c10d_backend_under_mpiexec(case):
    case.check_passed()


def test_import_registers_the_backend():
    import torch.distributed as dist

    import fluxmpi_py  # noqa: F401

    assert "fluxmpi" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["fluxmpi"] == ["cpu", "cuda"]
