"""Exact resume: a 2-rank run killed after its checkpoint and resumed from it ends
bit-identical to an uninterrupted run (tests/workers/resume_worker.py): model, optimizer state,
every rank's generators and the data position. Without restoring the generators it does not."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402

NP = 2


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


def test_killed_run_resumes_bit_identical(tmp_path):
    d = str(tmp_path)
    run_mpi("resume_worker.py", NP, "full", d, timeout=180)
    os.remove(os.path.join(d, "ckpt.pt"))  # the killed run must write its own

    rc, out = run_mpi("resume_worker.py", NP, "killed", d, timeout=180, expect_ok=False)
    assert rc != 0 and "killing myself after step 10" in out, out[-3000:]
    assert os.path.exists(os.path.join(d, "ckpt.pt")), out[-3000:]

    run_mpi("resume_worker.py", NP, "resume", d, timeout=180)
    full, resumed = finals(d, "full"), finals(d, "resume")
    for r in range(NP):
        assert differences(full[r], resumed[r]) == [], f"rank {r}"

    # The control: the same resume without the generators' states ends elsewhere.
    run_mpi("resume_worker.py", NP, "resume_norng", d, timeout=180)
    norng = finals(d, "resume_norng")
    assert ".model.0.weight" in differences(full[0], norng[0])
    assert ".torch" in differences(full[1], norng[1])
