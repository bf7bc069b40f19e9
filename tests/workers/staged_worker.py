"""A worker's cases with every CPU tensor staged through a second host buffer:
csrc/backend/staged_backend.*, the path CUDA tensors take over MPI when it is not CUDA-aware,
and on a group (group=), run here with a host copier. Then a check that staging ran.

STAGED_WORKER names the worker whose cases run (default gather_collectives_worker; also
groups_worker: the group's communicator, ranks and roots). Run by tests/test_staged_backend.py
under mpiexec.
"""

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_cases  # noqa: E402

from fluxmpi_py._core import C  # noqa: E402


def case_staging_moved_the_bytes():
    assert C.staged_host_bytes() > 0, "no collective went through the staged backend"


if __name__ == "__main__":
    C.set_stage_host(True)
    worker = importlib.import_module(os.environ.get("STAGED_WORKER", "gather_collectives_worker"))
    cases = {k: v for k, v in vars(worker).items() if k.startswith("case_")}
    cases["case_staging_moved_the_bytes"] = case_staging_moved_the_bytes
    run_cases(cases)
