"""DistributedOptimizer's argument checks, and the reduction options it and
allreduce_gradients build from theirs, all before their first collective."""

from __future__ import annotations

import torch

from .._core import C, gradient_op_error


def check_optimizer_args(
    optimizer,
    op,
    backward_passes_per_step,
    check_every,
    buffers,
    module,
):
    """Raise TypeError/ValueError naming the bad argument (the reduction's own arguments are
    checked where :func:`reduction_options` builds them)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        fix = (
            ": to train a model, wrap an optimizer of its parameters and pass the model as "
            "module=, DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), "
            "module=model)"
            if isinstance(optimizer, torch.nn.Module)
            else ""
        )
        raise TypeError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}"
            + fix
        )
    op_error = gradient_op_error("DistributedOptimizer", op)
    if op_error:
        raise ValueError(op_error)
    passes_error = check_passes(backward_passes_per_step)
    if passes_error:
        raise ValueError(passes_error)
    if check_every is not None and not (
        isinstance(check_every, int) and not isinstance(check_every, bool) and check_every >= 0
    ):
        raise ValueError(
            f"check_every must be None, 0 (no check at all) or an int >= 1, got {check_every!r}"
        )
    if buffers not in (None, "average", "broadcast"):
        raise ValueError(
            f"DistributedOptimizer(buffers={buffers!r}): expected 'average', 'broadcast' or None"
        )
    if module is None and buffers == "broadcast":
        raise ValueError(
            "DistributedOptimizer(buffers='broadcast') syncs the buffers of module=: pass module=model"
        )
    if module is not None and not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"DistributedOptimizer(module=...) takes an nn.Module, got {type(module).__name__}"
        )


#: The most backward passes a step on one rank: the ranks' sum (the step's micro-batches)
#: travels as int64, and the exact sums need it far below 2**62.
MAX_PASSES = 1 << 31


def check_passes(backward_passes_per_step) -> str:
    """The error message for a ``backward_passes_per_step`` that is not an int from 1 to
    :data:`MAX_PASSES`, else "" (checked before the first collective: ranks may pass
    different good counts, never a bad one).

    >>> check_passes(3), check_passes(0) != ""
    ('', True)
    """
    passes = backward_passes_per_step
    if isinstance(passes, int) and not isinstance(passes, bool) and 1 <= passes <= MAX_PASSES:
        return ""
    return f"backward_passes_per_step must be an int from 1 to 2**31, got {passes!r}"


MiB = 1 << 20
# Sizes in bytes stay below this (the compiled plan takes int64, and sums of them must fit).
_LIMIT = 1 << 62
#: direct_min_bytes=None: no gradient goes direct (the planner's kNeverDirect).
NEVER = _LIMIT


def byte_size(name: str, value, scale: int, none: int | None, owner: str) -> int:
    """``value * scale`` bytes as an int: ``none`` for None where None is allowed (``none``
    not None); TypeError or ValueError naming ``name`` for what is no number of bytes (not a
    number, NaN, beyond +-2**62). The sign is the planner's to check
    (``C.PlanOptions``).

    >>> byte_size("bucket_cap_mb", 0.5, MiB, None, "f"), byte_size("x", None, 1, 7, "f")
    (524288, 7)
    """
    if value is None and none is not None:
        return none
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}({name}=...) takes a number, got {type(value).__name__}")
    if not abs(value * scale) < _LIMIT:  # NaN fails here too
        raise ValueError(f"{owner}({name}={value!r}): expected a size below {_LIMIT // scale}")
    return int(value * scale)


def reduction_options(
    owner: str,
    *,
    op: str,
    bucket_cap_mb,
    direct_min_bytes,
    compression=None,
    first_bucket_cap_mb=None,
    cuda_direct_min_bytes=None,
) -> C.ReducerOptions:
    """The reduction's options from ``owner``'s arguments (MiB, bytes, None), built once,
    before the first collective, and checked there: the sizes by ``C.PlanOptions`` (the
    planner's one check of its limits), op and compression by ``C.ReducerOptions``
    (ValueError naming the bad one). Both paths plan with its ``plan`` (the exact one through
    ``C.plan_buckets``, told its element size).

    >>> o = reduction_options("f", op="avg", bucket_cap_mb=1, direct_min_bytes=None)
    >>> o.op, o.plan.cap_bytes, o.plan.direct_min_bytes == NEVER, o.plan.first_cap_bytes
    ('average', 1048576, True, 0)
    """
    plan = C.PlanOptions(
        cap_bytes=byte_size("bucket_cap_mb", bucket_cap_mb, MiB, None, owner),
        first_cap_bytes=byte_size("first_bucket_cap_mb", first_bucket_cap_mb, MiB, 0, owner),
        direct_min_bytes=byte_size("direct_min_bytes", direct_min_bytes, 1, NEVER, owner),
        cuda_direct_min_bytes=byte_size(
            "cuda_direct_min_bytes", cuda_direct_min_bytes, 1, NEVER, owner
        ),
    )
    return C.ReducerOptions(plan=plan, op=op, compression=compression)
