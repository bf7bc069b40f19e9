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
then runs on the members, with ranks in the group (in the list's order with
``sort_ranks=False``). With ``use_local_synchronization=True`` only the members call it
(MPI_Comm_create_group); ``split_group`` makes one such group per split.

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

from .._core import C
from ..collectives.objects import broadcast_object
from ..runtime.world import Init

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


def _launched_by_mpi() -> bool:
    """Whether an MPI launcher (Open MPI's mpiexec, MPICH's or Slurm's PMI) started this
    process, from the environment it sets."""
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def _wrap_env_rendezvous() -> None:
    """Let ``env://`` without MASTER_ADDR take rank and size from MPI (torch's handler would
    raise there); with MASTER_ADDR set, torch's own handler runs unchanged."""
    # the module, not the function of the same name that torch.distributed exports
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    original = handlers.get("env")
    if original is None or getattr(original, "_fluxmpi", False):
        return

    def env_or_mpi(url: str, **kwargs):
        explicit = "MASTER_ADDR" in os.environ or "master_addr" in url.lower()
        # Under mpiexec, a MASTER_ADDR left in the environment (a cluster's job script, an
        # earlier gloo setup) without RANK, which torchrun would set, still means MPI's ranks.
        if explicit and not (_launched_by_mpi() and "RANK" not in os.environ):
            return original(url, **kwargs)
        return _mpi_rendezvous(url, **kwargs)

    env_or_mpi._fluxmpi = True  # type: ignore[attr-defined]
    handlers["env"] = env_or_mpi


# The fluxmpi sub-group made for the torch new_group call in progress (see _wrap_new_group).
_PENDING: list = []


def _uses_fluxmpi(backend) -> bool:
    """Whether a backend string ("fluxmpi", "cpu:fluxmpi,cuda:gloo") names ours."""
    return any(p.split(":")[-1].strip().lower() == BACKEND for p in str(backend).split(","))


def _timeout_s(timeout) -> float:
    """Seconds of a new_group timeout (None: torch's default for groups off NCCL)."""
    if timeout is None:
        timeout = getattr(dist.constants, "default_pg_timeout", timedelta(minutes=30))
    return timeout.total_seconds()


def _subgroup_for(args) -> object | None:
    """The fluxmpi group that a torch new_group call with ``args`` (its bound arguments) needs,
    made here; None where it needs none (the world, another backend, a non-member of a group
    the members make alone)."""
    if not dist.is_initialized() or not _uses_fluxmpi(args["backend"] or dist.get_backend()):
        return None
    ranks = args["ranks"]
    if ranks is None:
        return None
    _init(None)  # every rank is here (the default group may be gloo's)
    if C.size() != dist.get_world_size():
        return None  # the world, or a world the creator refuses with its own message
    ranks = [int(r) for r in ranks]
    sort = bool(args.get("sort_ranks", True))
    if args.get("use_local_synchronization"):
        if C.rank() not in ranks:
            return None  # torch returns None without making anything
        # made by the members alone (MPI_Comm_create_group), even of every rank: they agree
        return C.new_local_group(ranks, sort, _timeout_s(args.get("timeout")))
    # A collective over the world that raises on every rank when the lists differ, even where
    # this rank's list is the world's (the creator then takes the world's backend).
    return C.new_group(ranks, sort)


def _wrap_new_group() -> None:
    """Make a fluxmpi sub-group inside torch's new_group, before torch asks the members for a
    backend: MPI_Comm_split over every rank (which all call new_group in the same order), or
    MPI_Comm_create_group over the members with use_local_synchronization=True."""
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


