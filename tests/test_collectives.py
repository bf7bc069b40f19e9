"""allreduce_, bcast_, reduce_, Iallreduce, Ibcast at world sizes 1, 2, 3 and 4 (and a world of
one started without mpiexec). The cases live in tests/workers/collectives_worker.py."""
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import worker_params  # noqa: E402

WORKER = "collectives_worker.py"


def check_ordered_stdout(out, np):
    # fluxmpi_println(..., ordered=True) on stdout: every rank's line, in rank order
    lines = re.findall(rf"^\[(\d+) / {np}\] ordered-stdout (\d+)$", out, re.M)
    assert [int(a) for a, _ in lines] == list(range(np)), out[-2000:]
    assert f"[{np - 1} / {np}] only-rank-{np - 1}-prints" in out


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3, 4], timeout=300))
def test_collectives_under_mpiexec(case):
    out = case.run()
    if case.name == "case_print_prefix_and_order":  # what that case printed to the job's stdout
        check_ordered_stdout(out, case.np)


@pytest.mark.parametrize("case", worker_params(WORKER, [None], timeout=300))
def test_collectives_without_mpiexec(case):
    # A plain `python script.py` is a world of one (MPI singleton), as in Jupyter.
    case.run()
