"""How the ranks of a DistributedOptimizer share a step's micro-batches, when their
``backward_passes_per_step`` differ (the global-batch sampler deals the first ``M mod W`` ranks
one micro-batch more where the world size W does not divide the step's M micro-batches).

The exact sums (``deterministic=True``) need M itself: their grid and their average count
micro-batches, not ranks, so any dealing gives the same integers. The default path averages
over ranks: a rank that divides each micro-batch's loss by its own k (the mean over its
micro-batches, as with an even share) is weighed by ``k * W / M`` before the reduction, so
that the average is the mean over all M micro-batches (every one weighs ``1/M``), as one
process running them would take it.
"""

from __future__ import annotations

import torch

from .._core import C
from ..collectives.inplace import allreduce_


def micro_batch_share(passes_per_step: int, group) -> tuple[int, float, bool]:
    """(M: every rank's ``passes_per_step`` summed, this rank's weight ``k * W / M``, whether
    every rank passes the same k) over ``group`` (None: the world): two 8- and 16-byte
    allreduces, collectives of its ranks. The weight is 1 where every rank passes the same k.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> micro_batch_share(3, None) == (3 * fm.total_workers(), 1.0, True)
    True
    """
    world = C.size() if group is None else group.size
    total = torch.tensor([passes_per_step], dtype=torch.int64)
    allreduce_(total, "sum", group=group)
    extremes = torch.tensor([passes_per_step, -passes_per_step], dtype=torch.int64)
    allreduce_(extremes, "max", group=group)  # the largest k and minus the smallest
    micro_batches = int(total)
    even = int(extremes[0]) == -int(extremes[1])
    return micro_batches, passes_per_step * world / micro_batches, even
