"""DistributedOptimizer's argument checks, all made before its first collective."""

from __future__ import annotations

import torch

from .._core import C


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
        raise TypeError(
            f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if op not in ("sum", "average", "avg", "mean"):
        raise ValueError(f"DistributedOptimizer(op={op!r}): expected 'average' or 'sum'")
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
