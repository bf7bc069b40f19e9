"""Where a rank's CUDA tensors go, decided at ``Init`` once its GPU is chosen
(runtime/gpu_choice.py): which ranks share a GPU, found by its physical identity; whether CUDA
collectives run over NCCL or over MPI, agreed by every rank; the NCCL switches
(``FLUXMPI_NCCL_*``) checked; and ``FLUXMPI_CUDA_SCHEDULE`` applied to the GPU."""

from __future__ import annotations

import os
import socket
import warnings

import torch

from .._core import C
from .agreement import mark_raised_on_every_rank
from .gpu_choice import physical_gpu_id, sharing_by_identity


def shared_by_identity(choice):
    """``choice`` with the ranks that share a GPU found by the GPU's physical identity,
    gathered from every rank (collective: every rank calls it, with or without a GPU). Where
    torch cannot say a GPU's identity, its host and logical index stand for it (the old rule,
    which may see sharing where CUDA_VISIBLE_DEVICES differs per rank, never miss it)."""
    host = socket.gethostname()
    ident = ""
    if choice.device is not None:
        try:
            ident = physical_gpu_id(torch.cuda.get_device_properties(choice.device), host)
        except (RuntimeError, AssertionError, AttributeError):
            ident = f"{host}/cuda:{choice.device}"
    mine = "\t".join((host, str(C.node_rank()), ident)).encode()
    gathered = [tuple(b.decode().split("\t")) for b in C.allgather_object_bytes(mine, "")]
    return sharing_by_identity(choice, [(h, int(r), i) for h, r, i in gathered], C.rank())


def apply_cuda_schedule(schedule: str, rank: int) -> str | None:
    """FLUXMPI_CUDA_SCHEDULE on this rank's GPU (already checked on every rank); the schedule
    in force after it. A performance hint only: where CUDA refuses it (a driver that will not
    change an active device's flags), a warning, and the job goes on alike on every rank."""
    try:
        return C.cuda_schedule(schedule)
    except RuntimeError as e:
        warnings.warn(
            f"FLUXMPI_CUDA_SCHEDULE={schedule} not applied on rank {rank}: {e}; CUDA's own "
            "schedule stays",
            RuntimeWarning,
            stacklevel=3,
        )
        try:
            return C.cuda_schedule("")
        except RuntimeError:
            return None


def bad_nccl_switch(rank: int) -> ValueError | None:
    """The error for a FLUXMPI_NCCL_COMM_STREAM, FLUXMPI_NCCL_HOST_WAIT or FLUXMPI_NCCL_GROUPS
    that is neither 0 nor 1 on this rank, else None (Init raises it on every rank)."""
    for name in ("FLUXMPI_NCCL_COMM_STREAM", "FLUXMPI_NCCL_HOST_WAIT", "FLUXMPI_NCCL_GROUPS"):
        value = os.environ.get(name)
        if value is not None and value not in ("0", "1"):
            return ValueError(
                f"fluxmpi_py.Init(): {name} is {value!r} on rank {rank}: expected 1 or 0"
            )
    return None


def cuda_route_wanted(shared: bool, nccl_told: bool, forced: str) -> bool | None:
    """This rank's wish, before the ranks agree: CUDA collectives over MPI? None for a bad
    `forced`. `shared`: node-local ranks share this rank's GPU; `nccl_told`: NCCL_HOSTID or
    NCCL_MULTI_RANK_GPU_ENABLE=1 lets NCCL share it; `forced`: FLUXMPI_CUDA_OVER_MPI's value,
    "1" (always MPI), "0" (always NCCL) or "" (MPI where ranks share a GPU NCCL cannot)."""
    if forced not in ("", "0", "1"):
        return None
    return forced == "1" or (forced == "" and shared and not nccl_told)


def cuda_route(choice) -> tuple[bool, str, bool]:
    """(CUDA collectives over MPI?, why NCCL must refuse them or "", group= on NCCL?) for this
    rank's GPU choice and the environment. Collective: every rank takes MPI if any rank does (a
    rank on NCCL and a rank on MPI would never meet), every rank stages group= over MPI if any
    rank's FLUXMPI_NCCL_GROUPS is 0, and a bad FLUXMPI_CUDA_OVER_MPI raises on every rank."""
    nccl_told = os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" or "NCCL_HOSTID" in os.environ
    forced = os.environ.get("FLUXMPI_CUDA_OVER_MPI", "")
    wanted = cuda_route_wanted(bool(choice.shared), nccl_told, forced)
    groups_off = os.environ.get("FLUXMPI_NCCL_GROUPS", "1") == "0"
    # [any rank over MPI, 1 + the highest rank with a bad value (0: none), any rank's groups
    # off MPI refused]
    votes = torch.tensor(
        [int(bool(wanted)), 0 if wanted is not None else C.rank() + 1, int(groups_off)]
    )
    C.allreduce_(votes, "max")
    nccl_groups = not bool(votes[2])
    if votes[1] > 0:
        bad = int(votes[1]) - 1
        value = f" is {forced!r}" if bad == C.rank() else ""
        raise mark_raised_on_every_rank(
            ValueError(
                f"fluxmpi_py.Init(): FLUXMPI_CUDA_OVER_MPI on rank {bad}{value}: expected 1 (CUDA "
                "collectives over MPI), 0 (over NCCL) or unset (over MPI only where ranks share "
                "a GPU)"
            )
        )
    if votes[0]:
        return True, "", nccl_groups
    if choice.shared and not nccl_told:  # FLUXMPI_CUDA_OVER_MPI=0 on every rank
        return (
            False,
            (
                choice.sharing_message() + "; NCCL allows one rank per GPU and "
                "FLUXMPI_CUDA_OVER_MPI=0 keeps CUDA collectives off MPI: run at most one rank per "
                "GPU, choose distinct GPUs with Init(gpu_devices=[...]), or unset "
                "FLUXMPI_CUDA_OVER_MPI to share the GPU over MPI"
            ),
            nccl_groups,
        )
    return False, "", nccl_groups
