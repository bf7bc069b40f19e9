"""Logging with the rank in every record (fluxmpi_py.logs), at 1 and 2 ranks."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402


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
