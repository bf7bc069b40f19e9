"""torch.distributed on fluxmpi_py: importing fluxmpi_py registers the c10d backend "fluxmpi".

    import fluxmpi_py, torch.distributed as dist
    dist.init_process_group("fluxmpi")   # under mpiexec: rank and size from MPI

Its collectives run on fluxmpi's engine, with the agreement check before data moves and the
stall report: DDP, ZeroRedundancyOptimizer, FSDP and torch.distributed's collectives then
run over MPI with a pip-installed torch. Without ``MASTER_ADDR`` the ``env://`` rendezvous
takes rank and world size from MPI (a plain ``python`` is a world of one) and makes the
store from them; with ``MASTER_ADDR`` set (torchrun) torch's own rendezvous runs.
``new_group(ranks)`` over a subset (also DeviceMesh's groups) makes a fluxmpi sub-group, an
MPI sub-communicator: every rank calls it in the same order, as torch requires; the backend
then runs on the members, with ranks in the group.

>>> import fluxmpi_py, torch.distributed as dist
>>> "fluxmpi" in dist.Backend.backend_list
True
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import socket
from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist

from ._loader import C
from .object_collectives import broadcast_object
from .runtime import Init

__all__: list[str] = []

BACKEND = "fluxmpi"


def _init(timeout) -> None:
    """Init fluxmpi_py; a timeout other than torch's default becomes fluxmpi's job timeout."""
    default = getattr(dist.constants, "default_pg_timeout", timedelta(minutes=30))
    if timeout is None or timeout == default:
        Init()
    else:
        Init(timeout=timeout.total_seconds())


def _store(rank: int, size: int, timeout) -> dist.Store:
    """A store for torch's bookkeeping (and for gloo groups beside ours): rank 0 serves a
    TCPStore on a free port and tells the others where, over MPI."""
    if size == 1:
        return dist.HashStore()
    host = "127.0.0.1" if C.node_size() == size else socket.gethostname()
    kwargs = {} if timeout is None else {"timeout": timeout}
    port = 0
    if rank == 0:
        store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, **kwargs)
        port = store.port
    host, port = broadcast_object((host, port), root_rank=0)
    if rank != 0:
        store = dist.TCPStore(host, port, size, is_master=False, **kwargs)
    return store


def _mpi_rendezvous(url: str, timeout=None, **kwargs):
    """torch's rendezvous protocol: yields (store, rank, world_size) from MPI."""
    _init(timeout)
    rank, size = C.rank(), C.size()
    query = dict(parse_qsl(urlparse(url).query))
    for name, mine in (("rank", rank), ("world_size", size)):
        if name in query and int(query[name]) != mine:
            raise ValueError(
                f"init_process_group({name}={query[name]}), but MPI says this process has "
                f"{name} {mine}; leave {name} out under mpiexec"
            )
    yield _store(rank, size, timeout), rank, size
    raise RuntimeError("the MPI rendezvous of fluxmpi_py cannot run twice")


def _wrap_env_rendezvous() -> None:
    """Let ``env://`` without MASTER_ADDR take rank and size from MPI (torch's handler would
    raise there); with MASTER_ADDR set, torch's own handler runs unchanged."""
    # the module, not the function of the same name that torch.distributed exports
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    original = handlers.get("env")
    if original is None or getattr(original, "_fluxmpi", False):
        return

    def env_or_mpi(url: str, **kwargs):
        if "MASTER_ADDR" in os.environ or "master_addr" in url.lower():
            return original(url, **kwargs)
        return _mpi_rendezvous(url, **kwargs)

    env_or_mpi._fluxmpi = True  # type: ignore[attr-defined]
    handlers["env"] = env_or_mpi


# The fluxmpi sub-group made for the torch new_group call in progress (see _wrap_new_group).
_PENDING: list = []


def _uses_fluxmpi(backend) -> bool:
    """Whether a backend string ("fluxmpi", "cpu:fluxmpi,cuda:gloo") names ours."""
    return any(p.split(":")[-1].strip().lower() == BACKEND for p in str(backend).split(","))


def _subgroup_for(args) -> object | None:
    """The fluxmpi group that a torch new_group call with ``args`` (its bound arguments) needs,
    made here on every rank; None where it needs none (the world, another backend)."""
    if not dist.is_initialized() or not _uses_fluxmpi(args["backend"] or dist.get_backend()):
        return None
    ranks = args["ranks"]
    if ranks is None:
        return None
    _init(None)  # every rank is here (the default group may be gloo's)
    if C.size() != dist.get_world_size():
        return None  # the world, or a world the creator refuses with its own message
    ranks = [int(r) for r in ranks]
    if sorted(set(ranks)) == list(range(C.size())) and len(ranks) == C.size():
        if args.get("sort_ranks", True) or ranks == sorted(ranks):
            return None  # every rank, in order: the world serves
    if args.get("use_local_synchronization"):
        if C.rank() not in ranks:
            return None  # torch returns without making anything
        raise NotImplementedError(
            "new_group(use_local_synchronization=True) on the fluxmpi backend: its "
            "sub-communicators are made collectively by every rank; call new_group on every "
            "rank without use_local_synchronization"
        )
    if not args.get("sort_ranks", True) and ranks != sorted(ranks):
        raise NotImplementedError(
            f"new_group(ranks={ranks}, sort_ranks=False) on the fluxmpi backend: ranks in its "
            "groups follow the world's order; pass the ranks ascending"
        )
    return C.new_group(ranks)  # a collective over the world: raises on every rank when bad


def _wrap_new_group() -> None:
    """Make a fluxmpi sub-group (MPI_Comm_split over every rank) inside torch's new_group,
    which every rank calls in the same order, before torch asks the members for a backend."""
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    original = getattr(c10d, "_new_group_with_tag", None)
    if original is None or getattr(original, "_fluxmpi", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def new_group_with_tag(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        group = _subgroup_for(bound.arguments)
        if group is None:
            return original(*args, **kwargs)
        _PENDING.append(group)
        try:
            return original(*args, **kwargs)
        finally:
            _PENDING.pop()

    new_group_with_tag._fluxmpi = True  # type: ignore[attr-defined]
    c10d._new_group_with_tag = new_group_with_tag


def _create_backend(opts, backend_options=None):
    """torch's creator (extended API): a fluxmpi backend for the group of ``opts``; torch calls
    it on the group's members only, with ranks in the group."""
    _init(opts.timeout)
    ranks = list(opts.global_ranks_in_group or range(opts.group_size))
    if ranks == list(range(C.size())):
        return C.c10d_backend(opts.group_rank, opts.group_size)
    group = _PENDING[-1] if _PENDING else None
    if group is None or list(group.ranks) != ranks:
        raise NotImplementedError(
            f"the fluxmpi backend for a group of ranks {ranks}: its MPI sub-communicator is "
            "made when every rank calls torch.distributed.new_group(ranks) (or new_subgroups, "
            "init_device_mesh); this group came another way (split_group?)"
        )
    return C.c10d_backend(opts.group_rank, opts.group_size, group)


def _register() -> None:
    if not dist.is_available() or hasattr(dist.Backend, BACKEND.upper()):
        return
    dist.Backend.register_backend(
        BACKEND, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )
    _wrap_env_rendezvous()
    _wrap_new_group()


_register()
