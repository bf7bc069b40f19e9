"""A 3000-step soak at 2 ranks (tests/workers/soak_worker.py): resident memory and open file
descriptors stay flat over training steps, check_consistency and checkpoints."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402


def test_3000_steps_keep_rss_and_descriptors_flat(tmp_path):
    _, out = run_mpi("soak_worker.py", 2, 3000, str(tmp_path), timeout=240)
    for r in (0, 1):
        assert f"rank {r}: 3000 steps in" in out and f"rank {r}: flat" in out, out[-3000:]
