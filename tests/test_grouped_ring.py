"""grouped_allreduce_ reduced where the tensors lie (the MPI ring over their memory, no pack)
at world sizes 1, 2 and 3, against closed forms and the pack path. The cases live in
tests/workers/grouped_ring_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

WORKER = "grouped_ring_worker.py"


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3], timeout=240))
def test_grouped_ring_under_mpiexec(case):
    case.check_passed()
