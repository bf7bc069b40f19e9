"""The end of a ``DistributedOptimizer(deterministic=True)`` step around the exact sums
(:mod:`.exact_sum`, :mod:`._exact_shards`): the module's buffers and the checks that every
rank ran the step as planned, agreed in the sums' own final allreduce."""

from __future__ import annotations

import torch

from ..runtime.agreement import mark_raised_on_every_rank
from ._batchnorm_fold import BatchNormFold
from .buffers import BufferSync


def deterministic_buffers(
    module: torch.nn.Module, group
) -> tuple[BatchNormFold, BufferSync | None]:
    """``module``'s buffers at any world size: BatchNorm statistics folded in the global
    micro-batch order, and the others taken from rank 0 (world-size independent only if
    forward leaves them alone); None where every buffer is a BatchNorm's."""
    fold = BatchNormFold(module, group)
    folded = {id(b) for m in fold.mods for b in m.buffers(recurse=False)}
    others = None
    if any(id(b) not in folded for b in module.buffers()):
        others = BufferSync(module, "broadcast", "DistributedOptimizer(module=...)")
    return fold, others


def finish_exact_step(exact, bn_fold: BatchNormFold | None, requires_grad_changed: bool) -> None:
    """Finish the exact sums, with two more values in their agreement: did a parameter's
    requires_grad change on some rank, and how many training forwards each BatchNorm ran
    against this rank's passes (ranks may hold different numbers of micro-batches); then fold
    the BatchNorm statistics. Either fault raises ValueError on every rank."""
    fewest, most = bn_fold.forwards() if bn_fold is not None else (exact.k, exact.k)
    changed, more, fewer = exact.finish(
        [float(requires_grad_changed), most - exact.k, exact.k - fewest]
    )
    if changed:
        raise mark_raised_on_every_rank(
            ValueError(
                "DistributedOptimizer(deterministic=True): a parameter's requires_grad "
                "changed after construction on some rank; build the optimizer again "
                "after freezing or unfreezing parameters"
            )
        )
    if bn_fold is not None and bn_fold.mods:
        if more > 0 or fewer > 0:
            raise mark_raised_on_every_rank(
                ValueError(
                    f"DistributedOptimizer(deterministic=True, module=...): every "
                    f"BatchNorm must run one training forward per micro-batch (a rank's "
                    f"backward_passes_per_step, here {exact.k}) per step on every rank; they "
                    f"ran up to {max(more, 0):g} more and {max(fewer, 0):g} fewer"
                )
            )
        bn_fold.finish(exact.micro_batches)
