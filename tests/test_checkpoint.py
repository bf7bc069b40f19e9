"""save_checkpoint / load_checkpoint at 1, 2 and 3 ranks (tests/workers/checkpoint_worker.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_cases_on  # noqa: E402


@pytest.mark.parametrize("np", [1, 2, 3])
def test_checkpoint_round_trip_and_errors(np, tmp_path):
    out = run_cases_on("checkpoint_worker.py", np, timeout=180, env={"CKPT_DIR": str(tmp_path)})
    assert f"on {np} ranks" in out
