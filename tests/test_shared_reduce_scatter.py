"""reduce_scatter through shared memory at world sizes 1, 2 and 3, against closed forms,
MPI_Reduce_scatter and the rank-order sum. The cases live in
tests/workers/shared_reduce_scatter_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

WORKER = "shared_reduce_scatter_worker.py"


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3], timeout=240))
def test_shared_reduce_scatter_under_mpiexec(case):
    case.check_passed()
