"""Collectives that autograd sees through: out-of-place ``allreduce`` and ``broadcast``, and
the backward rules that make :func:`allgather`, :func:`gather`, :func:`scatter`,
:func:`reduce_scatter` and :func:`alltoall` differentiable when their input requires grad.

The gradient of a collective is a collective: of allreduce an allreduce (same op), of
broadcast a reduce (sum) to the root, of allgather a reduce_scatter (sum), of gather a
scatter from the root, of scatter a gather to the root, of reduce_scatter an allgather, of
alltoall the reverse alltoall. So every rank must run backward through the same collectives
in the same order, as it ran forward. The row collectives check that: the ranks agree on
whether the input requires grad, and a rank that differs raises on every rank (allreduce and
broadcast do not check: a backward collective that one rank runs alone meets the stall
report). Only "sum" and "average" have gradients; other ops raise (on every rank) when the
input requires grad.
"""

from __future__ import annotations

import torch

from .._core import GRADIENT_OPS, ROOT_LIMIT, C
from ..runtime.groups import group_dispatch, on_handle
from . import row_calls as rows
from .inplace import allreduce_, bcast_, reduce_

__all__ = ["allreduce", "broadcast"]


def _needs_grad(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled()


def _no_gradient(call: str, op) -> str:
    if isinstance(op, str) and op in GRADIENT_OPS:
        return ""
    return f"{call} with op={op!r} has no gradient; use 'sum' or 'average', or pass tensor.detach()"


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op):
        ctx.op = op
        ctx.group = C.current_group()
        return allreduce_(x.detach().clone(memory_format=torch.contiguous_format), op)

    @staticmethod
    def backward(ctx, grad):
        with on_handle(ctx.group):
            return allreduce_(grad.clone(memory_format=torch.contiguous_format), ctx.op), None


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, root_rank):
        ctx.root_rank = root_rank
        ctx.group = C.current_group()
        out = x.detach().clone(memory_format=torch.contiguous_format)
        C.bcast_(out, root_rank)
        return out

    @staticmethod
    def backward(ctx, grad):
        with on_handle(ctx.group):
            g = reduce_(grad.clone(memory_format=torch.contiguous_format), "sum", ctx.root_rank)
        if ctx.group.rank != ctx.root_rank:
            g.zero_()  # only the root's input reached the output
        return g, None


class Allgather(torch.autograd.Function):
    """allgather whose backward is a reduce_scatter (sum) by the gathered row counts."""

    @staticmethod
    def forward(ctx, x):
        p = rows.start("allgather", x, grouped=False, async_op=False, call="allgather()", grad=True)
        out = p.wait()[0]
        ctx.rows = p.received_splits[0]
        ctx.group = C.current_group()
        return out

    @staticmethod
    def backward(ctx, grad):
        call = "allgather() backward"
        with on_handle(ctx.group):
            p = rows.start(
                "reduce_scatter", grad, grouped=False, async_op=False, call=call, op="sum",
                splits=ctx.rows,
            )  # fmt: skip
            return p.wait()[0]


class ReduceScatter(torch.autograd.Function):
    """reduce_scatter (sum or average) whose backward is an allgather."""

    @staticmethod
    def forward(ctx, x, op, splits):
        ctx.average = op != "sum"
        ctx.group = C.current_group()
        p = rows.start(
            "reduce_scatter", x, grouped=False, async_op=False, call="reduce_scatter()", op=op,
            splits=splits, grad=True,
        )  # fmt: skip
        return p.wait()[0]

    @staticmethod
    def backward(ctx, grad):
        with on_handle(ctx.group):
            p = rows.start(
                "allgather", grad, grouped=False, async_op=False, call="reduce_scatter() backward"
            )
            g = p.wait()[0]
        if ctx.average:
            g.div_(ctx.group.size)
        return g, None, None


