"""fluxmpi_py.Join and hvd.join() (uneven inputs) at world sizes 1, 2 and 3. The cases live in
tests/workers/join_worker.py and hvd_join_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

WORKER = "join_worker.py"


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3], timeout=180))
def test_join_under_mpiexec(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("hvd_join_worker.py", [1, 2, 3], timeout=180))
def test_hvd_join_under_mpiexec(case):
    case.check_passed()
