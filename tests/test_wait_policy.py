"""Open MPI yields the core while a rank waits, whatever the import order: Init switches it on
at run time when mpi4py started MPI first, and keeps busy-polling when the user asked for it
(OMPI_MCA_mpi_yield_when_idle=0). Read from Open MPI's own flag. Worker: wait_worker.py."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import _command, mpi_env, worker_path  # noqa: E402


def launch(order, yield_env=None):
    env = mpi_env()
    env.pop("OMPI_MCA_mpi_yield_when_idle", None)  # as a shell without fluxmpi_py imported
    if yield_env is not None:
        env["OMPI_MCA_mpi_yield_when_idle"] = yield_env
    cmd = _command(worker_path("wait_worker.py"), 2, [order])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    print(out[-3000:])
    assert p.returncode == 0, out[-3000:]
    return out


@pytest.mark.parametrize(
    "order,before,wait",
    [
        ("fluxmpi_py_first", "None", "yield (set when MPI started)"),
        ("mpi4py_first", "False", "yield (set by fluxmpi_py.Init)"),
    ],
)
def test_open_mpi_yields_whatever_the_import_order(order, before, wait):
    out = launch(order)
    for r in range(2):
        assert f"rank {r}: before={before} after=True wait={wait}" in out, out[-3000:]


def test_polling_stays_when_the_user_asks_for_it():
    out = launch("mpi4py_first", yield_env="0")
    for r in range(2):
        line = f"rank {r}: before=False after=False wait=poll (OMPI_MCA_mpi_yield_when_idle=0)"
        assert line in out, out[-3000:]
