"""DistributedSampler: each rank's indices of a dataset, for a DataLoader's ``sampler=``.

The shard and order rules are DistributedDataContainer's (see :mod:`fluxmpi_py.data`): the
same C++ index math, so both give a rank the same positions of the same epoch order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .._core import C
from .._util import rng as _rng
from ..runtime.entry import entry_point, local_call
from ._args import (
    _agree_across_ranks,
    _check_epoch,
    _check_range,
    _check_seed,
    _check_state,
    _dataset_length,
    _explicit_world,
    _mode,
    _world,
)
from ._global_batch import GlobalBatchIterator, _global_batches, _int_or
from .loader_check import (
    FullDatasetWarning,
    check_dataloader,
    container_in,
    double_sharding_message,
)

# the DataLoader checks (_dataloader_check.py) are public from here, beside the sampler
__all__ = ["DistributedSampler", "FullDatasetWarning", "check_dataloader"]


def _after_loader_draw(it: Iterator[int]) -> Iterator[int]:
    """``it``, for the first iterator after ``load_state_dict``: a DataLoader without
    generator= draws its base seed from torch's generator when it is iterated, one draw that a
    run never stopped did not make (the new loader over the rest of the epoch). At the first
    index asked (after that draw, with or without batch_size; on an empty rest too), where the
    generator stands exactly that draw past what load_checkpoint(rng=True) restored, it is put
    back (_util/rng.py), so dropout draws the same."""
    _rng.undo_one_draw()
    yield from it


class DistributedSampler(torch.utils.data.Sampler):
    """Drop-in for ``torch.utils.data.DistributedSampler`` that needs no ``randperm(n)`` list.

    ``DataLoader(dataset, sampler=DistributedSampler(dataset), batch_size=B)``, with
    ``set_epoch``, ``len`` and ``iter`` as torch's. Indices are computed in C++ in chunks of
    4 Ki as the iterator advances: the first comes at once and memory stays flat. Unlike
    torch's sampler (which deals positions round-robin), each rank takes a contiguous range of
    the epoch's order, as DistributedDataContainer does. ``state_dict(consumed=steps *
    batch_size)`` and ``load_state_dict`` resume mid-epoch. Which samples each rank takes,
    ``global_batch_size`` and resuming: the guide's [Data][data-guide] page.

    Args:
        dataset: the dataset, or its length as an int.
        num_replicas: the number of shards; None: ``total_workers()``.
        rank: this rank's place; None: ``local_rank()``.
        shuffle: True: each epoch's order is a permutation of ``(seed, epoch)``; False: ``0..n-1``.
        seed: the permutation's seed, the same on every rank.
        drop_last: True (overrides ``pad``): ``floor(n/p)`` samples each, the rest skipped.
        pad: True: every rank gets ``ceil(n/p)`` samples, the last wrapping around; False:
            every sample exactly once (ranks may then differ by one).
        global_batch_size: G samples per step at any world size (with ``micro_batch_size``).
        micro_batch_size: m samples per micro-batch; the ``M = G/m`` of a step are dealt in
            contiguous runs, the first ``M mod W`` ranks taking one more than the others.

    Raises:
        ValueError: for a bad size, or more ``num_replicas`` than ``G/m`` micro-batches.
        TypeError: ``dataset`` is a DistributedDataContainer already sharded.

    >>> import fluxmpi_py as fm, torch
    >>> s = fm.DistributedSampler(10, num_replicas=2, rank=1, shuffle=False)
    >>> list(s)
    [5, 6, 7, 8, 9]
    >>> s = fm.DistributedSampler(10, num_replicas=2, rank=0, seed=7)
    >>> s.set_epoch(3); len(s), len(set(s))
    (5, 5)
    >>> loader = torch.utils.data.DataLoader(torch.arange(10.0), batch_size=5, sampler=s)
    >>> sum(len(b) for b in loader)
    5
    """

    # given a good rank or num_replicas, it agrees with no rank: its errors stay its own
    @entry_point(
        "DistributedSampler()", local_if=lambda a: _explicit_world(a, "rank", "num_replicas")
    )
    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: bool = True,
        *,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        owner = "DistributedSampler"
        self._n = _dataset_length(dataset, "dataset", owner, allow_int=True)
        self.rank, self.num_replicas = _world(owner, rank, num_replicas, "rank", "num_replicas")
        container = container_in(dataset)
        if container is not None and container.world_size > 1 and self.num_replicas > 1:
            raise TypeError(double_sharding_message(owner, container, owner, self.num_replicas))
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = _check_seed(seed, owner)
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.epoch = 0
        self._mode = _mode(pad, drop_last)
        self.batches, error = _global_batches(
            self._n, global_batch_size, micro_batch_size, self.rank, self.num_replicas, owner
        )
        if error is not None:  # this rank's own: the entry rule makes it every rank's verdict
            raise error
        _agree_across_ranks(
            owner,
            rank is not None or num_replicas is not None,
            n=self._n,
            seed=self.seed,
            shuffle=self.shuffle,
            mode=("pad", "drop_last", "even").index(self._mode),
            global_batch_size=_int_or(global_batch_size),
            micro_batch_size=_int_or(micro_batch_size),
        )
        if self.batches is not None:
            self.num_samples = self.batches.length
            self.total_size = self.batches.steps * self.batches.global_batch_size
        else:
            self.num_samples = C.shard_range(self._n, self.num_replicas, self.rank, self._mode)[1]
            # torch's attribute: positions dealt out over all ranks this epoch
            self.total_size = (
                self._n if self._mode == "even" else self.num_samples * self.num_replicas
            )
        self._resume = 0  # start of the next iterator (load_state_dict), then 0
        self._loaded = False  # load_state_dict, its next iterator not made yet (__iter__)
        self._first = 0  # start of the latest iterator
        self._last: C.ShardIterator | GlobalBatchIterator | int | None = (
            None  # the latest iterator (read .position), or its position once pickled
        )

    def _spec(self) -> tuple[int, int, int, str, bool, int, int]:
        # Read at each iterator, as torch does, so attributes set directly are honoured.
        return (
            self._n,
            self.num_replicas,
            self.rank,
            self._mode,
            bool(self.shuffle),
            _check_seed(self.seed, "DistributedSampler"),
            _check_epoch(self.epoch, "DistributedSampler"),
        )

    def __len__(self) -> int:
        return self.num_samples - self._resume

    def __iter__(self) -> Iterator[int]:
        spec = self._spec()
        self._first, self._resume = self._resume, 0
        it: GlobalBatchIterator | C.ShardIterator
        if self.batches is not None:
            n, _, _, _, shuffle, seed, epoch = spec
            it = GlobalBatchIterator(self.batches, shuffle, seed, epoch, self._first)
        else:
            # A C iterator: indices are computed in chunks of 4 Ki and handed out as ints
            # without a Python frame per index; its .position says exactly how far the consumer
            # got.
            it = C.shard_iter(*spec, self._first, self.num_samples)
        self._last = it
        if self._loaded:
            self._loaded = False
            return _after_loader_draw(it)
        return it

    def _position(self) -> int:
        if self._last is None:
            return self._resume
        return self._last if isinstance(self._last, int) else self._last.position

    def __getstate__(self) -> dict:
        # The live iterator does not pickle; its position does.
        state = dict(self.__dict__)
        state["_last"] = None if self._last is None else self._position()
        return state

    @local_call
    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation; a new epoch starts at position 0.

        Args:
            epoch: the epoch, the same on every rank; it picks the permutation with ``seed``.

        >>> import fluxmpi_py as fm
        >>> s = fm.DistributedSampler(8, num_replicas=1, rank=0)
        >>> s.set_epoch(1); first = list(s); s.set_epoch(2); first != list(s)
        True
        """
        epoch = _check_epoch(epoch, "DistributedSampler.set_epoch")
        if epoch != self.epoch:
            self._resume, self._first, self._last = 0, 0, None
        self.epoch = epoch

    @local_call
    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        """``{"epoch", "seed", "position", "n", "world_size"}`` for resuming.

        ``position`` is how far the latest iterator got; with ``consumed``, it is where that
        iterator started plus ``consumed`` (the samples your loop took from it).

        Args:
            consumed: the samples your loop has taken this epoch (``steps * batch_size``),
                since a DataLoader reads ahead; None: those delivered so far.

        >>> import fluxmpi_py as fm
        >>> s = fm.DistributedSampler(10, num_replicas=2, rank=0)
        >>> it = iter(s); _ = next(it), next(it); s.state_dict()["position"]
        2
        """
        owner = "DistributedSampler.state_dict"
        if consumed is None:
            position = self._position()
        else:
            base = self._resume if self._last is None else self._first
            consumed = _check_range(
                consumed,
                "consumed",
                owner,
                0,
                self.num_samples - base + 1,
                f"{self.num_samples - base}]",
            )
            position = base + consumed
        return {
            "epoch": _check_epoch(self.epoch, owner),
            "seed": _check_seed(self.seed, owner),
            "position": position,
            "n": self._n,
            "world_size": self.num_replicas,
        }

    @local_call
    def load_state_dict(self, state: dict[str, int]) -> None:
        """Make the next iterator continue at ``state``'s epoch, seed and position.

        Args:
            state: what ``state_dict`` returned (its ``n`` and ``world_size`` must match).

        >>> import fluxmpi_py as fm
        >>> s = fm.DistributedSampler(10, num_replicas=2, rank=1, shuffle=False)
        >>> s.load_state_dict({"epoch": 0, "seed": 0, "position": 3}); list(s)
        [8, 9]
        """
        s = _check_state(state, "DistributedSampler", self._n, self.num_replicas, self.num_samples)
        self.epoch, self.seed, self._resume = s["epoch"], s["seed"], s["position"]
        self._first, self._last, self._loaded = 0, None, True

    @property
    def micro_batches_per_rank(self) -> int:
        """With ``global_batch_size=``: the micro-batches this rank takes per step (``k``);
        pass it as the DistributedOptimizer's ``backward_passes_per_step``. Where the world
        size does not divide the step's micro-batches, the first ranks take one more.

        >>> import fluxmpi_py as fm
        >>> s = fm.DistributedSampler(64, num_replicas=2, rank=1, global_batch_size=16,
        ...                           micro_batch_size=4)
        >>> s.micro_batches_per_rank, len(s), s.micro_batch(0), s.micro_batch(2)
        (2, 32, (0, 2), (1, 2))
        >>> [fm.DistributedSampler(64, num_replicas=3, rank=r, global_batch_size=16,
        ...                        micro_batch_size=4).micro_batches_per_rank for r in range(3)]
        [2, 1, 1]
        """
        if self.batches is None:
            raise ValueError("DistributedSampler: micro_batches_per_rank needs global_batch_size=")
        return self.batches.per_rank

    @local_call
    def micro_batch(self, j: int) -> tuple[int, int]:
        """With ``global_batch_size=``: ``(step, index in the step's global batch)`` of this
        rank's ``j``-th micro-batch of the epoch (counting from the epoch's start).

        Args:
            j: the micro-batch's number on this rank in the epoch, from 0.

        """
        if self.batches is None:
            raise ValueError("DistributedSampler: micro_batch() needs global_batch_size=")
        return self.batches.micro_batch(j)

    def __repr__(self) -> str:
        return (
            f"DistributedSampler(n={self._n}, rank={self.rank}, num_replicas={self.num_replicas}, "
            f"len={len(self)}, mode={self._mode!r}, shuffle={self.shuffle}, seed={self.seed}, "
            f"epoch={self.epoch})"
        )
