"""save_checkpoint / load_checkpoint at 1, 2 and 3 ranks (tests/workers/checkpoint_worker.py
and checkpoint_damage_worker.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

# the round trips; what must not load wrong (issue 33)
WORKERS = ["checkpoint_worker.py", "checkpoint_damage_worker.py"]


@pytest.mark.parametrize("case", worker_params(WORKERS, [1, 2, 3], timeout=180))
def test_checkpoint_round_trip_and_errors(case):
    case.check_passed()
