"""A bad argument on one rank only raises on every rank (tests/workers/one_rank_args_worker.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402


@pytest.mark.parametrize("case", worker_params("one_rank_args_worker.py", [2, 3], timeout=180))
def test_bad_argument_on_one_rank_raises_on_every_rank(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("swapped_calls_worker.py", [2, 3], timeout=180))
def test_swapped_calls_raise_on_every_rank(case):
    case.check_passed()
