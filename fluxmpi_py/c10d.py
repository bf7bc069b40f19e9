"""torch.distributed on fluxmpi_py: importing fluxmpi_py registers the c10d backend "fluxmpi".

    import fluxmpi_py, torch.distributed as dist
    dist.init_process_group("fluxmpi")   # under mpiexec: rank and size from MPI

Its collectives run on fluxmpi's engine, with the agreement check before data moves and the
stall report: DDP, ZeroRedundancyOptimizer, FSDP and torch.distributed's collectives then
run over MPI with a pip-installed torch. Without ``MASTER_ADDR`` the ``env://`` rendezvous
takes rank and world size from MPI (a plain ``python`` is a world of one) and makes the
store from them; with ``MASTER_ADDR`` set (torchrun) torch's own rendezvous runs. The backend
runs on the world group; ``new_group`` over a strict subset of the ranks raises.

>>> import fluxmpi_py, torch.distributed as dist
>>> "fluxmpi" in dist.Backend.backend_list
True
"""

from __future__ import annotations

import importlib
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


def _create_backend(opts, backend_options=None):
    """torch's creator (extended API): a fluxmpi backend for the group of ``opts``."""
    _init(opts.timeout)
    size = C.size()
    ranks = list(opts.global_ranks_in_group or range(opts.group_size))
    if opts.group_size != size or ranks != list(range(size)):
        raise NotImplementedError(
            f"the fluxmpi backend runs on the world group (ranks 0..{size - 1}); a group of "
            f"ranks {ranks} (new_group over a subset) is not supported yet: pass "
            "backend='gloo' to new_group for it"
        )
    return C.c10d_backend(opts.group_rank, opts.group_size)


def _register() -> None:
    if not dist.is_available() or hasattr(dist.Backend, BACKEND.upper()):
        return
    dist.Backend.register_backend(
        BACKEND, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )
    _wrap_env_rendezvous()


_register()
