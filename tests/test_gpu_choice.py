"""Init's GPU choice (fluxmpi_py/runtime/gpu_choice.py), without a GPU: which device each node-local
rank takes, and which ranks would share one (NCCL refuses that)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, run_mpi  # noqa: E402

from fluxmpi_py.runtime.gpu_choice import (
    LOCAL_RANK_VARIABLES,
    choose_gpu,
    device_before_init,
    launcher_local_rank,
    physical_gpu_id,
    sharing_by_identity,
)


@pytest.mark.parametrize(
    "node_size, count, want",
    [(1, 1, [0]), (2, 2, [0, 1]), (4, 2, [0, 1, 0, 1]), (3, 8, [0, 1, 2])],
)
def test_round_robin_by_node_rank(node_size, count, want):
    assert [choose_gpu(r, node_size, count).device for r in range(node_size)] == want


def test_no_gpu_no_device():
    c = choose_gpu(0, 4, 0)
    assert c.device is None and c.shared == {} and c.sharing_message() == ""


def test_more_ranks_than_gpus_names_who_shares():
    c = choose_gpu(1, 5, 2)
    assert c.shared == {"cuda:0": (0, 2, 4), "cuda:1": (1, 3)}
    assert c.sharing_message() == (
        "node-local ranks 0, 2 and 4 share cuda:0; node-local ranks 1 and 3 share cuda:1 "
        "(5 ranks, 2 GPUs)"
    )
    assert choose_gpu(0, 2, 2).sharing_message() == ""


def test_gpu_devices_chosen_and_checked():
    assert [choose_gpu(r, 2, 4, gpu_devices=[3, 1]).device for r in range(2)] == [3, 1]
    assert choose_gpu(0, 2, 4, gpu_devices=[2, 2]).shared == {"cuda:2": (0, 1)}
    with pytest.raises(ValueError, match=r"2 ranks run on this node, so it needs at least 2"):
        choose_gpu(0, 2, 4, gpu_devices=[0])
    with pytest.raises(ValueError, match=r"cuda:4 is not a GPU of this machine, which has 4"):
        choose_gpu(0, 2, 4, gpu_devices=[0, 4])


# --- before MPI_Init: the launcher's local rank --------------------------------------------------


@pytest.mark.parametrize("name", LOCAL_RANK_VARIABLES)
def test_every_launcher_variable_is_read(name):
    assert launcher_local_rank({name: "2"}) == 2
    assert launcher_local_rank({name: " 2 "}) == 2


def test_launcher_variable_precedence_and_bad_values():
    # mpirun inside a Slurm allocation: SLURM_LOCALID is the daemon's (0 on every rank)
    env = {"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert launcher_local_rank(env) == 1
    assert launcher_local_rank({"MPI_LOCALRANKID": "3", "SLURM_LOCALID": "0"}) == 3
    assert launcher_local_rank({}) is None
    assert launcher_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "", "SLURM_LOCALID": "1"}) == 1
    assert launcher_local_rank({"PMI_LOCAL_RANK": "-1"}) is None
    assert launcher_local_rank({"PMI_LOCAL_RANK": "one"}) is None


@pytest.mark.parametrize("node_size, count", [(1, 1), (2, 2), (4, 2), (3, 8), (2, 1)])
@pytest.mark.parametrize("gpu_devices", [None, "reversed"])
def test_device_before_init_is_the_device_init_keeps(node_size, count, gpu_devices):
    # Init sets the device twice only where the two disagree: the launcher's rank and MPI's
    # node-local rank are the same number, so the choice must be the same function of it.
    devices = list(reversed(range(node_size))) if gpu_devices else None
    if devices is not None and max(devices) >= count:
        devices = [d % count for d in devices]
    for r in range(node_size):
        env = {"OMPI_COMM_WORLD_LOCAL_RANK": str(r)}
        want = choose_gpu(r, node_size, count, devices).device
        assert device_before_init(env, count, devices) == want


def test_device_before_init_never_raises():
    env = {"SLURM_LOCALID": "1"}
    assert device_before_init({}, 4) is None  # no launcher: MPI's node rank decides later
    assert device_before_init(env, 0) is None  # no GPU
    assert device_before_init(env, 4, gpu_devices=[0]) is None  # too short: Init raises later
    assert device_before_init(env, 4, gpu_devices=[0, 7]) is None  # not a GPU: likewise
    assert device_before_init(env, 4, gpu_devices=[0, 3]) == 3


# --- sharing by the GPU's physical identity -------------------------------------------------------


class Props:
    def __init__(self, uuid="", domain=0, bus=0, device=0):
        self.uuid = uuid
        self.pci_domain_id, self.pci_bus_id, self.pci_device_id = domain, bus, device


def test_physical_gpu_id():
    assert physical_gpu_id(Props("1234-abcd"), "n0") == "GPU-1234-abcd"
    assert physical_gpu_id(Props("MIG-77"), "n0") == "MIG-77"
    assert physical_gpu_id(Props("", 0, 0x41, 0), "n0") == "n0/pci:0000:41:00"

    class NoUuid:
        pci_domain_id, pci_bus_id, pci_device_id = 1, 2, 3

    assert physical_gpu_id(NoUuid(), "h") == "h/pci:0001:02:03"


def node(host, ids):
    """(host, node-local rank, id) for ranks 0.. of one host."""
    return [(host, r, i) for r, i in enumerate(ids)]


def test_per_rank_visible_devices_is_not_sharing():
    # CUDA_VISIBLE_DEVICES=r per rank: every rank has one GPU, cuda:0, a different one
    logical = choose_gpu(1, 4, 1)
    assert logical.shared == {"cuda:0": (0, 1, 2, 3)}  # the index alone says "shared"
    gathered = node("n0", ["GPU-a", "GPU-b", "GPU-c", "GPU-d"])
    c = sharing_by_identity(logical, gathered, 1)
    assert c.shared == {} and c.sharing_message() == "" and c.device == 0


def test_one_gpu_under_different_indices_is_sharing():
    # rank 0 sees the GPU as cuda:0, rank 1 (CUDA_VISIBLE_DEVICES=1,0) as cuda:1
    logical = choose_gpu(1, 2, 2)
    assert logical.shared == {}
    c = sharing_by_identity(logical, node("n0", ["GPU-a", "GPU-a"]), 1)
    assert c.shared == {"GPU-a": (0, 1)}
    assert c.sharing_message() == "node-local ranks 0 and 1 share GPU-a (2 ranks, 2 GPUs)"


def test_sharing_is_per_host_and_ranks_without_gpu_share_nothing():
    gathered = node("n0", ["GPU-a", "GPU-b", ""]) + node("n1", ["GPU-c", "GPU-c", "", ""])
    on_n0 = sharing_by_identity(choose_gpu(0, 3, 2), gathered, 0)
    assert on_n0.shared == {}  # n1's sharing is not n0's
    on_n1 = sharing_by_identity(choose_gpu(3, 4, 2), gathered, 6)  # a rank without GPU
    assert on_n1.shared == {"GPU-c": (0, 1)}
    # the same logical index on two hosts is two GPUs
    same_index = node("n0", ["n0/pci:0000:41:00"]) + node("n1", ["n1/pci:0000:41:00"])
    assert sharing_by_identity(choose_gpu(0, 1, 1), same_index, 1).shared == {}


# --- where CUDA collectives run (Init: NCCL, or MPI where ranks share a GPU) ---------------------


@pytest.mark.parametrize(
    "shared, nccl_told, forced, want",
    [
        (False, False, "", False),  # one rank per GPU: NCCL
        (True, False, "", True),  # ranks share a GPU NCCL cannot: MPI
        (True, True, "", False),  # NCCL was told how to share it (NCCL_HOSTID)
        (True, False, "0", False),  # NCCL asked for: Init records the refusal instead
        (False, False, "1", True),  # MPI asked for
        (True, True, "1", True),
    ],
)
def test_cuda_route_wanted(shared, nccl_told, forced, want):
    from fluxmpi_py.runtime._gpu_route import cuda_route_wanted as _cuda_route_wanted

    assert _cuda_route_wanted(shared, nccl_told, forced) is want


def test_cuda_schedule_setting():
    from fluxmpi_py.runtime.gpu_choice import cuda_schedule_setting

    for mode in ("auto", "spin", "yield", "blocking"):
        assert cuda_schedule_setting({"FLUXMPI_CUDA_SCHEDULE": mode.upper()}) == mode
    assert cuda_schedule_setting({"FLUXMPI_CUDA_SCHEDULE": ""}) == ""
    with pytest.raises(
        ValueError, match=r"FLUXMPI_CUDA_SCHEDULE is 'spinning' on rank 3: expected"
    ):
        cuda_schedule_setting({"FLUXMPI_CUDA_SCHEDULE": "spinning"}, 3)


def test_a_cuda_schedule_that_cuda_refuses_is_a_warning():
    # A performance hint: a rank whose CUDA refuses it warns and goes on, as the others do
    # (here the build has no CUDA, which refuses every schedule).
    from fluxmpi_py.runtime._gpu_route import apply_cuda_schedule as _apply_cuda_schedule

    with pytest.warns(
        RuntimeWarning, match=r"FLUXMPI_CUDA_SCHEDULE=blocking not applied on rank 2: "
    ):
        assert _apply_cuda_schedule("blocking", 2) in ("", None)


def test_cuda_route_bad_value():
    from fluxmpi_py.runtime._gpu_route import cuda_route_wanted as _cuda_route_wanted

    assert _cuda_route_wanted(False, False, "yes") is None


ROUTE_SCRIPT = """
import os, sys
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":  # the variable on rank 1 alone
    os.environ[sys.argv[2] if len(sys.argv) > 2 else "FLUXMPI_CUDA_OVER_MPI"] = sys.argv[1]
