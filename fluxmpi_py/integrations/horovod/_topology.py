"""Horovod's topology calls beyond rank/size (``local_size``, ``cross_rank``, ``cross_size``)
and its build predicates, answered from fluxmpi_py's runtime and ``build_info()``.

Horovod's cross communicator holds the ranks with the same local rank (one per node);
``hvd.init()`` learns it with one small allgather, so these answer without communication.
"""

from __future__ import annotations

import fluxmpi_py as _fm

__all__ = [
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_built",
    "mpi_enabled",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "mpi_threads_supported",
    "is_homogeneous",
]

_cross = None  # (cross_rank, cross_size, homogeneous) once hvd.init() has run


def learn() -> None:
    """Collective, from ``hvd.init()``: every rank's local rank, for the cross communicator."""
    global _cross
    if _cross is not None:
        return
    local = _fm.allgather_object(_fm.node_local_rank())
    me = _fm.local_rank()
    peers = [r for r, lr in enumerate(local) if lr == local[me]]
    # Every node runs as many ranks when each local rank occurs as often as local rank 0.
    homogeneous = all(local.count(lr) == local.count(0) for lr in local)
    _cross = (peers.index(me), len(peers), homogeneous)


def _learned():
    if _cross is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _cross


def is_homogeneous() -> bool:
    """Whether every node runs the same number of ranks.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.is_homogeneous()
    True
    """
    return _learned()[2]


def local_size() -> int:
    """The number of ranks on this node.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); 1 <= hvd.local_size() <= hvd.size()
    True
    """
    _learned()
    return _fm.node_size()


def cross_rank() -> int:
    """This rank's index among the ranks with its local rank (its node's index).

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); 0 <= hvd.cross_rank() < hvd.cross_size()
    True
    """
    return _learned()[0]


def cross_size() -> int:
    """The number of ranks with this rank's local rank (the number of nodes, when every node
    runs as many ranks).

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.cross_size() * hvd.local_size() >= hvd.size()
    True
    """
    return _learned()[1]


def mpi_built() -> bool:
    """True: fluxmpi_py always runs on MPI.

    >>> import fluxmpi_py.horovod as hvd; hvd.mpi_built()
    True
    """
    return True


def mpi_enabled() -> bool:
    """True: collectives of host tensors run over MPI.

    >>> import fluxmpi_py.horovod as hvd; hvd.mpi_enabled()
    True
    """
    return True


def gloo_built() -> bool:
    """False: fluxmpi_py has no Gloo controller.

    >>> import fluxmpi_py.horovod as hvd; hvd.gloo_built()
    False
    """
    return False


def gloo_enabled() -> bool:
    """False, as :func:`gloo_built`.

    >>> import fluxmpi_py.horovod as hvd; hvd.gloo_enabled()
    False
    """
    return False


def nccl_built() -> int:
    """NCCL's version code (e.g. 22105 for 2.21.5) when the extension was built with CUDA
    and NCCL, else 0 (as Horovod's).

    >>> import fluxmpi_py.horovod as hvd; hvd.nccl_built() == 0 or hvd.cuda_built()
    True
    """
    version = _fm.build_info()["nccl"]
    if not version:
        return 0
    major, minor, patch = (int(x) for x in (str(version).split(".") + ["0", "0"])[:3])
    return major * 10000 + minor * 100 + patch


def ddl_built() -> bool:
    """False: no IBM DDL.

    >>> import fluxmpi_py.horovod as hvd; hvd.ddl_built()
    False
    """
    return False


def ccl_built() -> bool:
    """False: no oneCCL.

    >>> import fluxmpi_py.horovod as hvd; hvd.ccl_built()
    False
    """
    return False


def cuda_built() -> bool:
    """Whether the extension was compiled with CUDA (``build_info()["compiled_with_cuda"]``).

    >>> import fluxmpi_py as fm, fluxmpi_py.horovod as hvd
    >>> hvd.cuda_built() == fm.build_info()["compiled_with_cuda"]
    True
    """
    return bool(_fm.build_info()["compiled_with_cuda"])


def rocm_built() -> bool:
    """False: no ROCm build.

    >>> import fluxmpi_py.horovod as hvd; hvd.rocm_built()
    False
    """
    return False


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (after :func:`hvd.init`).

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); isinstance(hvd.mpi_threads_supported(), bool)
    True
    """
    _learned()
    return bool(_fm.build_info()["thread_multiple"])
