"""Logging with the rank in every record (fluxmpi_py.logs), at 1 and 2 ranks."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, mpi_env, run_mpi  # noqa: E402


@pytest.mark.parametrize("np", [1, 2])
def test_rank_in_every_record(np):
    _, out = run_mpi("logs_worker.py", np, timeout=120)
    lines = out.splitlines()
    for r in range(np):
        assert f"[{r} / {np}] INFO before init" in lines
        assert f"[{r} / {np}] INFO after init" in lines
    assert not any("hidden" in line for line in lines)
    assert [line for line in lines if "only rank 0" in line] == [f"[0 / {np}] WARNING only rank 0"]
    assert [line for line in lines if line.endswith("once")] == [f"[0 / {np}] WARNING once"]
    assert [line for line in lines if "custom" in line] == [f"custom rank={np - 1} last rank"]


def test_docstring_examples_of_logs_checkpoint_launch():
    # Every public name's example, in a world of one (launch's own example needs mpiexec and
    # is skipped there; tests/test_launch.py runs it for real).
    code = r"""
import doctest, sys
import fluxmpi_py
fails = 0
for name in ("logs", "checkpoint", "launch"):
    m = sys.modules["fluxmpi_py." + name]
    res = doctest.testmod(m, optionflags=doctest.ELLIPSIS)
    print(name, res)
    fails += res.failed
    missing = [n for n in m.__all__ if callable(getattr(m, n)) and ">>>" not in (getattr(m, n).__doc__ or "")]
    assert not missing, f"no example in the docstring of {missing}"
sys.exit(1 if fails else 0)
"""
    env = mpi_env()
    for k in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_"))]:
        del env[k]
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "attempted=0" not in p.stdout, p.stdout
