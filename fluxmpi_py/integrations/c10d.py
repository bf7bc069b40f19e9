"""torch.distributed on fluxmpi_py: importing fluxmpi_py registers the c10d backend "fluxmpi".

    import fluxmpi_py as fm, torch.distributed as dist
    fm.Init()                            # under mpiexec: sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    dist.init_process_group("fluxmpi")

Its collectives run on fluxmpi's engine, with the agreement check before data moves and the
stall report: DDP, ZeroRedundancyOptimizer, FSDP and torch.distributed's collectives then
run over MPI with a pip-installed torch. Everything goes through torch's public extension
points: the backend through ``Backend.register_backend`` (extended API), and the rendezvous
either through torch's own ``env://``, whose variables ``Init`` sets from MPI (see
``runtime.Init``), or through the scheme ``fluxmpi://`` registered with
``register_rendezvous_handler``: ``init_process_group("fluxmpi", init_method="fluxmpi://")``
takes rank and world size from MPI without ``Init`` first.

A group of a subset of ranks (``new_group(ranks)``, ``new_subgroups``, DeviceMesh's groups)
gets an MPI communicator of its members only, made by them alone (MPI_Comm_create_group)
when torch asks them for a backend, with the ranks in torch's order; ranks outside the group
take no part. ``split_group`` is torch's: it splits an accelerator backend (NCCL's), and on a
CPU-only fluxmpi group raises torch's error; ``new_group(ranks,
use_local_synchronization=True)`` makes the same group there.

>>> import fluxmpi_py, torch.distributed as dist
>>> "fluxmpi" in dist.Backend.backend_list
True
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

import torch.distributed as dist

from ..collectives.torch_backend import torch_backend
from ..runtime.elastic import on_failure
from ..runtime.groups import new_local_group
from ..runtime.world import Init, local_rank, rendezvous_store, total_workers

__all__: list[str] = []

BACKEND = "fluxmpi"
SCHEME = "fluxmpi"


def _init(timeout) -> None:
    """Init fluxmpi_py; a timeout other than torch's default becomes fluxmpi's job timeout."""
    default = getattr(dist.constants, "default_pg_timeout", timedelta(minutes=30))
    if timeout is None or timeout == default:
        Init()
    else:
        Init(timeout=timeout.total_seconds())


def _mpi_rendezvous(url: str, timeout=None, **kwargs):
    """The ``fluxmpi://`` rendezvous (torch's handler protocol): yields (store, rank,
    world_size) from MPI; rank 0 serves the store on a free port and tells the others."""
    _init(timeout)
    rank, size = local_rank(), total_workers()
    query = dict(parse_qsl(urlparse(url).query))
    for name, mine in (("rank", rank), ("world_size", size)):
        if name in query and int(query[name]) != mine:
            raise ValueError(
                f"init_process_group({name}={query[name]}), but MPI says this process has "
                f"{name} {mine}; leave {name} out under mpiexec"
            )
    yield rendezvous_store(timeout), rank, size
    raise RuntimeError("the fluxmpi:// rendezvous cannot run twice")


def _timeout_s(timeout) -> float:
    """Seconds of a group's timeout (None: torch's default for groups off NCCL)."""
    if timeout is None:
        timeout = getattr(dist.constants, "default_pg_timeout", timedelta(minutes=30))
    return timeout.total_seconds()


def _create_backend(opts, backend_options=None):
    """torch's creator (extended API): a fluxmpi backend for the group of ``opts``. torch calls
    it on the group's members only, with ``global_ranks_in_group`` in the group's rank order
    (empty for the default group); a sub-group's communicator is made by those members alone,
    so that no rank outside the group is waited for."""
    default = not opts.global_ranks_in_group  # empty for the default group only
    _init(opts.timeout if default else None)  # a sub-group's timeout is not the job's
    if default and opts.group_size != total_workers():
        # the default group, of a size MPI does not have: launched by torchrun or with
        # RANK/WORLD_SIZE set, not by mpiexec
        raise RuntimeError(
            f"the fluxmpi backend takes its ranks from MPI, which started {total_workers()} "
            f"process(es) here, but torch.distributed was told world_size {opts.group_size} "
            "(torchrun, or RANK/WORLD_SIZE/MASTER_ADDR in the environment); launch with "
            f"`mpiexec -n {opts.group_size} python script.py` instead of torchrun, or use "
            'backend "gloo" under torchrun'
        )
    if on_failure() == "shrink":
        # DDP and FSDP keep the world's size and communicator in torch's process group, which
        # cannot follow a shrunk world: refused, the same on every rank (the mode is agreed).
        raise RuntimeError(
            "the fluxmpi backend of torch.distributed (DDP, FSDP) does not support "
            'Init(on_failure="shrink") yet: use fm.DistributedOptimizer with fm.elastic_step, '
            'or the default on_failure="abort" with python -m fluxmpi_py.run --max-restarts'
        )
    if default:
        return torch_backend(opts.group_rank, opts.group_size)
    # Every sub-group, even one of every rank, gets a communicator of its own, whose members
    # first compare their lists: a member with another list raises with them instead of taking
    # a communicator the others never join. sort=False: torch has sorted the list already,
    # unless sort_ranks=False asked for its order.
    ranks = [int(r) for r in opts.global_ranks_in_group]
    group = new_local_group(ranks, sort=False, timeout_s=_timeout_s(opts.timeout))
    return torch_backend(opts.group_rank, opts.group_size, group)


def _register() -> None:
    if not dist.is_available() or hasattr(dist.Backend, BACKEND.upper()):
        return
    dist.Backend.register_backend(
        BACKEND, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )
    dist.register_rendezvous_handler(SCHEME, _mpi_rendezvous)


_register()
