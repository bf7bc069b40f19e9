"""The global-batch mode of DistributedSampler and DistributedDataContainer
(``global_batch_size=G, micro_batch_size=m``): which samples a rank takes, whatever the world
size.

Each epoch has one order of the n indices (the permutation of ``(seed, epoch)``, computed as
for a world of one, so it does not depend on the world size). Step s's global batch is
positions ``[s*G, (s+1)*G)`` of that order, cut into ``M = G/m`` micro-batches of m, dealt
to the W ranks in contiguous runs: with ``M = q*W + e`` (``0 <= e < W``), the first ``e``
ranks take ``q + 1`` micro-batches of every step and the others ``q`` (rank r's run starts at
micro-batch ``r*q + min(r, e)``), so that rank order is the global micro-batch order. An even
share (W divides M) is the case ``e = 0``. The last ``n mod G`` positions of the order are
left out of the epoch (no short step). More ranks than micro-batches (``W > M``) would leave
a rank none, with no backward pass to take part in a step: a ValueError, naming the largest
world size that works; every rank computes it the same way, so every rank raises it.
"""

from __future__ import annotations

from typing import Any

from .._core import C
from ._args import _check_range


def deal(micro_batches: int, world: int, rank: int) -> tuple[int, int]:
    """(first, count): the run of a step's ``micro_batches`` that ``rank`` of ``world`` takes
    (the module docstring's dealing: the first ``micro_batches mod world`` ranks one more).

    >>> [deal(8, 3, r) for r in range(3)]
    [(0, 3), (3, 3), (6, 2)]
    """
    q, e = divmod(micro_batches, world)
    return rank * q + min(rank, e), q + (rank < e)


class GlobalBatches:
    """The index math of the global-batch mode for one rank (see the module docstring)."""

    __slots__ = (
        "n",
        "global_batch_size",
        "micro_batch_size",
        "rank",
        "world",
        "micro_batches",
        "first",
        "per_rank",
        "steps",
    )

    def __init__(
        self,
        n: int,
        global_batch_size: Any,
        micro_batch_size: Any,
        rank: int,
        world: int,
        owner: str,
    ):
        big = (1 << 62) + 1
        G = _check_range(global_batch_size, "global_batch_size", owner, 1, big, "2**62]")
        m = _check_range(micro_batch_size, "micro_batch_size", owner, 1, big, "2**62]")
        if G % m:
            raise ValueError(
                f"{owner}: global_batch_size={G} must be a multiple of micro_batch_size={m} "
                f"(a global batch is cut into whole micro-batches)"
            )
        M = G // m
        if M < world:
            raise ValueError(
                f"{owner}: global_batch_size={G} is {M} micro-batches of micro_batch_size={m}, "
                f"fewer than the {world} ranks (rank {rank} of {world}): every rank needs at "
                f"least one micro-batch a step; use at most {M} ranks, or a smaller "
                f"micro_batch_size"
            )
        self.n, self.global_batch_size, self.micro_batch_size = n, G, m
        self.rank, self.world = rank, world
        self.micro_batches = M  # per step, over all ranks
        # this rank's micro-batches of a step: first .. first+per_rank-1 (per_rank: k)
        self.first, self.per_rank = deal(M, world, rank)
        self.steps = n // G  # per epoch

    @property
    def length(self) -> int:
        """This rank's samples per epoch."""
        return self.steps * self.per_rank * self.micro_batch_size

    def position(self, i: int) -> int:
        """The position in the epoch's order of this rank's ``i``-th sample of the epoch."""
        span = self.per_rank * self.micro_batch_size
        step, offset = divmod(i, span)
        return step * self.global_batch_size + self.first * self.micro_batch_size + offset

    def micro_batch(self, j: int) -> tuple[int, int]:
        """(step, index of the micro-batch in the step's global order) of this rank's
        ``j``-th micro-batch of the epoch."""
        step, within = divmod(j, self.per_rank)
        return step, self.first + within

    def indices(self, shuffle: bool, seed: int, epoch: int, start: int, count: int) -> list[int]:
        """The dataset indices of this rank's samples ``start .. start+count-1``."""
        out: list[int] = []
        span = self.per_rank * self.micro_batch_size
        i, end = start, start + count
        while i < end:
            take = min(end, (i // span + 1) * span) - i  # up to the end of this step's block
            got = C.shard_indices(
                self.n, 1, 0, "even", shuffle, seed, epoch, self.position(i), take
            )
            out.extend(got.tolist())
            i += take
        return out


class GlobalBatchIterator:
    """This rank's indices from ``start`` on, a step's block at a time; ``position`` says
    how far the consumer got (as the C iterator of the per-rank mode does)."""

    def __init__(self, batches: GlobalBatches, shuffle: bool, seed: int, epoch: int, start: int):
        self._b, self._args = batches, (shuffle, seed, epoch)
        self.position = start
        self._chunk: list[int] = []
        self._at = 0

    def __iter__(self) -> GlobalBatchIterator:
        return self

    def __next__(self) -> int:
        if self._at == len(self._chunk):
            left = self._b.length - self.position
            if left <= 0:
                raise StopIteration
            span = self._b.per_rank * self._b.micro_batch_size
            take = min(left, span - self.position % span)
            self._chunk, self._at = self._b.indices(*self._args, self.position, take), 0
        self._at += 1
        self.position += 1
        return self._chunk[self._at - 1]


def _int_or(value, other: int = -1) -> int:
    """``value`` when it is an int (for the cross-rank agreement), else ``other``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else other


def _global_batches(n, global_batch_size, micro_batch_size, rank, world, owner):
    """(the global-batch mode's index math or None without it, the error of bad arguments):
    the error is raised after the ranks agree on the arguments, so it is every rank's."""
    if global_batch_size is None and micro_batch_size is None:
        return None, None
    try:
        if global_batch_size is None or micro_batch_size is None:
            raise ValueError(f"{owner}: pass global_batch_size= and micro_batch_size= together")
        return GlobalBatches(n, global_batch_size, micro_batch_size, rank, world, owner), None
    except (TypeError, ValueError) as e:
        return None, e
