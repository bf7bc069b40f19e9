"""allreduce_gradients: FluxMPI's one-call gradient reduction, for training loops without
DistributedOptimizer. The same plan and C++ reducer as DistributedOptimizer, cached per
parameter list."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .._core import C, gradient_op_error
from ..runtime.entry import entry_point
from ._optimizer_args import reduction_options
from ._reduction_plan import ReductionPlan, replan_if_changed
from .consistency import _check as _check_consistency
from .optimizer import DEFAULT_DIRECT_MIN_BYTES

__all__ = ["allreduce_gradients"]


_plan_cache: dict = {}
# The last call's arguments (the very objects) with their checked options and repr: a loop
# that passes the same arguments each step skips the checks (no allocation either).
_last_options: list = [object(), None, None, None, ""]


def _options(op, bucket_cap_mb, direct_min_bytes) -> tuple:
    """The reduction's options and their repr, checked once for the same argument objects (by
    identity: True is never taken for 1)."""
    last = _last_options
    if op is last[0] and bucket_cap_mb is last[1] and direct_min_bytes is last[2]:
        return last[3], last[4]
    op_error = gradient_op_error("allreduce_gradients", op)
    if op_error:
        raise ValueError(op_error)
    options = reduction_options(
        "allreduce_gradients",
        op=op,
        bucket_cap_mb=bucket_cap_mb,
        direct_min_bytes=direct_min_bytes,
    )
    last[:] = [op, bucket_cap_mb, direct_min_bytes, options, repr(options)]
    return options, last[4]


@entry_point("allreduce_gradients()")
def allreduce_gradients(
    model_or_params: torch.nn.Module | Iterable[torch.Tensor],
    op: str = "average",
    *,
    bucket_cap_mb: float = 25,
    direct_min_bytes: int | None = DEFAULT_DIRECT_MIN_BYTES,
) -> None:
    """Reduce the ``.grad`` of every parameter over all ranks in one fused call (FluxMPI's
    ``allreduce_gradients``), for training loops without DistributedOptimizer.

    A gradient missing on some ranks counts as zeros there; missing on every rank stays None.
    The first call with a parameter list checks that every rank holds the same parameters
    (ValueError on every rank, naming the first that differs: a forgotten
    :func:`synchronize_`). Parameters with ``requires_grad=False`` are left out; a call after
    some rank froze or unfroze a parameter re-plans on every rank (or raises ValueError naming
    the parameter where the ranks differ). Small gradients may afterwards be views of a fused
    buffer (as DDP's gradient_as_bucket_view).

    Args:
        model_or_params: a model, or an iterable of its parameters.
        op: ``"average"`` (also ``"mean"``, ``"avg"``) or ``"sum"``.
        bucket_cap_mb: the largest bucket of gradients reduced in one call, in MiB.
        direct_min_bytes: gradients of at least this many bytes are reduced in their own
            storage; None: every gradient in a fused buffer.

    Raises:
        ValueError: on every rank, for ranks whose parameters differ, naming the first.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> m = fm.synchronize_(torch.nn.Linear(3, 1)); m(torch.ones(2, 3)).sum().backward()
    >>> fm.allreduce_gradients(m)
    """
    options, options_key = _options(op, bucket_cap_mb, direct_min_bytes)
    is_module = isinstance(model_or_params, torch.nn.Module)
    given = (
        list(model_or_params.parameters())
        if isinstance(model_or_params, torch.nn.Module)
        else list(model_or_params)
    )

    def named():
        if is_module:
            return list(model_or_params.named_parameters())
        return [(f"params[{i}]", p) for i, p in enumerate(given)]

    # The same parameters as last time (checked by identity, at C speed): reuse the plan, its
    # reducer and its buffers; per call that leaves the requires_grad check and the reduction.
    key = (id(model_or_params), len(given), options_key)
    hit = _plan_cache.get(key)
    if hit is None or not C.same_objects(hit[0], given):
        if not is_module and not all(isinstance(p, torch.Tensor) for p in given):
            raise TypeError("allreduce_gradients takes an nn.Module or an iterable of tensors")
        if len(_plan_cache) > 8:
            _plan_cache.clear()
        plan = ReductionPlan(named(), "allreduce_gradients()", options)
        # A new plan (the first call): the ranks must start from the same parameters, or each
        # would apply the averaged gradients to its own weights (see DistributedOptimizer's
        # first-step check). One pass over them and one tiny allreduce, per plan.
        _check_consistency(
            {"parameters": dict(named())},
            {},
            "allreduce_gradients(): the ranks must hold the same parameters when it first "
            "sees them (start them equal: fm.synchronize_(model) after building or loading "
            "it, or the same seed everywhere)",
        )
        hit = _plan_cache[key] = (given, plan)
    plan = hit[1]
    replan_if_changed(plan, plan.requires_grad_changed(), named)
