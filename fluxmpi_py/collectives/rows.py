"""Collectives that move rows (slices along dim 0) between ranks: allgather, gather, scatter,
reduce_scatter and alltoall; their grouped forms, which take a list of tensors and fuse it into
one data collective (one per dtype for reductions); and grouped forms of allreduce_ and bcast_.

Every call is a collective, made by every rank in the same order. Before data moves the ranks
compare the call, the dtypes and shapes (dim 0 may differ by rank where the op allows it), the
op, root and splits; a difference or a bad argument on any rank raises the same exception on
every rank. ``async_op=True`` (or the ``I`` forms) returns a :class:`Request` instead: its
``wait()`` returns the result. The single-tensor allgather, gather, scatter, reduce_scatter and
alltoall are differentiable (see :mod:`fluxmpi_py.differentiable`) when called blocking on a
tensor that requires grad. Host tensors travel over MPI.

``splits`` are row counts per rank (one list of world-size ints, summing to dim 0); ``None``
means equal parts, for which dim 0 must divide by the world size.

``group=`` (:func:`new_group`) runs a call among the group's members: ranks, roots, splits and
the world size above are then the group's.
"""

from __future__ import annotations

import torch

from .._core import C
from ..runtime.groups import group_dispatch
from . import row_calls as rows
from .differentiable import (
    Allgather,
    Alltoall,
    Gather,
    ReduceScatter,
    Scatter,
    _needs_grad,
    _no_gradient,
)

__all__ = [
    "allgather",
    "gather",
    "scatter",
    "reduce_scatter",
    "alltoall",
    "Iallgather",
    "Igather",
    "Iscatter",
    "Ireduce_scatter",
    "Ialltoall",
    "grouped_allgather",
    "grouped_gather",
    "grouped_scatter",
    "grouped_reduce_scatter",
    "grouped_alltoall",
    "grouped_allreduce_",
    "grouped_bcast_",
]


def _plain(tensor) -> bool:
    """A tensor whose call records no autograd: the blocking single-tensor calls then go
    straight to the compiled call (C.allgather_tensor ...), a few microseconds less a call."""
    return isinstance(tensor, torch.Tensor) and not (
        tensor.requires_grad and torch.is_grad_enabled()
    )


@group_dispatch("allgather()")
def allgather(tensor: torch.Tensor, *, async_op: bool = False, group=None, name: str | None = None):
    """Every rank's ``tensor`` concatenated along dim 0, in rank order, on every rank.
    Dim 0 may differ by rank (the row counts are exchanged first); dtype and the other dims
    may not. Differentiable: the gradient is a reduce_scatter (sum) of the output's gradient.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> r, n = fm.local_rank(), fm.total_workers()
    >>> fm.allgather(torch.full((r + 1, 2), float(r))).shape == (n * (n + 1) // 2, 2)
    True
    """
    if not async_op and _plain(tensor):  # the fast path of a hot call
        return C.allgather_tensor(tensor)
    if not async_op and _needs_grad(tensor):
        return Allgather.apply(tensor)
    p = rows.start("allgather", tensor, grouped=False, async_op=async_op, call="allgather()")
    return rows.finish(p, async_op, rows.first)


@group_dispatch("gather()")
def gather(
    tensor: torch.Tensor,
    root_rank: int = 0,
    *,
    async_op: bool = False,
    group=None,
    name: str | None = None,
):
    """Every rank's ``tensor`` concatenated along dim 0 on root_rank; ``None`` on the others.
    Dim 0 may differ by rank. Differentiable when ``tensor`` requires grad on every rank (the
    ranks check): the gradient is a scatter of the root's output gradient, and the others get
    zeros of the gathered shape instead of None, which carry the graph to that scatter.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> out = fm.gather(torch.full((1,), float(fm.local_rank())), root_rank=0)
    >>> out.tolist() == list(range(fm.total_workers())) if fm.local_rank() == 0 else out is None
    True
    """
    if not async_op and _needs_grad(tensor):
        return Gather.apply(tensor, root_rank)
    p = rows.start(
        "gather", tensor, grouped=False, async_op=async_op, call="gather()", root_rank=root_rank
    )
    return rows.finish(p, async_op, rows.first_or_none)


@group_dispatch("scatter()")
def scatter(
    tensor: torch.Tensor,
    root_rank: int = 0,
    splits=None,
    *,
    async_op: bool = False,
    group=None,
    name: str | None = None,
):
    """Part r (along dim 0, by ``splits``) of root_rank's ``tensor``, on rank r. Every rank
    passes a tensor of the same shape and dtype (``torch.empty`` will do: only the root's
    values are read) and the same splits. Differentiable when ``tensor`` requires grad on
    every rank (the ranks check; ``torch.empty(..., requires_grad=True)`` off the root): the
    root's gradient is the gather of every rank's output gradient, the others' is zero.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> n = fm.total_workers()
    >>> fm.scatter(torch.arange(2.0 * n), root_rank=0).tolist() == [2.0 * fm.local_rank(), 2.0 * fm.local_rank() + 1]
    True
    """
    if not async_op and _needs_grad(tensor):
        return Scatter.apply(tensor, root_rank, splits)
    p = rows.start(
        "scatter", tensor, grouped=False, async_op=async_op, call="scatter()",
        splits=splits, root_rank=root_rank,
    )  # fmt: skip
    return rows.finish(p, async_op, rows.first)


