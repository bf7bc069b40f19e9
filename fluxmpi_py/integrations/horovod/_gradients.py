"""The gradients of Horovod's collectives, as horovod.torch (0.21 to 0.28.1, its last release)
defines them, where they differ from fluxmpi_py's own (which are each rank's share of the
sum of every rank's loss):

- ``allgather`` and ``broadcast``: the output gradients are averaged over the ranks, not
  summed (Horovod's ``allreduce(grad, average=True)``), then sliced / kept on the root;
- ``reducescatter`` (Sum): the allgathered output gradients times the set's size, as for an
  allreduce of every rank's whole gradient; Average: the allgathered gradients alone. The
  prescale and postscale factors scale the gradient too.

Each backward is a collective: every rank of the set must run backward through the call, as
with Horovod.
"""

from __future__ import annotations

import torch

from ...collectives import row_calls as rows
from ...runtime.groups import current_group, on_group


class _ScaleGrad(torch.autograd.Function):
    """The identity, whose gradient is the output's times ``factor``."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def averaged_gradient(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """``tensor`` whose gradient is divided by ``size`` (for a collective whose own backward
    sums: Horovod's average)."""
    return _ScaleGrad.apply(tensor, 1.0 / size) if size > 1 else tensor


def needs_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


class GroupedAllgather(torch.autograd.Function):
    """grouped allgather; backward: each output gradient averaged over the ranks and sliced
    to this rank's rows (one grouped reduce_scatter, divided by the size)."""

    @staticmethod
    def forward(ctx, call, *xs):
        p = rows.start("allgather", list(xs), grouped=True, async_op=False, call=call)
        outs = p.wait()
        ctx.rows, ctx.call = p.received_splits, call
        ctx.group = current_group()
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        with on_group(ctx.group, ctx.call + " backward"):
            p = rows.start(
                "reduce_scatter", [g.contiguous() for g in grads], grouped=True,
                async_op=False, call=ctx.call + " backward", op="sum", splits=ctx.rows,
            )  # fmt: skip
            gs = p.wait()
        n = ctx.group.size
        return (None, *(g.div_(n) if n > 1 else g for g in gs))


class GroupedReducescatter(torch.autograd.Function):
    """grouped reduce_scatter (sum or average) with Horovod's parts and scale factors;
    backward: the grouped allgather of the output gradients, times the size for a sum and
    times both factors."""

    @staticmethod
    def forward(ctx, call, op, splits, prescale, postscale, *xs):
        ctx.call, ctx.op, ctx.factor = call, op, prescale * postscale
        ctx.group = current_group()
        ins = [x.detach() * prescale if prescale != 1.0 else x.detach() for x in xs]
        p = rows.start(
            "reduce_scatter", ins, grouped=True, async_op=False, call=call, op=op, splits=splits
        )
        outs = p.wait()
        if postscale != 1.0:
            outs = [o.mul_(postscale) for o in outs]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        with on_group(ctx.group, ctx.call + " backward"):
            p = rows.start(
                "allgather", [g.contiguous() for g in grads], grouped=True, async_op=False,
                call=ctx.call + " backward",
            )  # fmt: skip
            gs = p.wait()
        scale = ctx.factor * (ctx.group.size if ctx.op == "sum" else 1)
        return (None, None, None, None, None, *(g.mul_(scale) if scale != 1 else g for g in gs))
