"""fluxmpi_py.horovod at world sizes 1, 2 and 3. The cases live in
tests/workers/horovod_face_worker.py, horovod_training_worker.py, horovod_join_names_worker.py and (process sets) tests/workers/horovod_sets_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

# the calls; training; join and the names of calls in flight
WORKER = [
    "horovod_face_worker.py",
    "horovod_training_worker.py",
    "horovod_join_names_worker.py",
]


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3], timeout=180))
def test_horovod_face_under_mpiexec(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("horovod_sets_worker.py", [1, 2, 3], timeout=180))
def test_horovod_process_sets_under_mpiexec(case):
    case.check_passed()
