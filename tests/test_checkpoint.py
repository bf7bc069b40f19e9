"""save_checkpoint / load_checkpoint at 1, 2 and 3 ranks (tests/workers/checkpoint_worker.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402


@pytest.mark.parametrize("case", worker_params("checkpoint_worker.py", [1, 2, 3], timeout=180))
def test_checkpoint_round_trip_and_errors(case):
    case.check_passed()
