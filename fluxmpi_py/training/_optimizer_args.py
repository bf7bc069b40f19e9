"""DistributedOptimizer's argument checks, all made before its first collective."""

from __future__ import annotations

import torch

from .._core import C, gradient_op_error


def check_optimizer_args(
    optimizer,
    op,
    compression,
    backward_passes_per_step,
    check_every,
    bucket_cap_mb,
    buffers,
    module,
):
    """Raise TypeError/ValueError naming the bad argument; return the parsed compression."""
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
    # Parsed where the reducer reads it (ValueError for an unknown name), before any collective.
    compression = C.ReducerOptions(compression=compression).compression
    if not (isinstance(backward_passes_per_step, int) and backward_passes_per_step >= 1):
        raise ValueError(
            f"backward_passes_per_step must be an int >= 1, got {backward_passes_per_step!r}"
        )
    if check_every is not None and not (
        isinstance(check_every, int) and not isinstance(check_every, bool) and check_every >= 0
    ):
        raise ValueError(
            f"check_every must be None, 0 (no check at all) or an int >= 1, got {check_every!r}"
        )
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
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
    return compression


# Sizes in bytes stay below this (the compiled plan takes int64, and sums of them must fit).
_LIMIT = 1 << 62


def byte_size(
    name: str, value, scale: int = 1, none: int | None = None, owner: str = "DistributedOptimizer"
) -> int:
    """``value * scale`` bytes as an int in [0, 2**62): ``none`` for None where None is
    allowed; TypeError or ValueError naming ``name`` otherwise. Checked with the other
    arguments, before the first collective, so that a size one rank alone cannot hold raises
    on every rank.

    >>> byte_size("bucket_cap_mb", 0.5, 1 << 20), byte_size("direct_min_bytes", None, none=7)
    (524288, 7)
    """
    if value is None and none is not None:
        return none
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}({name}=...) takes a number, got {type(value).__name__}")
    if not (value >= 0 and value * scale < _LIMIT):  # NaN fails here too
        raise ValueError(
            f"{owner}({name}={value!r}): expected a size >= 0 and below {_LIMIT // scale}"
        )
    return int(value * scale)
