"""The rest of ``horovod.torch``'s names: ``sparse_allreduce_async`` (over two allgathers, as
Horovod does it), and what fluxmpi_py does not provide, each raising an error that names
the alternative: the timeline, ``PartialDistributedOptimizer`` and elastic training
(``hvd.elastic``; ``HostsUpdatedInterrupt`` exists for code that catches it).
"""

from __future__ import annotations

import torch

import fluxmpi_py as _fm

from ._handles import _Handle, synchronize_now
from ._process_sets import group_of

__all__ = [
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "PartialDistributedOptimizer",
    "HostsUpdatedInterrupt",
    "elastic",
]


class _SparseHandle(_Handle):
    """:func:`sparse_allreduce_async`'s handle: ``hvd.synchronize(handle)``, or, as Horovod's
    (a function), ``handle()``."""

    __slots__ = ()

    def __call__(self):
        return synchronize_now(self)


class _Done:
    """A request that finished when it was made (``poll`` True; ``synchronize`` returns it)."""

    __slots__ = ("result",)

    def __init__(self, result):
        self.result = result

    def test(self) -> bool:
        return True

    def wait(self):
        return self.result


def sparse_allreduce_async(tensor, name=None, op=None, process_set=None):
    """Reduce a sparse COO tensor over the ranks: every rank's indices and values are
    gathered (two allgathers, done by the time this returns) and ``hvd.synchronize(handle)``
    gives the sum (``op=hvd.Average``: divided by the number of ranks) as a coalesced sparse
    tensor of the same size; so does ``handle()``, as Horovod's. ``name`` is ignored.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> t = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    >>> hvd.synchronize(hvd.sparse_allreduce_async(t, op=hvd.Average)).to_dense().tolist()
    [1.0, 0.0, 2.0, 0.0]
    >>> hvd.sparse_allreduce_async(t, op=hvd.Average)().to_dense().tolist()
    [1.0, 0.0, 2.0, 0.0]
    """
    if not (isinstance(tensor, torch.Tensor) and tensor.layout == torch.sparse_coo):
        raise TypeError(
            "hvd.sparse_allreduce_async takes a sparse COO tensor, got "
            + (
                f"a {tensor.layout} tensor"
                if isinstance(tensor, torch.Tensor)
                else type(tensor).__name__
            )
        )
    if op not in (None, "sum", "average"):
        raise ValueError(f"hvd.sparse_allreduce_async takes op=hvd.Sum or hvd.Average, got {op!r}")
    group = group_of(process_set, "hvd.sparse_allreduce_async()")
    t = tensor.coalesce()
    # Rows of (index per sparse dim): the allgather joins along dim 0, one row per entry.
    indices = _fm.allgather(t.indices().t().contiguous(), group=group)
    values = _fm.allgather(t.values().contiguous(), group=group)
    size = group.size if group is not None else _fm.total_workers()
    if op == "average":
        values = values / size
    out = torch.sparse_coo_tensor(indices.t(), values, t.shape).coalesce()
    return _SparseHandle(_Done(out))


def start_timeline(file_path, mark_cycles=False):
    """Not provided: Horovod's timeline has no fluxmpi_py counterpart.

    Args:
        file_path: Horovod's timeline file; not written.
        mark_cycles: Horovod's flag; not used.

    >>> import fluxmpi_py.horovod as hvd; hvd.start_timeline("t.json")
    Traceback (most recent call last):
    NotImplementedError: hvd.start_timeline: the Horovod timeline is not provided by fluxmpi_py; profile with torch.profiler (the collectives show as their calls), and see fluxmpi_py's stall reports for waits
    """
    raise NotImplementedError(
        "hvd.start_timeline: the Horovod timeline is not provided by fluxmpi_py; profile with "
        "torch.profiler (the collectives show as their calls), and see fluxmpi_py's stall "
        "reports for waits"
    )


def stop_timeline():
    """Not provided, as :func:`start_timeline`.

    >>> import fluxmpi_py.horovod as hvd; hvd.stop_timeline()
    Traceback (most recent call last):
    NotImplementedError: hvd.stop_timeline: the Horovod timeline is not provided by fluxmpi_py; use torch.profiler
    """
    raise NotImplementedError(
        "hvd.stop_timeline: the Horovod timeline is not provided by fluxmpi_py; use torch.profiler"
    )


class PartialDistributedOptimizer:
    """Not provided.

    Args:
        *args: Horovod's arguments; any call raises NotImplementedError.
        **kwargs: Horovod's keyword arguments; likewise.

    >>> import fluxmpi_py.horovod as hvd; hvd.PartialDistributedOptimizer(None)
    Traceback (most recent call last):
    NotImplementedError: hvd.PartialDistributedOptimizer is not provided by fluxmpi_py; wrap an optimizer of the shared parameters in hvd.DistributedOptimizer and step the local layers' parameters with a second, plain optimizer
    """

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "hvd.PartialDistributedOptimizer is not provided by fluxmpi_py; wrap an optimizer "
            "of the shared parameters in hvd.DistributedOptimizer and step the local layers' "
            "parameters with a second, plain optimizer"
        )


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's interrupt, for code that catches it; fluxmpi_py never raises it.

    >>> import fluxmpi_py.horovod as hvd; issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    True
    """


class _Elastic:
    """``hvd.elastic``: any use raises, naming the alternative."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(
            f"hvd.elastic.{name}: elastic training (ranks joining or leaving a running job) is "
            "not provided by fluxmpi_py; save with fluxmpi_py.save_checkpoint and restart the "
            "job with the new number of ranks (fluxmpi_py.load_checkpoint)"
        )


elastic = _Elastic()
