"""The exact sum of ``DistributedOptimizer(deterministic=True)``, moved as floats: the same
integers, and bits, as the int64 path of :mod:`.exact_sum` (whose docstring has the grid and
the error bound), at a float allreduce's traffic per backward pass.

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

With k backward passes a step (``backward_passes_per_step=k``), the passes before the last
move nothing: each copies its gradients into its own part of the bucket's buffer (which holds
k passes' buckets one after another, made once), and the last pass's are backward's own
tensors where they can be. In the last pass each
complete bucket moves all k passes' values to the owners in one exchange
(``C.exact_shard_bucket(..., passes=k)``), and each owner sums the k * W values of each of its
elements in the same one pass (any grouping of an exact sum gives the same integers, so the
bits of the int64 path): one exchange and one agreement a bucket a step, as at k = 1, carrying
k times the values; no accumulator is written. It holds k passes' values until the last
pass, so only k up to :data:`SHARDED_MAX_PASSES` takes it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch

from .._core import C
from ..runtime.groups import on_group
from .exact_sum import ExactGradientSum, ExactSum, larger, plain_gradient_of, plan_exact_buckets

#: False: every step goes through the int64 path (tests compare the two paths with it).
SHARDED = True
#: The most backward passes a step that take the sharded path (it keeps every pass's values
#: until the last one, in buffers made once); more take the int64 path (the same bits).
#: Measured (2 ranks, ResNet-50's shapes, docs/measurements.md): at k = 2 quicker than the
#: int64 path in every launch; at k = 4 in five launches of eight (median 1.43x the default
#: step against 1.48x, and a wider spread), so k >= 3 keeps the int64 path (less memory).
SHARDED_MAX_PASSES = 2


def exact_sum_for(
    order: Sequence[torch.Tensor],
    names: Sequence[str],
    options: C.ReducerOptions,
    *,
    passes_per_step: int,
    micro_batches: int,
    even: bool,
    group,
) -> ExactSum:
    """The exact sum for ``passes_per_step`` backward passes a step on this rank and
    ``micro_batches`` on all ranks together, over ``group`` (None: the world; this rank is a
    member), with the reduction's ``options`` (``C.ReducerOptions``: its buckets' limits and
    its op): the sharded float one when every rank runs the same k passes (``even``, agreed)
    and k is at most :data:`SHARDED_MAX_PASSES` (unless :data:`SHARDED` is False), else the
    int64 one (uneven shares among them). Every rank chooses from the same agreed numbers,
    hence the same path."""
    world = C.size() if group is None else group.size
    rank = C.rank() if group is None else int(group.rank)
    if SHARDED and even and micro_batches // world <= SHARDED_MAX_PASSES:
        return ShardedExactSum(
            order, names, passes_per_step=passes_per_step, micro_batches=micro_batches,
            world=world, rank=rank, options=options, group=group,
        )  # fmt: skip
    return ExactGradientSum(
        order,
        names,
        passes_per_step=passes_per_step,
        micro_batches=micro_batches,
        options=options,
        group=group,
    )


class ShardedExactSum(ExactSum):
    """Buckets of floats, each moved to the shards' owners, summed there in one fused pass
    (``C.exact_sum_rows``'s) and moved back, as one item of engine work; with k passes a step,
    the last pass moves every pass's values of the bucket at once."""

    def __init__(
        self,
        order: Sequence[torch.Tensor],
        names: Sequence[str],
        *,
        passes_per_step: int = 1,
        micro_batches: int,
        world: int,
        rank: int,
        options: C.ReducerOptions,
        group,
    ):
        # buckets of the parameters' own dtypes: they travel as floats
        plan = plan_exact_buckets(order, options, int64=False)
        super().__init__(
            order, names, plan, passes_per_step=passes_per_step, micro_batches=micro_batches,
            average=options.op == "average", group=group,
        )  # fmt: skip
        # per bucket, k passes' buckets of W shards each, one after another; the last pass's
        # holds the result after step()
        self.flats: list[torch.Tensor] = []
        self.sizes: list[int] = []  # per bucket, one pass's values (W shards, padded)
        # per bucket, the ranks' values of this rank's shard, each pass's (without shared
        # memory; untouched, hence never paged in, with it)
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
            self.sizes.append(shard * world)
            self.flats.append(torch.zeros(shard * world * self.k, dtype=dtype))
            self.rows.append(torch.empty(shard * world * self.k, dtype=dtype))
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
        # per pass and parameter, that pass's gradient when it is reduced where it lies (else
        # None: it was copied into the bucket's buffer, or there was none)
        self.kept: list[list[torch.Tensor | None]] = [
            [None] * len(self.order) for _ in range(self.k)
        ]
        self.now = [[False] * len(self.order) for _ in range(self.k)]  # per pass: a gradient
        self.kept_at: set[int] = set()  # their data pointers: no two pieces may overlap

    def _view(self, i: int, p: int | None = None) -> torch.Tensor:
        """Parameter ``i``'s values of pass ``p`` (this one by default) in its bucket."""
        b, at = self.bucket_of[i], self.at[i]
        at += self.sizes[b] * (self.passes if p is None else p)
        return self.flats[b][at : at + self.planned[i][0].numel()]

    # ---- during backward: the last pass moves its buckets -----------------------------
    def add(self, i: int, last_pass: bool) -> None:
        """Take parameter ``i``'s gradient of this pass off the parameter; in the step's k-th
        pass, start the buckets that are complete. A pass beyond the k-th is counted, not
        reduced (``step()`` then raises on every rank)."""
        p = self.order[i]
        if p.grad is not None:
            taken = True
            if self.passes < self.k:
                taken = self.now[self.passes][i] = self.took(i, p.grad)
            self.written[i] = self.written[i] or taken
            p.grad = None
        if self.passes == self.k - 1:
            self.missing[self.bucket_of[i]] -= 1
            self._start_ready()

    def end_pass(self, last_pass: bool) -> None:
        """The end of a backward pass; after the k-th, start every bucket not started (their
        parameters had no gradient on this rank)."""
        if self.passes == self.k - 1:
            self._start_rest()
        self.passes += 1

    def _take(self, i: int, g: torch.Tensor) -> None:
        """In the step's last pass, keep the gradient as its own piece of the bucket, reduced
        in place (no copy), when it is a plain tensor of its own: contiguous, of p's dtype and
        shape, on the CPU, the whole of its storage and no other piece's; else, and in every
        pass before the last, copy it into the bucket's buffer. (Backward's fresh tensors held
        across passes kept up to k - 1 passes' gradients in memory that the allocator gave
        back between steps: paged in anew every step, about 50 ms per 100 MB here, where the
        copy costs about 8: docs/measurements.md.)"""
        own = (
            self.passes == self.k - 1
            and plain_gradient_of(g, self.order[i])
            and g.storage_offset() == 0
            and g.untyped_storage().nbytes() == g.numel() * g.element_size()
            and g.data_ptr() not in self.kept_at
        )
        g = g.detach()
        if own and g.numel() > 0:
            self.kept[self.passes][i] = g.view(-1)
            self.kept_at.add(g.data_ptr())
        else:
            self._view(i).copy_(g.reshape(-1))

    def _start(self, b: int) -> None:
        """Start bucket ``b`` with every pass's values (zeros where a pass had no gradient:
        also for the passes a rank that ran fewer than k did not run; step() then raises)."""
        pieces = []
        used = sum(self.planned[i][0].numel() for i in self.buckets[b])
        for p in range(self.k):
            for i in self.buckets[b]:
                kept = self.kept[p][i]
                if kept is None:
                    view = self._view(i, p)
                    if not self.now[p][i]:  # no gradient this pass on this rank: adds nothing
                        view.zero_()
                    pieces.append(view)
                else:
                    pieces.append(kept)
            if used < self.sizes[b]:  # the padding (zeros)
                pieces.append(self.flats[b][p * self.sizes[b] + used : (p + 1) * self.sizes[b]])
        segments = [(lo, hi, *self.scaling(i)) for i, lo, hi in self.segments[b]]
        label = f"deterministic gradient bucket {b + 1} of {len(self.buckets)}"
        with on_group(self.group, "DistributedOptimizer(deterministic=True)"):
            work = C.exact_shard_bucket(
                b, self.plans[b], pieces, self.flats[b], self.rows[b], self.most[b], segments,
                label, passes=self.k,
            )  # fmt: skip
        self.requests.append(work)

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
        kept = self.kept[self.k - 1][i]
        view = self._view(i, self.k - 1)
        return (view if kept is None else kept).view(self.order[i].shape)