def _fluxmpi_split(parent, split_ranks, timeout, pg_options, group_desc, backend):
    """split_group on a fluxmpi parent: this rank's split (ranks in the parent, sorted, as
    torch's) becomes a group its members make alone, as new_group(use_local_synchronization=
    True) does; None outside every split. torch's own path would refuse: it needs an
    accelerator device bound to the default group and a Backend.split (NCCL's comm split)."""
    if not split_ranks:
        raise ValueError("split_group: split_ranks cannot be None or empty")
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    to_global = {g: r for r, g in c10d._world.pg_group_ranks[parent].items()}
    me, size = parent.rank(), parent.size()
    mine, seen = None, {}
    for split in split_ranks:
        split = sorted(int(r) for r in split)
        bad = [r for r in split if not 0 <= r < size]
        if not split or bad or len(set(split)) != len(split):
            raise ValueError(
                f"split_group: the split {split} must name distinct ranks of the parent group, "
                f"0 .. {size - 1}, at least one (rank {me} of the parent group)"
            )
        for r in split:  # every rank checks every split: all raise together
            if r in seen:
                raise ValueError(
                    f"split_group: rank {r} of the parent group is in two splits, {seen[r]} "
                    f"and {split}; splits must not overlap"
                )
            seen[r] = split
        if me in split:
            mine = split
    if mine is None:
        return None
    return dist.new_group(
        [to_global[r] for r in mine],
        timeout=timeout,
        backend=backend or c10d._world.pg_map[parent][0],
        pg_options=pg_options,
        use_local_synchronization=True,
        group_desc=group_desc,
    )


def _wrap_split_group() -> None:
    """Route torch's split_group (also DeviceMesh's, with a bound device) to _fluxmpi_split
    when the parent group runs on fluxmpi; other parents go to torch's."""
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    original = getattr(c10d, "split_group", None)
    if original is None or getattr(original, "_fluxmpi", False):
        return

    @functools.wraps(original)
    def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None,
                    group_desc=None, backend=None):  # fmt: skip
        parent = parent_pg or (c10d._get_default_group() if dist.is_initialized() else None)
        entry = c10d._world.pg_map.get(parent) if parent is not None else None
        if entry is None or not _uses_fluxmpi(entry[0]) or parent not in c10d._world.pg_group_ranks:
            return original(parent_pg, split_ranks, timeout, pg_options, group_desc, backend)
        return _fluxmpi_split(parent, split_ranks, timeout, pg_options, group_desc, backend)

    split_group._fluxmpi = True  # type: ignore[attr-defined]
    for module in ("torch.distributed.distributed_c10d", "torch.distributed",
                   "torch.distributed.device_mesh"):  # fmt: skip
        try:
            importlib.import_module(module).split_group = split_group
        except ImportError:
            pass


def _create_backend(opts, backend_options=None):
    """torch's creator (extended API): a fluxmpi backend for the group of ``opts``; torch calls
    it on the group's members only, with ranks in the group."""
    _init(opts.timeout)
    ranks = list(opts.global_ranks_in_group or range(opts.group_size))
    if ranks == list(range(C.size())):
        return C.c10d_backend(opts.group_rank, opts.group_size)
    group = _PENDING[-1] if _PENDING else None
    if not dist.is_initialized() and opts.group_size != C.size():
        # the default group, of a size MPI does not have: launched by torchrun or with
        # RANK/WORLD_SIZE set, not by mpiexec
        raise RuntimeError(
            f"the fluxmpi backend takes its ranks from MPI, which started {C.size()} "
            f"process(es) here, but torch.distributed was told world_size {opts.group_size} "
            "(torchrun, or RANK/WORLD_SIZE/MASTER_ADDR in the environment); launch with "
            f"`mpiexec -n {opts.group_size} python script.py` instead of torchrun, or use "
            'backend "gloo" under torchrun'
        )
    if group is None or list(group.ranks) != ranks:
        raise NotImplementedError(
            f"the fluxmpi backend for a group of ranks {ranks}: its MPI sub-communicator is "
            "made when every rank calls torch.distributed.new_group(ranks) (or new_subgroups, "
            "init_device_mesh, split_group); this group came another way"
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
    _wrap_split_group()


_register()