import fluxmpi_py as fm, fluxmpi_py._C as C
try:
    fm.Init()
    line = f"rank {fm.local_rank()} over_mpi={C.cuda_over_mpi()} refusal={C.cuda_refusal()!r}"
    line += f" comm_stream={C.nccl_comm_stream()} host_wait={C.nccl_host_wait()}"
    line += f" groups={C.nccl_groups()}"
except Exception as e:
    line = f"rank {os.environ['OMPI_COMM_WORLD_RANK']} raised {type(e).__name__}: {e}"
os.write(1, (line + "\\n").encode())  # one write: the ranks' lines do not interleave
"""


@pytest.mark.parametrize("rank1_value", ["1", "bad"])
def test_cuda_route_is_agreed_by_every_rank(tmp_path, rank1_value):
    """FLUXMPI_CUDA_OVER_MPI on rank 1 alone: "1" sends every rank over MPI (a rank on NCCL
    and one on MPI would never meet); a bad value raises on both ranks, naming it."""

    script = tmp_path / "route.py"
    script.write_text(ROUTE_SCRIPT)
    _, out = run_mpi(str(script), 2, rank1_value, timeout=120)
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    if rank1_value == "1":
        assert lines == [
            "rank 0 over_mpi=True refusal='' comm_stream=True host_wait=False groups=True",
            "rank 1 over_mpi=True refusal='' comm_stream=True host_wait=False groups=True",
        ], out
    else:
        assert lines == [
            "rank 0 raised ValueError: fluxmpi_py.Init(): FLUXMPI_CUDA_OVER_MPI on rank 1: "
            "expected 1 (CUDA collectives over MPI), 0 (over NCCL) or unset (over MPI only where "
            "ranks share a GPU)",
            "rank 1 raised ValueError: fluxmpi_py.Init(): FLUXMPI_CUDA_OVER_MPI on rank 1 is "
            "'bad': expected 1 (CUDA collectives over MPI), 0 (over NCCL) or unset (over MPI only "
            "where ranks share a GPU)",
        ], out


@pytest.mark.parametrize(
    "name, value",
    [("FLUXMPI_NCCL_HOST_WAIT", "1"), ("FLUXMPI_NCCL_COMM_STREAM", "yes"),
     ("FLUXMPI_NCCL_GROUPS", "0"), ("FLUXMPI_CUDA_SCHEDULE", "sleepy")],
)  # fmt: skip
def test_nccl_switches(tmp_path, name, value):
    """The NCCL switches on rank 1 alone: 0 or 1 sets that rank's mode (the defaults, seen on
    rank 0: NCCL on its own stream, no host wait, group= on NCCL); another value raises on both
    ranks. FLUXMPI_NCCL_GROUPS picks a route, which the ranks must share: 0 on rank 1 alone
    stages group= over MPI on every rank."""

    script = tmp_path / "switch.py"
    script.write_text(ROUTE_SCRIPT)
    _, out = run_mpi(str(script), 2, value, name, timeout=120)
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    if value == "1":
        assert lines == [
            "rank 0 over_mpi=False refusal='' comm_stream=True host_wait=False groups=True",
            "rank 1 over_mpi=False refusal='' comm_stream=True host_wait=True groups=True",
        ], out
    elif value == "0":  # a route: off on rank 1 alone turns it off on every rank
        assert lines == [
            "rank 0 over_mpi=False refusal='' comm_stream=True host_wait=False groups=False",
            "rank 1 over_mpi=False refusal='' comm_stream=True host_wait=False groups=False",
        ], out
    else:
        message = f"fluxmpi_py.Init(): {name} is {value!r} on rank 1: expected " + (
            "1 or 0"
            if value == "yes"
            else "one of auto, spin, yield, blocking (or unset: CUDA's own default)"
        )
        assert lines == [
            f"rank 0 raised ValueError: {message} (on rank 1, in Init())",
            f"rank 1 raised ValueError: {message} (on rank 1, in Init())",
        ], out


@pytest.mark.parametrize("np", [1, 2, 3])
def test_gpu_ranks_check_passes_on_host_tensors(np):
    # scripts/gpu_ranks_check.py is what a GPU session runs; --cpu runs its checks on host
    # tensors, so that an expected value it gets wrong fails here, not first on the GPU.

    script = os.path.join(ROOT, "scripts", "gpu_ranks_check.py")
    _, out = run_mpi(script, np, "--cpu", timeout=180)
    assert "FAIL" not in out, out[-4000:]
    for name in (
        "gather backward",
        "alltoall in uneven parts",
        "DDP on the fluxmpi backend",
        "DistributedOptimizer on 4 KiB to 4 MiB gradients",
    ):
        assert f"ok: {name}" in out, f"check {name!r} did not run:\n{out[-4000:]}"


def test_gpu_kill_check_ends_the_job_on_host_tensors():
    # scripts/gpu_kill_check.py is the GPU session's stop test; on host tensors rank 1 stops
    # after 20 collectives and the stall timeout must end the job with an error, well before
    # the script's own "still running" failure.

    script = os.path.join(ROOT, "scripts", "gpu_kill_check.py")
    rc, out = run_mpi(script, 2, "--cpu", "--mode", "stop", "--timeout", "4", timeout=120,
                      expect_ok=False)  # fmt: skip
    assert rc != 0, out[-4000:]
    assert "rank 1: stop after 20 collectives" in out, out[-4000:]
    assert "timeout: collective call" in out, out[-4000:]
    assert "FAIL: still running" not in out, out[-4000:]
