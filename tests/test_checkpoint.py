"""save_checkpoint / load_checkpoint at 1, 2 and 3 ranks (tests/workers/checkpoint_worker.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    # One directory for every launch (the worker makes a subdirectory per world size): the
    # launch is shared by all the cases of a world size, so its environment must be too.
    return str(tmp_path_factory.mktemp("checkpoints"))


@pytest.mark.parametrize(
    "case", worker_params("checkpoint_worker.py", [1, 2, 3], timeout=180, bundle=False)
)
def test_checkpoint_round_trip_and_errors(case, ckpt_dir):
    case.check_passed(env={"CKPT_DIR": ckpt_dir})