@group_dispatch("reduce_scatter()")
def reduce_scatter(
    tensor: torch.Tensor,
    op: str = "sum",
    splits=None,
    *,
    async_op: bool = False,
    group=None,
    name: str | None = None,
):
    """Part r (along dim 0, by ``splits``) of the reduction of ``tensor`` over ranks, on rank
    r. Every rank passes the same shape, dtype and splits; ``op`` as for allreduce_.
    Differentiable for "sum" and "average": the gradient is an allgather.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> n = fm.total_workers()
    >>> fm.reduce_scatter(torch.ones(n, 3), op="sum").tolist() == [[float(n)] * 3]
    True
    """
    if not async_op and splits is None and type(op) is str and _plain(tensor):
        return C.reduce_scatter_tensor(tensor, op)
    error = ""
    if not async_op and _needs_grad(tensor):
        error = _no_gradient("reduce_scatter()", op)  # raised by the call, on every rank
        if not error:
            return ReduceScatter.apply(tensor, op, splits)
    p = rows.start(
        "reduce_scatter", tensor, grouped=False, async_op=async_op, call="reduce_scatter()",
        op=op, splits=splits, error=error,
    )  # fmt: skip
    return rows.finish(p, async_op, rows.first)


@group_dispatch("alltoall()")
def alltoall(
    tensor: torch.Tensor,
    splits=None,
    *,
    async_op: bool = False,
    group=None,
    name: str | None = None,
):
    """Part j (along dim 0, by this rank's ``splits``) of ``tensor`` goes to rank j; returns
    the parts this rank received, concatenated in rank order. Splits may differ by rank; dtype
    and the dims after the first may not. Differentiable: the gradient is the reverse alltoall.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> r, n = fm.local_rank(), fm.total_workers()
    >>> fm.alltoall(torch.full((n,), float(r))).tolist() == [float(j) for j in range(n)]
    True
    """
    if not async_op and splits is None and _plain(tensor):
        return C.alltoall_tensor(tensor)
    if not async_op and _needs_grad(tensor):
        return Alltoall.apply(tensor, splits)
    p = rows.start(
        "alltoall", tensor, grouped=False, async_op=async_op, call="alltoall()", splits=splits
    )
    return rows.finish(p, async_op, rows.first)


@group_dispatch("Iallgather()")
def Iallgather(tensor: torch.Tensor, *, group=None, name: str | None = None) -> rows.PendingRequest:
    """:func:`allgather` in the background: a Request whose ``wait()`` returns the result.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Iallgather(torch.ones(1)).wait().tolist() == [1.0] * fm.total_workers()
    True
    """
    return allgather(tensor, async_op=True)


@group_dispatch("Igather()")
def Igather(
    tensor: torch.Tensor, root_rank: int = 0, *, group=None, name: str | None = None
) -> rows.PendingRequest:
    """:func:`gather` in the background.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> out = fm.Igather(torch.ones(1)).wait()
    >>> (out.numel() == fm.total_workers()) if fm.local_rank() == 0 else out is None
    True
    """
    return gather(tensor, root_rank, async_op=True)


@group_dispatch("Iscatter()")
def Iscatter(
    tensor: torch.Tensor, root_rank: int = 0, splits=None, *, group=None, name: str | None = None
) -> rows.PendingRequest:
    """:func:`scatter` in the background.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Iscatter(torch.ones(fm.total_workers())).wait().tolist()
    [1.0]
    """
    return scatter(tensor, root_rank, splits, async_op=True)


@group_dispatch("Ireduce_scatter()")
def Ireduce_scatter(
    tensor: torch.Tensor, op: str = "sum", splits=None, *, group=None, name: str | None = None
) -> rows.PendingRequest:
    """:func:`reduce_scatter` in the background.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Ireduce_scatter(torch.ones(fm.total_workers()), op="average").wait().tolist()
    [1.0]
    """
    return reduce_scatter(tensor, op, splits, async_op=True)


@group_dispatch("Ialltoall()")
def Ialltoall(
    tensor: torch.Tensor, splits=None, *, group=None, name: str | None = None
) -> rows.PendingRequest:
    """:func:`alltoall` in the background.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Ialltoall(torch.ones(fm.total_workers())).wait().tolist() == [1.0] * fm.total_workers()
    True
    """
    return alltoall(tensor, splits, async_op=True)


