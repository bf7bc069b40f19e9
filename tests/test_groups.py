"""Sub-groups (fluxmpi_py.new_group and group=) at 3 ranks; the cases live in
tests/workers/groups_worker.py. A member that leaves while another waits in a group collective
ends the job (tests/workers/group_exit_worker.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi, worker_params  # noqa: E402


@pytest.mark.parametrize("case", worker_params("groups_worker.py", [3], timeout=240))
def test_groups_under_mpiexec(case):
    case.check_passed()


def test_member_exiting_during_a_group_collective_ends_the_job():
    rc, out = run_mpi("group_exit_worker.py", 3, "exit", timeout=90, expect_ok=False)
    assert rc != 0, out[-3000:]
    assert "rank 2 has exited" in out and "on group [0, 2]" in out, out[-3000:]
    assert "the group collective returned" not in out, out[-3000:]


def test_member_exiting_during_a_members_only_group_collective_ends_the_job():
    rc, out = run_mpi("group_exit_worker.py", 3, "local", timeout=90, expect_ok=False)
    assert rc != 0, out[-3000:]
    assert "rank 2 has exited" in out and "on group [0, 2]" in out, out[-3000:]
    assert "the group collective returned" not in out, out[-3000:]


def test_member_killed_during_a_group_collective_ends_the_job():
    rc, out = run_mpi("group_exit_worker.py", 3, "kill", timeout=90, expect_ok=False)
    assert rc != 0, out[-3000:]
    assert "the group collective returned" not in out, out[-3000:]
