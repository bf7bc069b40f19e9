"""allreduce_, bcast_, reduce_, Iallreduce, Ibcast at world sizes 1, 2, 3 and 4 (and a world of
one started without mpiexec). The cases live in tests/workers/collectives_worker.py."""
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, WORKERS, mpi_env, run_cases_on  # noqa: E402

WORKER = "collectives_worker.py"


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_collectives_under_mpiexec(np):
    out = run_cases_on(WORKER, np, timeout=300)
    assert f"on {np} ranks" in out
    # fluxmpi_println(..., ordered=True) on stdout: every rank's line, in rank order
    lines = re.findall(rf"^\[(\d+) / {np}\] ordered-stdout (\d+)$", out, re.M)
    assert [int(a) for a, _ in lines] == list(range(np)), out[-2000:]
    assert f"[{np - 1} / {np}] only-rank-{np - 1}-prints" in out


def test_collectives_without_mpiexec():
    # A plain `python script.py` is a world of one (MPI singleton), as in Jupyter.
    env = mpi_env()
    for k in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_", "OMPI_MCA_orte"))]:
        del env[k]
    proc = subprocess.run([sys.executable, os.path.join(WORKERS, WORKER)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "HARNESS: all" in out and "on 1 ranks" in out, out[-4000:]
