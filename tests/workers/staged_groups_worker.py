"""The sub-group cases (groups_worker.py) with every CPU tensor staged through a second host
buffer: csrc/backend/staged_backend.*, the path CUDA tensors take on a group (group=), run
here with a host copier over each group's MPI communicator, its ranks and roots. Then a
check that staging ran.

Run by tests/test_staged_backend.py under mpiexec at 3 ranks.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import groups_worker as groups  # noqa: E402
from harness import run_cases  # noqa: E402

from fluxmpi_py._loader import C  # noqa: E402


def case_staging_moved_the_bytes():
    assert C.staged_host_bytes() > 0, "no collective went through the staged backend"


if __name__ == "__main__":
    C.set_stage_host(True)
    cases = {k: v for k, v in vars(groups).items() if k.startswith("case_")}
    cases["case_staging_moved_the_bytes"] = case_staging_moved_the_bytes
    run_cases(cases)