@group_dispatch("grouped_allgather()")
def grouped_allgather(tensors, *, async_op: bool = False, group=None, name: str | None = None):
    """:func:`allgather` of each tensor of a list, in one data collective; returns a list.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> a, b = fm.grouped_allgather([torch.ones(1), torch.zeros(2, dtype=torch.int64)])
    >>> (a.numel(), b.numel(), b.dtype) == (fm.total_workers(), 2 * fm.total_workers(), torch.int64)
    True
    """
    p = rows.start(
        "allgather", tensors, grouped=True, async_op=async_op, call="grouped_allgather()"
    )
    return rows.finish(p, async_op, rows.as_list)


@group_dispatch("grouped_gather()")
def grouped_gather(
    tensors, root_rank: int = 0, *, async_op: bool = False, group=None, name: str | None = None
):
    """:func:`gather` of each tensor of a list, in one data collective; a list on the root,
    ``None`` on the others.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> out = fm.grouped_gather([torch.ones(1), torch.ones(2)])
    >>> [t.numel() for t in out] == [fm.total_workers(), 2 * fm.total_workers()] if fm.local_rank() == 0 else out is None
    True
    """
    p = rows.start(
        "gather", tensors, grouped=True, async_op=async_op, call="grouped_gather()",
        root_rank=root_rank,
    )  # fmt: skip
    return rows.finish(p, async_op, lambda ts, _p: list(ts) if ts or not tensors else None)


@group_dispatch("grouped_scatter()")
def grouped_scatter(
    tensors,
    root_rank: int = 0,
    splits=None,
    *,
    async_op: bool = False,
    group=None,
    name: str | None = None,
):
    """:func:`scatter` of each tensor of a list, in one data collective. ``splits``: one
    entry per tensor (``None`` for equal parts), or ``None``.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> n = fm.total_workers()
    >>> [t.tolist() for t in fm.grouped_scatter([torch.ones(n), torch.zeros(2 * n)])]
    [[1.0], [0.0, 0.0]]
    """
    p = rows.start(
        "scatter", tensors, grouped=True, async_op=async_op, call="grouped_scatter()",
        splits=splits, root_rank=root_rank,
    )  # fmt: skip
    return rows.finish(p, async_op, rows.as_list)


@group_dispatch("grouped_reduce_scatter()")
def grouped_reduce_scatter(
    tensors,
    op: str = "sum",
    splits=None,
    *,
    async_op: bool = False,
    group=None,
    name: str | None = None,
):
    """:func:`reduce_scatter` of each tensor of a list, one data collective per dtype.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> n = fm.total_workers()
    >>> [t.tolist() for t in fm.grouped_reduce_scatter([torch.ones(n), torch.ones(2 * n)])] == [[n], [n, n]]
    True
    """
    p = rows.start(
        "reduce_scatter", tensors, grouped=True, async_op=async_op,
        call="grouped_reduce_scatter()", op=op, splits=splits,
    )  # fmt: skip
    return rows.finish(p, async_op, rows.as_list)


@group_dispatch("grouped_alltoall()")
def grouped_alltoall(
    tensors, splits=None, *, async_op: bool = False, group=None, name: str | None = None
):
    """:func:`alltoall` of each tensor of a list, in one data collective.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> n = fm.total_workers()
    >>> [t.numel() for t in fm.grouped_alltoall([torch.ones(n), torch.ones(3 * n)])] == [n, 3 * n]
    True
    """
    p = rows.start(
        "alltoall", tensors, grouped=True, async_op=async_op, call="grouped_alltoall()",
        splits=splits,
    )  # fmt: skip
    return rows.finish(p, async_op, rows.as_list)


@group_dispatch("grouped_allreduce_()")
def grouped_allreduce_(
    tensors, op: str = "sum", *, async_op: bool = False, group=None, name: str | None = None
):
    """:func:`allreduce_` of each tensor of a list, in place, packed into one buffer per
    dtype (one allreduce for the lot). Returns the list.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> ts = fm.grouped_allreduce_([torch.ones(2), torch.ones(3)])
    >>> [t.tolist() for t in ts] == [[float(fm.total_workers())] * k for k in (2, 3)]
    True
    """
    p = rows.start(
        "grouped_allreduce_", tensors, grouped=True, async_op=async_op,
        call="grouped_allreduce_()", op=op,
    )  # fmt: skip
    return rows.finish(p, async_op, lambda _none, _p: list(tensors))  # in place: the inputs


@group_dispatch("grouped_bcast_()")
def grouped_bcast_(
    tensors, root_rank: int = 0, *, async_op: bool = False, group=None, name: str | None = None
):
    """:func:`bcast_` of each tensor of a list, in place, in one broadcast. Returns the list.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> ts = fm.grouped_bcast_([torch.full((2,), float(fm.local_rank())), torch.ones(1)])
    >>> [t.tolist() for t in ts]
    [[0.0, 0.0], [1.0]]
    """
    p = rows.start(
        "grouped_bcast_", tensors, grouped=True, async_op=async_op, call="grouped_bcast_()",
        root_rank=root_rank,
    )  # fmt: skip
    return rows.finish(p, async_op, lambda _none, _p: list(tensors))  # in place: the inputs
