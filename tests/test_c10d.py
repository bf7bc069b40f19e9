"""torch.distributed on the "fluxmpi" backend (fluxmpi_py/c10d.py, csrc/c10d/): collectives,
Work and futures, send/recv, object collectives, agreement errors on every rank, and DDP /
ZeroRedundancyOptimizer / FSDP against gloo or one process, at 1, 2 and 3 ranks and without
mpiexec; sub-groups, a 2-D DeviceMesh and HSDP also at 4; groups made by their members alone,
unsorted and split; bitwise ops and PREMUL_SUM. The cases live in tests/workers/c10d_worker.py,
c10d_async_worker.py, c10d_ddp_worker.py, c10d_groups_worker.py, c10d_group_forms_worker.py and c10d_reduce_ops_worker.py."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi, singleton_env, worker_params, worker_path  # noqa: E402

# the collectives; async work, point-to-point and objects; training (DDP, ZeRO, FSDP)
WORKER = ["c10d_worker.py", "c10d_async_worker.py", "c10d_ddp_worker.py"]


@pytest.mark.parametrize("case", worker_params(WORKER, [None, 1, 2, 3], timeout=400))
def test_c10d_backend_under_mpiexec(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("c10d_groups_worker.py", [1, 2, 3, 4], timeout=400))
def test_c10d_subgroups_and_device_mesh(case):
    case.check_passed()


@pytest.mark.parametrize(
    "case", worker_params("c10d_group_forms_worker.py", [1, 2, 3], timeout=300)
)
def test_c10d_local_unsorted_and_split_groups(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("c10d_reduce_ops_worker.py", [1, 2, 3], timeout=300))
def test_c10d_bitwise_and_premul_sum(case):
    case.check_passed()


@pytest.mark.parametrize(
    "case", worker_params("sum_order_worker.py", [1, 3], timeout=120, bundle=False)
)
def test_sum_order_from_the_environment(case):
    case.check_passed()


def test_import_registers_the_backend():
    import torch.distributed as dist

    import fluxmpi_py  # noqa: F401

    assert "fluxmpi" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["fluxmpi"] == ["cpu", "cuda"]


def test_init_process_group_timeout_ends_a_stalled_job_with_the_report():
    env = {"FLUXMPI_STALL_WARNING": "1"}
    rc, out = run_mpi("c10d_stall_worker.py", 2, env=env, timeout=120, expect_ok=False)
    assert rc != 0, out[-3000:]
    assert "fluxmpi_py: timeout: collective call #" in out, out[-4000:]
    assert "torch.distributed.all_reduce()" in out and "not entered it: rank 1" in out
    assert "the timeout is 4.0 s" in out, out[-4000:]
    assert "rank 1 done" not in out and "rank 0 done" not in out


def test_master_addr_left_in_the_environment_under_mpiexec_still_takes_mpi_ranks():
    # a cluster's job script, or an earlier gloo setup, may leave MASTER_ADDR set; without
    # RANK (which torchrun sets) mpiexec's ranks serve, as without it
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    _, out = run_mpi("c10d_launch_worker.py", 2, env=env, timeout=120)
    for r in range(2):
        assert f"rank {r} of 2: all_reduce [3.0, 3.0]" in out, out[-3000:]


def test_values_inherited_from_a_process_that_ran_init_are_replaced():
    # a script that ran fm.Init() and then starts mpiexec passes its own values on; the
    # marker says they were ours, not a launcher's, so each rank sets its own
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
           "FLUXMPI_TORCH_ENV": "0,1,127.0.0.1,1"}  # fmt: skip
    _, out = run_mpi("c10d_launch_worker.py", 2, env=env, timeout=120)
    for r in range(2):
        assert f"rank {r} of 2: all_reduce [3.0, 3.0]" in out, out[-3000:]


def test_the_fluxmpi_scheme_needs_no_init_first():
    _, out = run_mpi("c10d_launch_worker.py", 2, "scheme", timeout=120)
    for r in range(2):
        assert f"rank {r} of 2: all_reduce [3.0, 3.0]" in out, out[-3000:]


def test_torchrun_gets_an_error_naming_mpiexec():
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.fail(f"{torchrun} not found: torch installs it")
    env = singleton_env({"OMP_NUM_THREADS": "1"})
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(k, None)
    proc = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", "29998",
         worker_path("c10d_launch_worker.py")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "the fluxmpi backend takes its ranks from MPI" in out, out[-3000:]
    assert "mpiexec -n 2 python script.py" in out, out[-3000:]