class Gather(torch.autograd.Function):
    """gather whose backward scatters the root's output gradient by the gathered row counts.
    The other ranks' outputs are zeros of the gathered shape (as torch.distributed.nn's
    gather), which carry the graph to that scatter; their gradients are not read."""

    @staticmethod
    def forward(ctx, x, root_rank):
        p = rows.start(
            "gather", x, grouped=False, async_op=False, call="gather()", root_rank=root_rank,
            grad=True,
        )  # fmt: skip
        got = p.wait()
        ctx.rows, ctx.root_rank = p.received_splits[0], root_rank
        ctx.group = C.current_group()
        if got:
            return got[0]
        return x.new_zeros((sum(ctx.rows), *x.shape[1:]))

    @staticmethod
    def backward(ctx, grad):
        with on_handle(ctx.group):
            p = rows.start(
                "scatter", grad.contiguous(), grouped=False, async_op=False,
                call="gather() backward", splits=ctx.rows, root_rank=ctx.root_rank,
            )  # fmt: skip
            return p.wait()[0], None


class Scatter(torch.autograd.Function):
    """scatter whose backward gathers every rank's output gradient to the root (the root's
    input gradient); the other ranks' inputs were not read, so their gradient is zero."""

    @staticmethod
    def forward(ctx, x, root_rank, splits):
        p = rows.start(
            "scatter", x, grouped=False, async_op=False, call="scatter()", splits=splits,
            root_rank=root_rank, grad=True,
        )  # fmt: skip
        out = p.wait()[0]
        ctx.root_rank, ctx.shape = root_rank, x.shape
        ctx.group = C.current_group()
        return out

    @staticmethod
    def backward(ctx, grad):
        with on_handle(ctx.group):
            p = rows.start(
                "gather", grad.contiguous(), grouped=False, async_op=False,
                call="scatter() backward", root_rank=ctx.root_rank,
            )  # fmt: skip
            got = p.wait()
        return (got[0] if got else grad.new_zeros(ctx.shape)), None, None


class Alltoall(torch.autograd.Function):
    """alltoall whose backward is the reverse alltoall (the received row counts as splits)."""

    @staticmethod
    def forward(ctx, x, splits):
        p = rows.start(
            "alltoall", x, grouped=False, async_op=False, call="alltoall()", splits=splits,
            grad=True,
        )  # fmt: skip
        out = p.wait()[0]
        ctx.received = p.received_splits[0]
        ctx.group = C.current_group()
        return out

    @staticmethod
    def backward(ctx, grad):
        call = "alltoall() backward"
        with on_handle(ctx.group):
            p = rows.start(
                "alltoall", grad, grouped=False, async_op=False, call=call, splits=ctx.received
            )
            return p.wait()[0], None


@group_dispatch("allreduce()")
def allreduce(
    tensor: torch.Tensor, op: str = "sum", *, group=None, name: str | None = None
) -> torch.Tensor:
    """The reduction of ``tensor`` over all ranks, as a new tensor; differentiable for "sum"
    and "average" (the gradient is the same allreduce of the output's gradient). A collective.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> x = torch.ones(2, requires_grad=True)
    >>> y = fm.allreduce(x)
    >>> y.sum().backward()
    >>> y.tolist() == [float(fm.total_workers())] * 2, x.grad.tolist() == y.tolist()
    (True, True)
    """
    if _needs_grad(tensor):
        error = _no_gradient("allreduce()", op)
        if error:
            C.allreduce_(tensor, str(op), error)  # raises on every rank
        return _Allreduce.apply(tensor, op)
    if not isinstance(tensor, torch.Tensor):
        return allreduce_(tensor, op)  # raises on every rank
    return allreduce_(tensor.clone(memory_format=torch.contiguous_format), op)


@group_dispatch("broadcast()")
def broadcast(
    tensor: torch.Tensor, root_rank: int = 0, *, group=None, name: str | None = None
) -> torch.Tensor:
    """root_rank's ``tensor`` on every rank, as a new tensor; differentiable (the root's
    gradient is the sum of every rank's output gradient; the others' is zero). A collective.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> x = torch.full((2,), float(fm.local_rank()), requires_grad=True)
    >>> y = fm.broadcast(x, root_rank=0)
    >>> y.sum().backward()
    >>> y.tolist(), x.grad.tolist() == ([float(fm.total_workers())] * 2 if fm.local_rank() == 0 else [0.0, 0.0])
    ([0.0, 0.0], True)
    """
    if _needs_grad(tensor) and type(root_rank) is int and -ROOT_LIMIT <= root_rank < ROOT_LIMIT:
        return _Broadcast.apply(tensor, root_rank)
    if not isinstance(tensor, torch.Tensor):
        return bcast_(tensor, root_rank)  # raises on every rank
    return bcast_(tensor.clone(memory_format=torch.contiguous_format), root_rank)
