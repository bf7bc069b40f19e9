"""SyncBatchNorm against one process with the whole batch, at world sizes 1, 2 and 3. The cases
live in tests/workers/sync_batchnorm_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi, worker_params  # noqa: E402

WORKER = "sync_batchnorm_worker.py"


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3], timeout=240))
def test_sync_batchnorm_under_mpiexec(case):
    case.check_passed()


@pytest.mark.parametrize("np", [2, 3])
def test_docstring_examples_hold_on_more_ranks(np):
    _, out = run_mpi("doctest_worker.py", np, "fluxmpi_py.training.sync_batchnorm", timeout=180)
    assert f"doctests passed on {np} ranks" in out, out[-4000:]
