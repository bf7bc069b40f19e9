"""The exact sum of one backward pass a step (``DistributedOptimizer(deterministic=True)``
with ``backward_passes_per_step=1``), moved as floats: the same integers, and bits, as the
int64 path of :mod:`.exact_sum` (whose docstring has the grid and the error bound), at a
float allreduce's traffic.

Each bucket is one flat buffer of its parameters' dtype, padded to a multiple of the world
size W and cut into W equal shards; rank r owns shard r. During backward each gradient is
copied into its place; a complete bucket starts an alltoall that gives every owner all W
ranks' values of its shard. At ``step()`` the owner runs one compiled pass per (parameter,
shard) segment, with that parameter's grid: each rank's value rounded onto the grid as the
int64 path rounds it, the W integers added (exact: any order gives the same sum), converted
back once as the int64 path converts its sum, and the largest |g| read. An allgather of the
owners' results gives every rank the whole bucket, and each ``p.grad`` is a view of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._core import C
from ..collectives.rows import Iallgather, Ialltoall
from .exact_sum import ExactGradientSum, ExactSum, larger, plan_buckets

#: False: every step goes through the int64 path (tests compare the two paths with it).
SHARDS_AT_ONE_PASS = True


def exact_sum_for(
    order: Sequence[torch.Tensor],
    names: Sequence[str],
    *,
    passes_per_step: int,
    average: bool,
    cap_bytes: int,
    group,
) -> ExactSum:
    """The exact sum for ``passes_per_step`` backward passes a step over ``group`` (None: the
    world; this rank is a member): the sharded float one at one pass (unless
    :data:`SHARDS_AT_ONE_PASS` is False), else the int64 one."""
    world = C.size() if group is None else group.size
    rank = C.rank() if group is None else int(group.rank)
    if passes_per_step == 1 and SHARDS_AT_ONE_PASS:
        return ShardedExactSum(
            order, names, world=world, rank=rank, average=average, cap_bytes=cap_bytes, group=group
        )
    return ExactGradientSum(
        order, names, passes_per_step=passes_per_step, world=world, average=average,
        cap_bytes=cap_bytes, group=group,
    )  # fmt: skip


class ShardedExactSum(ExactSum):
    """One pass a step: buckets of floats, alltoall to the shards' owners, one fused pass
    there (``C.exact_sum_rows``), allgather back."""

    def __init__(
        self,
        order: Sequence[torch.Tensor],
        names: Sequence[str],
        *,
        world: int,
        rank: int,
        average: bool,
        cap_bytes: int,
        group,
    ):
        buckets = plan_buckets(order, cap_bytes, lambda p: p.element_size())
        super().__init__(
            order, names, buckets, passes_per_step=1, world=world, average=average, group=group
        )
        self.world, self.rank = world, rank
        self.flats: list[torch.Tensor] = []  # per bucket, padded to shards of `shard` values
        self.shard: list[int] = []
        self.at = [0] * len(self.order)  # parameter i's offset in its bucket
        # per bucket: (parameter, start, end) of the segments of this rank's shard, in shard
        # coordinates
        self.segments: list[list[tuple[int, int, int]]] = []
        for members in self.buckets:
            numel = sum(self.order[i].numel() for i in members)
            shard = -(-numel // world)
            self.flats.append(torch.zeros(shard * world, dtype=self.order[members[0]].dtype))
            self.shard.append(shard)
            lo, hi = rank * shard, (rank + 1) * shard
            at, mine = 0, []
            for i in members:
                self.at[i] = at
                end = at + self.order[i].numel()
                if max(at, lo) < min(end, hi):
                    mine.append((i, max(at, lo) - lo, min(end, hi) - lo))
                at = end
            self.segments.append(mine)
        self.gathered: list[torch.Tensor] = []

    def _view(self, i: int) -> torch.Tensor:
        b, at = self.bucket_of[i], self.at[i]
        return self.flats[b][at : at + self.order[i].numel()]

    def _take(self, i: int, g: torch.Tensor) -> None:
        self._view(i).copy_(g.detach().reshape(-1))

    def _start(self, b: int) -> None:
        for i in self.buckets[b]:  # no gradient this step on this rank: adds nothing
            if not self.written[i]:
                self._view(i).zero_()
        self.requests.append(Ialltoall(self.flats[b], group=self.group))

    def _complete(self) -> list[float]:
        """Each bucket: wait for its shard, sum it (the result over this rank's own row of
        the received values), start its allgather; then wait for all. Returns the largest
        |g| of each parameter over the values this rank summed (-1: none)."""
        most = [-1.0] * len(self.order)
        gathers = []
        for b, request in enumerate(self.requests):
            rows = request.wait().view(self.world, self.shard[b])
            for i, lo, hi in self.segments[b]:
                scale, bound, divisor = self.scaling(i)
                found = C.exact_sum_rows(
                    rows[:, lo:hi], rows[self.rank, lo:hi], scale, bound, divisor
                )
                most[i] = larger(most[i], found)
            gathers.append(Iallgather(rows[self.rank], group=self.group))
        self.gathered = [g.wait() for g in gathers]
        return most

    def _result(self, i: int) -> torch.Tensor:
        b, at = self.bucket_of[i], self.at[i]
        p = self.order[i]
        return self.gathered[b][at : at + p.numel()].view(p.shape)

    def _reset_step(self) -> None:
        super()._reset_step()
        self.gathered = []
