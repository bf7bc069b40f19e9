"""Horovod's alltoall, grouped allreduce and allgather on fluxmpi_py's row collectives (one
fused data collective per grouped call), with their ``_async`` forms and those of allgather and
broadcast (reducescatter: :mod:`._reducescatter`).

Handles are :class:`._handles._Handle` objects, finished by ``hvd.synchronize``.
``process_set=`` runs a call on that set's group (:mod:`._process_sets`).
"""

from __future__ import annotations

import torch

from ...collectives import row_calls as rows
from ...collectives import rows as _gc
from ...collectives.inplace import Ibcast
from ...runtime.groups import current_group, on_group
from . import _gradients
from ._handles import _in_set, named, start_async, started_at_once, synchronize_now
from ._ops import _integer_average, _op, _root, _scale_
from ._process_sets import group_of

__all__ = [
    "alltoall",
    "alltoall_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_allgather",
    "grouped_allgather_async",
    "allgather_async",
    "broadcast_async",
    "broadcast_async_",
]


class _AlltoallWithSplits(torch.autograd.Function):
    """alltoall that also returns the received row counts; backward: the reverse alltoall, on
    the forward's group."""

    @staticmethod
    def forward(ctx, x, splits):
        p = rows.start(
            "alltoall", x, grouped=False, async_op=False, call="hvd.alltoall()", splits=splits
        )
        out = p.wait()[0]
        ctx.received, ctx.group = p.received_splits[0], current_group()
        received = torch.tensor(ctx.received, dtype=torch.int32)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _grad_received):
        with on_group(ctx.group, "hvd.alltoall() backward"):  # the forward's set, not the caller's
            p = rows.start(
                "alltoall", grad.contiguous(), grouped=False, async_op=False,
                call="hvd.alltoall() backward", splits=ctx.received,
            )  # fmt: skip
            return p.wait()[0], None


class _GroupedAllreduce(torch.autograd.Function):
    """grouped allreduce (sum or average) of copies; backward: the same grouped allreduce of
    the outputs' gradients, on the forward's group."""

    @staticmethod
    def forward(ctx, op, *tensors):
        ctx.op, ctx.group = op, current_group()
        outs = [t.detach().clone(memory_format=torch.contiguous_format) for t in tensors]
        return tuple(_gc.grouped_allreduce_(outs, op))

    @staticmethod
    def backward(ctx, *grads):
        with on_group(ctx.group, "hvd.grouped_allreduce() backward"):
            gs = [g.clone(memory_format=torch.contiguous_format) for g in grads]
            return (None, *_gc.grouped_allreduce_(gs, ctx.op))


class SplitsError(TypeError, ValueError):
    """A bad ``splits`` of hvd.alltoall: a TypeError as in fluxmpi_py, and the ValueError
    Horovod raises."""


def _splits_error(e: TypeError) -> TypeError:
    return SplitsError(str(e)) if "splits must be" in str(e) else e


def _with_received(tensors, pending):
    return tensors[0], torch.tensor(pending.received_splits[0], dtype=torch.int32)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Part j of ``tensor`` (dim 0, by ``splits`` or equal parts) goes to rank j; returns the
    parts received, in rank order, and, when ``splits`` is given, the received row counts
    (int32) too, as Horovod does. Differentiable.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init(); n = hvd.size()
    >>> out, got = hvd.alltoall(torch.ones(n, 2), splits=[1] * n); out.shape[0] == n, got.tolist() == [1] * n
    (True, True)
    """
    with (
        named(name, process_set, "hvd.alltoall()", hold=False),
        _in_set(process_set, "hvd.alltoall()"),
    ):
        if splits is None:
            return _gc.alltoall(tensor)
        try:
            if tensor.requires_grad and torch.is_grad_enabled():
                return _AlltoallWithSplits.apply(tensor, splits)
            p = rows.start(
                "alltoall", tensor, grouped=False, async_op=False, call="hvd.alltoall()",
                splits=splits,
            )  # fmt: skip
        except TypeError as e:  # raised on every rank together
            raise _splits_error(e) from None
        return _with_received(p.wait(), p)


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Start :func:`alltoall`; ``hvd.synchronize`` returns what it returns.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init(); n = hvd.size()
    >>> hvd.synchronize(hvd.alltoall_async(torch.ones(n))).tolist() == [1.0] * n
    True
    """
    call = "hvd.alltoall_async()"

    def start():
        p = rows.start(
            "alltoall", tensor, grouped=False, async_op=True, call=call, splits=splits
        )  # fmt: skip
        return rows.finish(p, True, rows.first if splits is None else _with_received), None

    return start_async(name, process_set, call, start)


