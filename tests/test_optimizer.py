import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_cases_on, run_mpi  # noqa: E402


@pytest.mark.parametrize("np", [1, 2, 3])
def test_optimizer_multirank(np):
    out = run_cases_on("optimizer_worker.py", np, timeout=300)
    assert f"on {np} ranks" in out


def test_planner_buckets():
    import fluxmpi_py as fm
    from fluxmpi_py._loader import C

    fm.Init()
    params = [torch.zeros(n, dtype=dt) for n, dt in
              [(10, torch.float32), (300, torch.float32), (5, torch.float64), (20, torch.float32), (7, torch.float64)]]
    # cap 100 bytes: 25 floats; direct from 1000 bytes
    r = C.GradientReducer(params, 100, 1000, "average", "", 0)
    plan = r.plan()
    assert [b["members"] for b in plan] == [[1], [0], [2, 4], [3]], plan
    assert plan[0]["direct"] and not plan[1]["direct"]
    for b in plan:
        if not b["direct"] and len(b["members"]) > 1:
            esz = 8 if b["dtype"] == "Double" else 4
            assert b["numel"] * esz <= 100
    assert {b["dtype"] for b in plan} == {"Float", "Double"}
    with pytest.raises(ValueError, match="compression"):
        C.GradientReducer(params, 100, 1000, "average", "int8", 0)


@pytest.mark.parametrize("np", [1, 2, 3])
def test_freeze_and_unfreeze_after_wrapping(np):
    out = run_cases_on("freeze_worker.py", np, timeout=300)
    assert f"on {np} ranks" in out


@pytest.mark.parametrize("np", [1, 2, 3])
def test_buffers_kept_in_sync(np):
    out = run_cases_on("buffers_worker.py", np, timeout=300)
    assert f"on {np} ranks" in out


@pytest.mark.parametrize("np", [1, 2])
def test_docstring_examples_run(np):
    _, out = run_mpi("doctest_worker.py", np, "fluxmpi_py.optimizer", "fluxmpi_py.buffers", timeout=180)
    assert f"doctests passed on {np} ranks" in out, out[-4000:]
