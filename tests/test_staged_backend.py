"""Staging through host memory (csrc/backend/staged_backend.*): the collectives NCCL lacks take
it for CUDA tensors when MPI is not CUDA-aware or disable_cudampi_support() is set. The logic is
device-neutral; here it stages CPU tensors through second host buffers, and every case of the
gather collectives' worker must still hold."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402


@pytest.mark.parametrize("np", [2, 3])
def test_gather_collectives_hold_when_staged_through_host_buffers(np):
    _, out = run_mpi("staged_worker.py", np, timeout=400)
    assert "HARNESS: all" in out and f"passed on {np} ranks" in out, out[-4000:]
    assert "ok case_staging_moved_the_bytes" in out, out[-4000:]


def test_groups_hold_when_staged_through_host_buffers():
    # What CUDA tensors take on a group: the group's communicator, ranks and roots.
    _, out = run_mpi("staged_worker.py", 3, timeout=400, env={"STAGED_WORKER": "groups_worker"})
    assert "HARNESS: all" in out and "passed on 3 ranks" in out, out[-4000:]
    assert "ok case_row_collectives_on_a_group_with_group_roots" in out, out[-4000:]
    assert "ok case_staging_moved_the_bytes" in out, out[-4000:]
