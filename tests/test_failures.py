"""A job whose rank fails or leaves early must end, with a message, instead of hanging; a job
that ends normally must exit 0 promptly. Workers: tests/workers/failure_worker.py and
failing_worker.py. The only time limit here is the hard kill timeout of each launch (run_mpi
fails the test if it fires): times are printed, not asserted."""
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_cases_on, run_mpi  # noqa: E402

TIMEOUT = 120  # only a hung job comes near this


def launch(mode, np=2):
    t0 = time.monotonic()
    rc, out = run_mpi("failure_worker.py", np, mode, timeout=TIMEOUT, expect_ok=False)
    print(f"{mode} on {np} ranks: exit code {rc} after {time.monotonic() - t0:.1f}s")
    return rc, out


def test_uncaught_exception_ends_job_with_its_message():
    rc, out = launch("raise")
    assert rc != 0, out[-3000:]
    assert "RuntimeError: deliberate failure on rank 1" in out, out[-3000:]
    assert "uncaught RuntimeError on rank 1" in out, out[-3000:]
    assert "the collective returned" not in out


def test_uncaught_exception_in_a_thread_ends_job():
    rc, out = launch("thread_raise")
    assert rc != 0, out[-3000:]
    assert "uncaught ZeroDivisionError on rank 1" in out, out[-3000:]


@pytest.mark.parametrize("mode,np", [("exit", 2), ("return", 2), ("exit_early", 2),
                                     ("exit_async", 2), ("exit", 4)])
def test_rank_leaving_early_ends_job_naming_it(mode, np):
    rc, out = launch(mode, np)
    leaver = np - 1
    assert rc != 0, out[-3000:]
    assert f"rank {leaver} has exited" in out and "can never join" in out, out[-3000:]
    assert "the collective returned" not in out


@pytest.mark.parametrize("mode,np", [("clean", 2), ("root_leaves", 4), ("slow_peer", 2)])
def test_normal_end_exits_zero(mode, np):
    rc, out = launch(mode, np)
    assert rc == 0, out[-3000:]
    assert all(f"rank {r} done" in out for r in range(np)), out[-3000:]
    assert "aborting" not in out and "MPI_ABORT" not in out, out[-3000:]


def test_failing_assertion_on_one_rank_fails_the_launch():
    with pytest.raises(pytest.fail.Exception) as info:
        run_cases_on("failing_worker.py", 2, timeout=TIMEOUT)
    msg = str(info.value)
    assert "exited" in msg and "deliberate assertion failure on rank 1" in msg, msg[-3000:]
