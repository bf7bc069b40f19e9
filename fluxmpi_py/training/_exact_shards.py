"""The exact sum of one backward pass a step on every rank (``DistributedOptimizer(
deterministic=True)`` with ``backward_passes_per_step=1`` everywhere), moved as floats: the same integers, and bits, as the
int64 path of :mod:`.exact_sum` (whose docstring has the grid and the error bound), at a
float allreduce's traffic.

Each bucket is one flat buffer of its parameters' dtype, padded to a multiple of the world
size W and cut into W equal shards; rank r owns shard r. During backward each gradient is
copied into its place; a complete bucket is queued on the engine thread as one item of work
(``C.exact_shard_bucket``): every owner gets all W ranks' values of its shard (on one host
straight from a shared-memory window that each rank writes its bucket into, elsewhere by an
alltoall) and runs one compiled pass per (parameter, shard) segment, with that parameter's
grid: each rank's value rounded onto the grid as the int64 path rounds it, the W integers
added (exact: any order gives the same sum; in float64 where every partial sum is an integer
below 2**53, else in int64), converted back once as the int64 path converts its sum, and the
largest |g| read; every rank then copies the owners' results back into the flat buffer (from
the window, or by an allgather), and at ``step()`` each ``p.grad`` is a view of it. So the
owner's pass and the copies back of a bucket run while backward computes the next ones; the
engine runs its work in submission order, and buckets start in bucket order, so every rank
issues the same collectives in the same order. The buffers are made once and reused every
step.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from .._core import C
from ..runtime.groups import on_group
from .exact_sum import ExactGradientSum, ExactSum, larger, plain_gradient_of, plan_exact_buckets

#: False: every step goes through the int64 path (tests compare the two paths with it).
SHARDS_AT_ONE_PASS = True


def exact_sum_for(
    order: Sequence[torch.Tensor],
    names: Sequence[str],
    options: C.ReducerOptions,
    *,
    passes_per_step: int,
    micro_batches: int,
    group,
) -> ExactSum:
    """The exact sum for ``passes_per_step`` backward passes a step on this rank and
    ``micro_batches`` on all ranks together, over ``group`` (None: the world; this rank is a
    member), with the reduction's ``options`` (``C.ReducerOptions``: its buckets' limits and
    its op): the sharded float one when every rank runs one pass (``micro_batches`` is the
    world size; unless :data:`SHARDS_AT_ONE_PASS` is False), else the int64 one. Every rank
    chooses from the same agreed numbers, hence the same path."""
    world = C.size() if group is None else group.size
    rank = C.rank() if group is None else int(group.rank)
    if micro_batches == world and SHARDS_AT_ONE_PASS:
        return ShardedExactSum(order, names, world=world, rank=rank, options=options, group=group)
    return ExactGradientSum(
        order,
        names,
        passes_per_step=passes_per_step,
        micro_batches=micro_batches,
        options=options,
        group=group,
    )


class ShardedExactSum(ExactSum):
    """One pass a step: buckets of floats, each moved to the shards' owners, summed there in
    one fused pass (``C.exact_sum_rows``'s) and moved back, as one item of engine work."""

    def __init__(
        self,
        order: Sequence[torch.Tensor],
        names: Sequence[str],
        *,
        world: int,
        rank: int,
        options: C.ReducerOptions,
        group,
    ):
        # buckets of the parameters' own dtypes: they travel as floats
        plan = plan_exact_buckets(order, options, int64=False)
        super().__init__(
            order, names, plan, passes_per_step=1, micro_batches=world,
            average=options.op == "average", group=group,
        )  # fmt: skip
        self.flats: list[torch.Tensor] = []  # per bucket, W shards; the result after step()
        # per bucket, the ranks' values of this rank's shard (without shared memory; untouched,
        # hence never paged in, with it)
        self.rows: list[torch.Tensor] = []
        self.most: list[torch.Tensor] = []  # per bucket, float64: each segment's largest |g|
        self.plans: list[int] = []  # per bucket, the hash of its shapes the ranks compare
        self.at = [0] * len(self.order)  # parameter i's offset in its bucket
        # per bucket: (parameter, start, end) of the segments of this rank's shard, in shard
        # coordinates
        self.segments: list[list[tuple[int, int, int]]] = []
        for members in self.buckets:
            numel = sum(self.order[i].numel() for i in members)
            shard = -(-numel // world)
            dtype = self.order[members[0]].dtype
            self.flats.append(torch.zeros(shard * world, dtype=dtype))
            self.rows.append(torch.empty(shard * world, dtype=dtype))
            lo, hi = rank * shard, (rank + 1) * shard
            at, mine = 0, []
            for i in members:
                self.at[i] = at
                end = at + self.order[i].numel()
                if max(at, lo) < min(end, hi):
                    mine.append((i, max(at, lo) - lo, min(end, hi) - lo))
                at = end
            self.segments.append(mine)
            self.most.append(torch.empty(len(mine), dtype=torch.float64))
            shapes = f"{len(self.plans)}:{dtype}:{[tuple(self.order[i].shape) for i in members]}"
            self.plans.append(zlib.crc32(shapes.encode()))

    def _reset_step(self) -> None:
        super()._reset_step()
        # per parameter, this step's gradient when it is reduced where it lies (else None: it
        # was copied into the bucket's flat buffer)
        self.kept: list[torch.Tensor | None] = [None] * len(self.order)
        self.kept_at: set[int] = set()  # their data pointers: no two pieces may overlap

    def _view(self, i: int) -> torch.Tensor:
        b, at = self.bucket_of[i], self.at[i]
        return self.flats[b][at : at + self.order[i].numel()]

    def _take(self, i: int, g: torch.Tensor) -> None:
        """Keep the gradient as its own piece of the bucket, reduced in place (no copy), when
        it is a plain tensor of its own: contiguous, of p's dtype and shape, on the CPU, the
        whole of its storage and no other piece's; else copy it into the flat buffer."""
        own = (
            plain_gradient_of(g, self.order[i])
            and g.storage_offset() == 0
            and g.untyped_storage().nbytes() == g.numel() * g.element_size()
            and g.data_ptr() not in self.kept_at
        )
        g = g.detach()
        old = self.kept[i]
        if old is not None:  # a second pass before step() (which then raises)
            self.kept_at.discard(old.data_ptr())
        if own and g.numel() > 0:
            self.kept[i] = g.view(-1)
            self.kept_at.add(g.data_ptr())
        else:
            self.kept[i] = None
            self._view(i).copy_(g.reshape(-1))

    def _start(self, b: int) -> None:
        pieces = []
        for i in self.buckets[b]:
            kept = self.kept[i]
            if kept is None:
                view = self._view(i)
                if not self.written[i]:  # no gradient this step on this rank: adds nothing
                    view.zero_()
                pieces.append(view)
            else:
                pieces.append(kept)
        flat = self.flats[b]
        used = sum(self.order[i].numel() for i in self.buckets[b])
        if used < flat.numel():
            pieces.append(flat[used:])  # the padding (zeros)
        segments = [(lo, hi, *self.scaling(i)) for i, lo, hi in self.segments[b]]
        label = f"deterministic gradient bucket {b + 1} of {len(self.buckets)}"
        with on_group(self.group, "DistributedOptimizer(deterministic=True)"):
            self.requests.append(
                C.exact_shard_bucket(
                    b, self.plans[b], pieces, flat, self.rows[b], self.most[b], segments, label
                )
            )

    def _complete(self) -> list[float]:
        """Wait for every bucket; returns the largest |g| of each parameter over the values
        this rank summed (-1: none)."""
        most = [-1.0] * len(self.order)
        failed = []
        for work in self.requests:  # all of them: none may still use the buffers next step
            try:
                work.wait()
            except Exception as e:  # a disagreement: raised on every rank
                failed.append(e)
        if failed:
            self._reset_step()
            raise failed[0]
        for b in range(len(self.buckets)):
            for (i, _, _), found in zip(self.segments[b], self.most[b].tolist()):
                most[i] = larger(most[i], found)
        return most

    def _result(self, i: int) -> torch.Tensor:
        kept = self.kept[i]
        return (self._view(i) if kept is None else kept).view(self.order[i].shape)
