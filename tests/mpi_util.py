"""Launch a worker script under mpiexec with a hard timeout, for the pytest session.

A worker that fails on any rank makes mpiexec exit non-zero (our excepthook aborts the job);
a worker that hangs is killed with its whole process group when the timeout expires. Either
way the pytest test fails with the tail of the output, and CI never hangs.
"""
import os
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKERS = os.path.join(ROOT, "tests", "workers")


def mpi_env(extra=None):
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    if extra:
        env.update(extra)
    return env


def run_mpi(script, np, *args, timeout=180, env=None, expect_ok=True):
    """Run ``tests/workers/<script>`` (or a path) on ``np`` ranks; return (rc, stdout+stderr)."""
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.fail("mpiexec not found: run `make test`, which installs Open MPI")
    path = script if os.path.isabs(script) else os.path.join(WORKERS, script)
    cmd = [mpiexec, "-n", str(np), "--oversubscribe", sys.executable, path, *map(str, args)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=mpi_env(env), cwd=ROOT, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{os.path.basename(path)} on {np} ranks did not finish in {timeout}s:\n{out[-4000:]}")
    if expect_ok and proc.returncode != 0:
        pytest.fail(f"{os.path.basename(path)} on {np} ranks exited {proc.returncode}:\n{out[-6000:]}")
    return proc.returncode, out


def run_cases_on(script, np, timeout=180, env=None):
    """Run a harness worker and check that rank 0 reported every case passed."""
    rc, out = run_mpi(script, np, timeout=timeout, env=env)
    assert "HARNESS: all" in out and "cases passed" in out, out[-4000:]
    return out
