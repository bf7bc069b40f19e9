"""Exact resume: a 2-rank run killed after its checkpoint and resumed from it ends
bit-identical to an uninterrupted run (tests/workers/resume_worker.py): model, optimizer state,
every rank's generators and the data position. Without restoring the generators it does not.
Relaunched by ``python -m fluxmpi_py.run --max-restarts 1`` and resuming from
``fm.latest_checkpoint``, it ends the same, by itself."""

import os
import re
import signal
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, find_mpiexec, mpi_env, run_mpi, worker_path  # noqa: E402

NP = 2
TIMEOUT = 240


def finals(directory, mode):
    return [
        torch.load(os.path.join(directory, f"final-{mode}-rank{r}.pt"), weights_only=True)
        for r in range(NP)
    ]


def differences(a, b, path=""):
    """The paths at which two nested results differ (tensors compared bit for bit)."""
    if isinstance(a, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [path]
    if isinstance(a, dict):
        if set(a) != set(b):
            return [f"{path} keys"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [f"{path} length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The directory of an uninterrupted run's finals (final-full-rank<R>.pt)."""
    d = str(tmp_path_factory.mktemp("resume"))
    run_mpi("resume_worker.py", NP, "full", d, timeout=180)
    os.remove(os.path.join(d, "ckpt.pt"))  # a killed run must write its own
    return d


def test_killed_run_resumes_bit_identical(full_run):
    d = full_run

    rc, out = run_mpi("resume_worker.py", NP, "killed", d, timeout=180, expect_ok=False)
    assert rc != 0 and "killing myself after step 10" in out, out[-3000:]
    assert os.path.exists(os.path.join(d, "ckpt.pt")), out[-3000:]

    # and the control: the same resume without the generators' states (one launch for both;
    # each mode seeds everything as a fresh process does)
    run_mpi("resume_worker.py", NP, "resume,resume_norng", d, timeout=180)
    full, resumed = finals(d, "full"), finals(d, "resume")
    for r in range(NP):
        assert differences(full[r], resumed[r]) == [], f"rank {r}"

    # The control ends elsewhere.
    norng = finals(d, "resume_norng")
    assert ".model.0.weight" in differences(full[0], norng[0])
    assert ".torch" in differences(full[1], norng[1])


def run_launcher(*args, timeout=TIMEOUT):
    """``python -m fluxmpi_py.run ARGS`` under a timeout: (status, output). At the timeout the
    launcher gets SIGTERM, on which it ends its mpiexec, and the test fails."""
    cmd = [sys.executable, "-m", "fluxmpi_py.run", "--mpiexec", find_mpiexec(), *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=ROOT
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"fluxmpi_py.run did not finish in {timeout}s:\n{out[-4000:]}")
    return proc.returncode, out


def test_killed_run_restarts_by_itself_bit_identical(full_run):
    # Attempt 0 saves at steps 4 and 8 and loses its last rank to SIGKILL after step 10; the
    # launcher relaunches the job, which resumes from the newest checkpoint (step 8) and ends
    # where the uninterrupted run did. --grace 60: this test reads mpiexec's own ending (which
    # names the rank that exited first); a loaded machine's prterun may take more than the
    # default 5 s to end after a SIGKILL, and then the launcher would end it instead.
    d = full_run
    worker = worker_path("resume_worker.py")
    rc, out = run_launcher(
        "--grace", "60", "-n", str(NP), "--oversubscribe", "--max-restarts", "1",
        sys.executable, worker, "restart", d,
    )  # fmt: skip
    assert rc == 0, out[-6000:]
    assert "killing myself after step 10" in out, out[-6000:]
    assert "fluxmpi_py.run: attempt 1 of 2 failed: exit status" in out, out[-6000:]
    assert "Relaunching now (FLUXMPI_RESTART=1; restart 1 of 1)" in out, out[-6000:]
    # the killed rank is named, though its DataLoader workers outlived it a moment
    assert re.search(r"first seen to exit: [^\n]*rank 1 \(pid", out), out[-6000:]
    assert "rank 0: attempt 0 starts at step 0 from the start" in out, out[-6000:]
    assert "rank 1: attempt 1 starts at step 8 from ckpt-008.pt" in out, out[-6000:]
    full, restarted = finals(d, "full"), finals(d, "restart")
    for r in range(NP):
        assert differences(full[r], restarted[r]) == [], f"rank {r}"
