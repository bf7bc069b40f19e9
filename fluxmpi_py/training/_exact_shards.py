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

With k backward passes a step (``backward_passes_per_step=k``), every pass moves its bucket
to the owners in the same way, and each owner adds the ranks' values into its own exact sums
of its shard (``C.exact_shard_bucket(..., acc=...)``: float64 integers per block of 2048
values while that is exact, else int64); only the last pass converts them, once, and sends
the results back. Pass p's gradients are copied into one of two buffers per bucket (p % 2),
so a pass never writes where the previous pass's bucket may still be read.
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
#: The most backward passes a step that take the sharded path; more take the int64 path (the
#: same bits). Each pass moves its buckets here, where the int64 path moves one int64 bucket a
#: step: on a quiet VM (2 ranks, ResNet-50's shapes, two launches) k = 2 was 1.68-1.82x the
#: default step through the sharded path against 1.42-1.50x through the int64 path, so only
#: k = 1 takes it (docs/measurements.md). Tests raise it to run the k-pass sharded path.
SHARDED_MAX_PASSES = 1


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
    every pass's bucket is moved and added into the owners' exact sums, and the last pass
    converts and moves back."""

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
        self.flats: list[torch.Tensor] = []  # per bucket, W shards; the result after step()
        # k > 1: per bucket, the second buffer (odd passes), the owner's exact sums of its
        # shard (int64 storage) and their blocks' state
        self.spares: list[torch.Tensor] = []
        self.accs: list[torch.Tensor] = []
        self.bounds: list[torch.Tensor] = []
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
            if self.k > 1:
                self.spares.append(torch.zeros(shard * world, dtype=dtype))
                self.accs.append(torch.empty(shard, dtype=torch.int64))
                self.bounds.append(
                    torch.empty(C.exact_accumulator_blocks(shard), dtype=torch.float64)
                )
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
        self.works: list = []  # every bucket started this step, all passes, in order
        self.failed: list[Exception] = []  # raised while waiting for a buffer (at step())
        # per bucket and buffer, the last work that reads it (k > 1: a pass waits for it)
        self.reading: dict[tuple[int, int], C.Work] = {}
        self._reset_pass()
        self.last_kept = self.kept

    def _reset_pass(self) -> None:
        self.missing = [len(m) for m in self.buckets]  # members not yet ready in this pass
        self.requests = []  # this pass's started buckets, in bucket order
        self.now = [False] * len(self.order)  # a gradient in this pass
        # per parameter, this pass's gradient when it is reduced where it lies (else None: it
        # was copied into the bucket's flat buffer)
        self.kept: list[torch.Tensor | None] = [None] * len(self.order)
        self.kept_at: set[int] = set()  # their data pointers: no two pieces may overlap

    def _buffer(self, b: int, p: int | None = None) -> torch.Tensor:
        """Bucket ``b``'s flat buffer for pass ``p`` (this one by default)."""
        p = self.passes if p is None else p
        return self.spares[b] if p % 2 else self.flats[b]

    def _free(self, b: int) -> None:
        """Before this pass writes into bucket ``b``'s buffer: wait for the work of two passes
        ago that reads it (done long since, as a rule; a no-op once done in a pass)."""
        work = self.reading.pop((b, self.passes % 2), None)
        if work is not None:
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - a disagreement: raised at step()
                self.failed.append(e)

    def _view(self, i: int, p: int | None = None) -> torch.Tensor:
        b, at = self.bucket_of[i], self.at[i]
        return self._buffer(b, p)[at : at + self.order[i].numel()]

    # ---- during backward: every pass (k > 1) moves its buckets ------------------------
    def add(self, i: int, last_pass: bool) -> None:
        """Take parameter ``i``'s gradient of this pass off the parameter and start the
        buckets that are complete. A pass beyond the k-th is counted, not reduced (``step()``
        then raises on every rank)."""
        p = self.order[i]
        if p.grad is not None:
            if self.passes < self.k:
                self._take(i, p.grad)
                self.now[i] = True
            self.written[i] = True
            p.grad = None
        if self.passes < self.k:
            self.missing[self.bucket_of[i]] -= 1
            self._start_ready()

    def end_pass(self, last_pass: bool) -> None:
        """The end of a backward pass: start every bucket of it not started (their
        parameters had no gradient on this rank)."""
        self._finish_pass()

    def _finish_pass(self) -> None:
        if self.passes < self.k:
            while len(self.requests) < len(self.buckets):
                self._start(len(self.requests))
        if self.passes == self.k - 1:
            self.last_kept = self.kept
        self.passes += 1
        self._reset_pass()

    def _start_rest(self) -> None:
        # A rank that ran fewer passes than k (step() then raises on every rank) still moves
        # every pass's buckets, zeros where it had no gradient: the ranks' collectives pair.
        counted = self.passes
        while self.passes < self.k:
            self._finish_pass()
        self.passes = counted

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
        if self.k > 1:
            self._free(self.bucket_of[i])  # before this pass writes into the bucket's buffer
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
        if self.k > 1:
            self._free(b)  # where no gradient of this pass took the buffer yet
        pieces = []
        for i in self.buckets[b]:
            kept = self.kept[i]
            if kept is None:
                view = self._view(i)
                if not self.now[i]:  # no gradient this pass on this rank: adds nothing
                    view.zero_()
                pieces.append(view)
            else:
                pieces.append(kept)
        flat = self._buffer(b)
        used = sum(self.order[i].numel() for i in self.buckets[b])
        if used < flat.numel():
            pieces.append(flat[used:])  # the padding (zeros)
        segments = [(lo, hi, *self.scaling(i)) for i, lo, hi in self.segments[b]]
        label = f"deterministic gradient bucket {b + 1} of {len(self.buckets)}"
        several = self.k > 1
        if several:
            label += f", pass {self.passes + 1} of {self.k}"
        with on_group(self.group, "DistributedOptimizer(deterministic=True)"):
            work = C.exact_shard_bucket(
                b, self.plans[b], pieces, flat, self.rows[b], self.most[b], segments, label,
                acc=self.accs[b] if several else None,
                bounds=self.bounds[b] if several else None,
                first=self.passes == 0,
                last=self.passes == self.k - 1,
            )  # fmt: skip
        self.requests.append(work)
        self.works.append(work)
        if self.k > 1:
            self.reading[(b, self.passes % 2)] = work

    def _complete(self) -> list[float]:
        """Wait for every bucket; returns the largest |g| of each parameter over the values
        this rank summed (-1: none)."""
        most = [-1.0] * len(self.order)
        failed = self.failed
        for work in self.works:  # all of them: none may still use the buffers next step
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
        kept = self.last_kept[i]
        view = self._view(i, self.k - 1)
        return (view if kept is None else kept).view(self.order[i].shape)
