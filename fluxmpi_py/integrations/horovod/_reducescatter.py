"""Horovod's reducescatter and grouped reducescatter on fluxmpi_py's ``reduce_scatter`` (its
parts, its ops with pre/post scaling, its gradients), with their ``_async`` forms.

Handles are :class:`._handles._Handle` objects, finished by ``hvd.synchronize``.
``process_set=`` runs a call on that set's group (:mod:`._process_sets`).
"""

from __future__ import annotations

import torch

from ...collectives import rows as _gc
from ...runtime.groups import current_group
from . import _gradients
from ._handles import _in_set, named, start_async, started_at_once, synchronize_now
from ._ops import _integer_average, _op, _scale_

__all__ = [
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
]


def _reducescatter_op(op) -> str:
    """Horovod's reducescatter op as the fluxmpi_py reduction: "sum" or "average"."""
    op = _op(None, op)
    if op not in ("sum", "average"):
        raise ValueError(f"hvd: reducescatter takes op=hvd.Sum or hvd.Average, got {op!r}")
    return op


def _scale_op(op, prescale_factor, postscale_factor, tensors):
    """Horovod's op as the fluxmpi_py reduction, prescaling ``tensors`` in place; returns
    (op, finish) where finish applies the postscale to the result. Call inside the group."""
    op, postscale_factor = _integer_average(_reducescatter_op(op), tensors, postscale_factor)
    for t in tensors:
        _scale_(t, prescale_factor)  # integer tensors in float64, as Horovod

    def finish(out):
        for t in out if isinstance(out, list) else [out]:
            _scale_(t, postscale_factor)
        return out

    return op, finish


def _horovod_splits(tensor: torch.Tensor) -> list[int]:
    """Horovod's reducescatter parts: dim 0 in as many parts as the (current group's) ranks,
    the first ranks one row more when it does not divide."""
    n = current_group().size
    q, rem = divmod(tensor.shape[0] if tensor.dim() else 0, n)
    return [q + (1 if r < rem else 0) for r in range(n)]


def reducescatter(
    tensor, name=None, compression=None, op=None, process_set=None,
    prescale_factor=1.0, postscale_factor=1.0,
):  # fmt: skip
    """Rank r's part (dim 0 in world-size parts, the first ranks one row more when it does
    not divide) of the reduction of ``tensor`` over every rank; ``op``: ``hvd.Average``
    (default) or ``hvd.Sum``. ``compression`` is accepted and ignored (full precision).

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init(); n = hvd.size()
    >>> hvd.reducescatter(torch.ones(n, 2), op=hvd.Sum).tolist() == [[float(n)] * 2]
    True

    Differentiable, as Horovod's: the gradient is the allgather of the output's, times the
    size for ``hvd.Sum``, and times both scale factors.
    """
    if _gradients.needs_grad([tensor]):
        call = "hvd.reducescatter()"
        return _differentiable_reducescatter(
            [tensor], name, op, process_set, prescale_factor, postscale_factor, call
        )[0]
    with started_at_once():
        handle = reducescatter_async(
            tensor, name, compression, op, process_set, prescale_factor, postscale_factor
        )
    return synchronize_now(handle)


def reducescatter_async(
    tensor, name=None, compression=None, op=None, process_set=None,
    prescale_factor=1.0, postscale_factor=1.0,
):  # fmt: skip
    """Start :func:`reducescatter`; ``hvd.synchronize`` returns the part.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init(); n = hvd.size()
    >>> hvd.synchronize(hvd.reducescatter_async(torch.ones(n))).tolist()
    [1.0]
    """
    call = "hvd.reducescatter_async()"
    op = _reducescatter_op(op)
    tensor = tensor.detach().clone() if prescale_factor != 1.0 else tensor

    def start():
        reduce, finish = _scale_op(op, prescale_factor, postscale_factor, [tensor])
        return _gc.reduce_scatter(tensor, reduce, _horovod_splits(tensor), async_op=True), finish

    return start_async(name, process_set, call, start)


def grouped_reducescatter(
    tensors, name=None, compression=None, op=None, process_set=None,
    prescale_factor=1.0, postscale_factor=1.0,
):  # fmt: skip
    """:func:`reducescatter` of each tensor of a list, one data collective per dtype.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init(); n = hvd.size()
    >>> [t.tolist() for t in hvd.grouped_reducescatter([torch.ones(n), torch.ones(2 * n)])]
    [[1.0], [1.0, 1.0]]

    Differentiable, as :func:`reducescatter`.
    """
    tensors = list(tensors)
    if _gradients.needs_grad(tensors):
        call = "hvd.grouped_reducescatter()"
        return _differentiable_reducescatter(
            tensors, name, op, process_set, prescale_factor, postscale_factor, call
        )
    with started_at_once():
        handle = grouped_reducescatter_async(
            tensors, name, compression, op, process_set, prescale_factor, postscale_factor
        )
    return synchronize_now(handle)


def _differentiable_reducescatter(tensors, name, op, process_set, prescale, postscale, call):
    with named(name, process_set, call, hold=False), _in_set(process_set, call):
        op = _reducescatter_op(op)
        splits = [_horovod_splits(t) for t in tensors]
        outs = _gradients.GroupedReducescatter.apply(
            call, op, splits, prescale, postscale, *tensors
        )
        return list(outs)


def grouped_reducescatter_async(
    tensors, name=None, compression=None, op=None, process_set=None,
    prescale_factor=1.0, postscale_factor=1.0,
):  # fmt: skip
    """Start :func:`grouped_reducescatter`; ``hvd.synchronize`` returns the list.

    >>> import torch, fluxmpi_py.horovod as hvd; hvd.init(); n = hvd.size()
    >>> len(hvd.synchronize(hvd.grouped_reducescatter_async([torch.ones(n)])))
    1
    """
    call = "hvd.grouped_reducescatter_async()"
    op = _reducescatter_op(op)
    tensors = list(tensors)
    if prescale_factor != 1.0:
        tensors = [t.detach().clone() for t in tensors]

    def start():
        reduce, finish = _scale_op(op, prescale_factor, postscale_factor, tensors)
        splits = [_horovod_splits(t) for t in tensors]
        return _gc.grouped_reduce_scatter(tensors, reduce, splits, async_op=True), finish

    return start_async(name, process_set, call, start)
