"""Init's GPU choice (fluxmpi_py/runtime/gpu_choice.py), without a GPU: which device each node-local
rank takes, and which ranks would share one (NCCL refuses that)."""

from __future__ import annotations

import os

import pytest

from fluxmpi_py.runtime.gpu_choice import choose_gpu


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
    assert c.shared == {0: (0, 2, 4), 1: (1, 3)}
    assert c.sharing_message() == (
        "node-local ranks 0, 2 and 4 share cuda:0; node-local ranks 1 and 3 share cuda:1 "
        "(5 ranks, 2 GPUs)"
    )
    assert choose_gpu(0, 2, 2).sharing_message() == ""


def test_gpu_devices_chosen_and_checked():
    assert [choose_gpu(r, 2, 4, gpu_devices=[3, 1]).device for r in range(2)] == [3, 1]
    assert choose_gpu(0, 2, 4, gpu_devices=[2, 2]).shared == {2: (0, 1)}
    with pytest.raises(ValueError, match=r"2 ranks run on this node, so it needs at least 2"):
        choose_gpu(0, 2, 4, gpu_devices=[0])
    with pytest.raises(ValueError, match=r"cuda:4 is not a GPU of this machine, which has 4"):
        choose_gpu(0, 2, 4, gpu_devices=[0, 4])


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
    from fluxmpi_py.runtime.world import _cuda_route_wanted

    assert _cuda_route_wanted(shared, nccl_told, forced) is want


def test_cuda_route_bad_value():
    from fluxmpi_py.runtime.world import _cuda_route_wanted

    assert _cuda_route_wanted(False, False, "yes") is None


ROUTE_SCRIPT = """
import os, sys
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":  # the variable on rank 1 alone
    os.environ["FLUXMPI_CUDA_OVER_MPI"] = sys.argv[1]
import fluxmpi_py as fm, fluxmpi_py._C as C
try:
    fm.Init()
    line = f"rank {fm.local_rank()} over_mpi={C.cuda_over_mpi()} refusal={C.cuda_refusal()!r}"
except Exception as e:
    line = f"rank {os.environ['OMPI_COMM_WORLD_RANK']} raised {type(e).__name__}: {e}"
os.write(1, (line + "\\n").encode())  # one write: the ranks' lines do not interleave
"""


@pytest.mark.parametrize("rank1_value", ["1", "bad"])
def test_cuda_route_is_agreed_by_every_rank(tmp_path, rank1_value):
    """FLUXMPI_CUDA_OVER_MPI on rank 1 alone: "1" sends every rank over MPI (a rank on NCCL
    and one on MPI would never meet); a bad value raises on both ranks, naming it."""
    from mpi_util import run_mpi

    script = tmp_path / "route.py"
    script.write_text(ROUTE_SCRIPT)
    _, out = run_mpi(str(script), 2, rank1_value, timeout=120)
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    if rank1_value == "1":
        assert lines == [
            "rank 0 over_mpi=True refusal=''",
            "rank 1 over_mpi=True refusal=''",
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


@pytest.mark.parametrize("np", [1, 2, 3])
def test_gpu_ranks_check_passes_on_host_tensors(np):
    # scripts/gpu_ranks_check.py is what a GPU session runs; --cpu runs its checks on host
    # tensors, so that an expected value it gets wrong fails here, not first on the GPU.
    from mpi_util import ROOT, run_mpi

    script = os.path.join(ROOT, "scripts", "gpu_ranks_check.py")
    _, out = run_mpi(script, np, "--cpu", timeout=180)
    assert "FAIL" not in out, out[-4000:]
    for name in ("gather backward", "alltoall in uneven parts", "DDP on the fluxmpi backend"):
        assert f"ok: {name}" in out, f"check {name!r} did not run:\n{out[-4000:]}"
