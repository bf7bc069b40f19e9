"""allgather, gather, scatter, reduce_scatter, alltoall (single, grouped, async, differentiable),
grouped allreduce_/bcast_ and the object collectives at world sizes 1, 2 and 3. The cases live
in tests/workers/gather_collectives_worker.py, gather_grouped_worker.py and gather_gradients_worker.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi, worker_params  # noqa: E402

# closed forms and errors; grouped and async forms; gradients and objects
WORKER = [
    "gather_collectives_worker.py",
    "gather_grouped_worker.py",
    "gather_gradients_worker.py",
]


@pytest.mark.parametrize("case", worker_params(WORKER, [1, 2, 3], timeout=300))
def test_gather_collectives_under_mpiexec(case):
    case.check_passed()


@pytest.mark.parametrize("np", [2, 3])
def test_docstring_examples_hold_on_more_ranks(np):
    modules = ["fluxmpi_py.collectives.rows", "fluxmpi_py.collectives.objects"]
    _, out = run_mpi(
        "doctest_worker.py", np, *modules, "fluxmpi_py.collectives.differentiable", timeout=180
    )
    assert f"doctests passed on {np} ranks" in out, out[-4000:]
