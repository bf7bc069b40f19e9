"""Horovod's reduction ops and the argument checks its calls share: the op constants, the op
check of allreduce, pre/post scaling and a process set's root."""

from __future__ import annotations

import torch

from ...collectives.inplace import raise_in_collective
from ...runtime.groups import current_group
from ...runtime.groups import on_group as _on_group
from . import _process_sets

# Horovod's reduction op constants, as the fluxmpi_py op names they map to.
Sum = "sum"
"""``op=hvd.Sum``: the sum over the ranks (fluxmpi_py's ``"sum"``)."""
Average = "average"
"""``op=hvd.Average``: the mean over the ranks (``"average"``), Horovod's default."""
Min = "min"
"""``op=hvd.Min``: the smallest over the ranks (``"min"``)."""
Max = "max"
"""``op=hvd.Max``: the largest over the ranks (``"max"``)."""
Product = "prod"
"""``op=hvd.Product``: the product over the ranks (``"prod"``)."""
Adasum = "adasum"
"""``op=hvd.Adasum``: accepted as a name; every call with it raises NotImplementedError."""


def _op(average, op) -> str:
    if average is not None and op is not None:
        raise ValueError("hvd: give average= or op=, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            "hvd: Adasum is not supported by fluxmpi_py; use op=hvd.Average (or Sum)"
        )
    if op not in (Sum, Average, Min, Max, Product):
        raise ValueError(f"hvd: unknown op {op!r}; expected hvd.Sum, Average, Min, Max or Product")
    return op


def _scale_(tensor, factor):
    """Horovod's pre/post scaling, in place: integer tensors are scaled in float64 and cast
    back (truncating), floating ones in their own dtype."""
    if factor == 1.0:
        return tensor
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor.mul_(factor)
    return tensor.copy_(tensor.double().mul_(factor).to(tensor.dtype))


def _integer_average(op, tensors, postscale_factor) -> tuple[str, float]:
    """Horovod's average of integer tensors: the sum times ``postscale_factor / size`` in
    float64, truncated (toward zero; fluxmpi_py's own integer average is the floor of the
    mean). Returns (op, postscale factor) to use: unchanged unless ``op`` is Average and some
    tensor is of an integer dtype (then the sum; floating tensors of a grouped call are scaled
    by the same factor, as Horovod does). Call inside the call's group."""
    if op != Average or not any(
        not (t.is_floating_point() or t.is_complex()) and t.dtype != torch.bool for t in tensors
    ):
        return op, postscale_factor
    return Sum, postscale_factor / current_group().size


def _root(process_set, root_rank, call, tensor=None):
    """(group, the world ``root_rank`` as a rank in the group). A root outside the set raises
    a ValueError-like error on every member together (before any data moves)."""
    group = _process_sets.group_of(process_set, call)
    root, error = _process_sets.group_root(group, root_rank, call)
    if error:
        with _on_group(group, call):
            raise_in_collective(error, tensor, like="bcast_")
    return group, root