def grouped_allreduce_async_(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
    process_set=None,
):  # fmt: skip
    """Start :func:`grouped_allreduce_` (one fused allreduce per dtype).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> [t.tolist() for t in hvd.synchronize(hvd.grouped_allreduce_async_([torch.ones(1)]))]
    [[1.0]]
    """

    call = "hvd.grouped_allreduce_async_()"
    tensors = list(tensors)
    op = _op(average, op)

    def start():
        reduce, post = _integer_average(op, tensors, postscale_factor)
        if prescale_factor != 1.0:
            for t in tensors:
                _scale_(t, prescale_factor)
        req = _gc.grouped_allreduce_(tensors, reduce, async_op=True)
        return req, None if post == 1.0 else lambda out: [_scale_(t, post) for t in out]

    return start_async(name, process_set, call, start)


def grouped_allreduce_async(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
    process_set=None,
):  # fmt: skip
    """Start :func:`grouped_allreduce` (new tensors; the inputs are left alone).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> [t.tolist() for t in hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(1)]))]
    [[1.0]]
    """
    return grouped_allreduce_async_(
        [t.detach().clone() for t in tensors], average, name, op, prescale_factor,
        postscale_factor, process_set,
    )  # fmt: skip


def grouped_allreduce_(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
    process_set=None,
):  # fmt: skip
    """:func:`hvd.allreduce_ <fluxmpi_py.horovod.allreduce_>` of each tensor of a list, in
    place, fused into one allreduce per dtype; returns the list.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> [t.tolist() for t in hvd.grouped_allreduce_([torch.ones(1), torch.ones(2)])]
    [[1.0], [1.0, 1.0]]
    """

    # Blocking on this thread: no hand-off to the engine thread and back (with a thousand
    # tensors that hand-off cost more than the call's checks).
    call = "hvd.grouped_allreduce_()"
    with named(name, process_set, call, hold=False), _in_set(process_set, call):
        tensors = list(tensors)
        op, postscale_factor = _integer_average(_op(average, op), tensors, postscale_factor)
        if prescale_factor != 1.0:  # a loop of 1000 no-op calls took ~20% of the call
            tensors = [_scale_(t, prescale_factor) for t in tensors]
        out = _gc.grouped_allreduce_(tensors, op)
    if postscale_factor != 1.0:
        out = [_scale_(t, postscale_factor) for t in out]
    return out


def grouped_allreduce(
    tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
    process_set=None,
):  # fmt: skip
    """:func:`grouped_allreduce_` into new tensors. Differentiable for sum and average (the
    gradients are the same grouped allreduce of the outputs' gradients).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> [t.tolist() for t in hvd.grouped_allreduce([torch.ones(1)], op=hvd.Sum)] == [[hvd.size()]]
    True
    """
    tensors = list(tensors)
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    ):
        call = "hvd.grouped_allreduce()"
        with named(name, process_set, call, hold=False), _in_set(process_set, call):
            op = _op(average, op)
            if op in ("sum", "average"):
                xs = [t * prescale_factor if prescale_factor != 1.0 else t for t in tensors]
                outs = _GroupedAllreduce.apply(op, *xs)
                return [o * postscale_factor if postscale_factor != 1.0 else o for o in outs]
    with started_at_once():
        handle = grouped_allreduce_async(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    return synchronize_now(handle)


def grouped_allgather(tensors, name=None, process_set=None):
    """:func:`hvd.allgather <fluxmpi_py.horovod.allgather>` of each tensor of a list, in one
    data collective. Differentiable, as ``hvd.allgather``.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> [t.shape[0] for t in hvd.grouped_allgather([torch.ones(1), torch.ones(2)])] == [hvd.size(), 2 * hvd.size()]
    True
    """
    call = "hvd.grouped_allgather()"
    tensors = list(tensors)
    with named(name, process_set, call, hold=False):
        group = group_of(process_set, call)
        if _gradients.needs_grad(tensors):
            with _in_set(process_set, call):
                return list(_gradients.GroupedAllgather.apply(call, *tensors))
        return _gc.grouped_allgather(tensors, group=group)


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Start :func:`grouped_allgather`.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> len(hvd.synchronize(hvd.grouped_allgather_async([torch.ones(1)])))
    1
    """
    call = "hvd.grouped_allgather_async()"
    tensors = list(tensors)
    return start_async(
        name, process_set, call, lambda: (_gc.grouped_allgather(tensors, async_op=True), None)
    )


def allgather_async(tensor, name=None, process_set=None):
    """Start ``hvd.allgather``.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.synchronize(hvd.allgather_async(torch.ones(1))).shape[0] == hvd.size()
    True
    """
    call = "hvd.allgather_async()"
    return start_async(
        name, process_set, call, lambda: (_gc.allgather(tensor, async_op=True), None)
    )


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """Start ``hvd.broadcast_`` (in place).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.synchronize(hvd.broadcast_async_(torch.full((1,), float(hvd.rank())), 0)).tolist()
    [0.0]
    """

    call = "hvd.broadcast_async_()"

    def start():
        group, root = _root(process_set, root_rank, call, tensor)
        return Ibcast(tensor, root, group=group), None

    return start_async(name, process_set, call, start)


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Start ``hvd.broadcast`` (into a new tensor).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init()
    >>> hvd.synchronize(hvd.broadcast_async(torch.full((1,), float(hvd.rank())), 0)).tolist()
    [0.0]
    """
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)
