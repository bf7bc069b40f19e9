"""torch.distributed on the "fluxmpi" backend (fluxmpi_py/c10d.py, csrc/c10d/): collectives,
Work and futures, send/recv, object collectives, agreement errors on every rank, and DDP /
ZeroRedundancyOptimizer / FSDP against gloo or one process, at 1, 2 and 3 ranks and without
mpiexec; sub-groups, a 2-D DeviceMesh and HSDP also at 4; groups made by their members alone,
unsorted and split; bitwise ops and PREMUL_SUM. The cases live in tests/workers/c10d_worker.py,
c10d_groups_worker.py, c10d_group_forms_worker.py and c10d_reduce_ops_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi, worker_params  # noqa: E402

WORKER = "c10d_worker.py"


@pytest.mark.parametrize("case", worker_params(WORKER, [None, 1, 2, 3], timeout=400))
def test_c10d_backend_under_mpiexec(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("c10d_groups_worker.py", [1, 2, 3, 4], timeout=400))
def test_c10d_subgroups_and_device_mesh(case):
    case.check_passed()


@pytest.mark.parametrize(
    "case", worker_params("c10d_group_forms_worker.py", [1, 2, 3], timeout=300)
)
def test_c10d_local_unsorted_and_split_groups(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("c10d_reduce_ops_worker.py", [1, 2, 3], timeout=300))
def test_c10d_bitwise_and_premul_sum(case):
    case.check_passed()


def test_import_registers_the_backend():
    import torch.distributed as dist

    import fluxmpi_py  # noqa: F401

    assert "fluxmpi" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["fluxmpi"] == ["cpu", "cuda"]


def test_init_process_group_timeout_ends_a_stalled_job_with_the_report():
    env = {"FLUXMPI_STALL_WARNING": "1"}
    rc, out = run_mpi("c10d_stall_worker.py", 2, env=env, timeout=120, expect_ok=False)
    assert rc != 0, out[-3000:]
    assert "fluxmpi_py: timeout: collective call #" in out, out[-4000:]
    assert "torch.distributed.all_reduce()" in out and "not entered it: rank 1" in out
    assert "the timeout is 4.0 s" in out, out[-4000:]
    assert "rank 1 done" not in out and "rank 0 done" not in out
