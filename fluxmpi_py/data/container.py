"""Each rank's shard of a dataset: DistributedDataContainer (DistributedSampler, for a
DataLoader's ``sampler=``, is in :mod:`fluxmpi_py.sampler` and follows the same rules).

An epoch's *order* is the n indices of the dataset, either ``0..n-1`` or (``shuffle=True``) a
permutation that depends only on ``(seed, epoch)``, so it is the same on every rank. Rank r of
p takes a contiguous range of *positions* in that order:

* ``pad=True`` (default): ``ceil(n/p)`` positions each; the last ranks wrap around to the start
  of the order, so every rank runs the same number of steps.
* ``drop_last=True`` (overrides ``pad``): ``floor(n/p)`` each; the last ``n mod p`` positions
  of the order are skipped this epoch.
* ``pad=False``: every sample exactly once; ranks ``r < n mod p`` take one more. Ranks then
  run different numbers of steps: a per-step collective (such as the DistributedOptimizer's
  gradient reduction) hangs on the ranks that still have a step to go. Use it for evaluation
  or with loops that stop at the same step count on every rank.

The index math (shard ranges and a keyed Feistel permutation evaluated per index) lives in
C++ and keeps no state, so memory does not grow with n and these objects hold only integers
and a reference to the data: they pickle for DataLoader workers. The container's epoch, seed
and resume position sit in shared memory (``SharedInts``), so its copies in persistent
DataLoader workers follow ``set_epoch`` and ``load_state_dict``.

Resuming: ``state_dict()`` holds ``epoch``, ``seed`` and ``position``, the number of samples
of this rank's shard already delivered in that epoch (plus ``n`` and ``world_size``, checked on
load). After ``load_state_dict`` the object continues at exactly that position.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from .._core import C
from .._util import rng as _rng
from .._util.shared_view import SharedInts
from ..runtime.entry import entry_point, local_call
from ..runtime.groups import on_group
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

__all__ = ["DistributedDataContainer"]


class DistributedDataContainer(torch.utils.data.Dataset):
    """This rank's shard of ``data``, as a map-style torch Dataset.

    ``DataLoader(DistributedDataContainer(dataset, shuffle=True), batch_size=B)``: every rank
    reads its own share. ``len(container)`` is this rank's sample count; item ``i`` is
    ``data[index]`` for the ``i``-th index of the shard in this epoch's order. ``set_epoch(e)``
    picks the epoch's permutation (call it before the DataLoader iterator is created); copies
    in DataLoader workers follow it. ``state_dict(consumed=steps * batch_size)`` and
    ``load_state_dict`` resume mid-epoch. Which samples each rank takes, the same samples per
    step at any world size, and resuming: the guide's [Data][data-guide] page.

    Args:
        data: anything with ``__len__`` and ``__getitem__`` (a Dataset, list, tensor, array).
        shuffle: True: each epoch's order is a permutation of ``(seed, epoch)``; False: ``0..n-1``.
        seed: the permutation's seed, the same on every rank.
        pad: True: every rank gets ``ceil(n/p)`` samples, the last wrapping around; False:
            every sample exactly once (ranks may then differ by one).
        drop_last: True (overrides ``pad``): ``floor(n/p)`` samples each, the rest skipped.
        rank: this rank's place; None: ``local_rank()`` (or the group's).
        world_size: the number of shards; None: ``total_workers()`` (or the group's size).
        group: a [`Group`][fluxmpi_py.Group]: shard over its members; None: every rank.
        global_batch_size: G samples per step at any world size (with ``micro_batch_size``).
        micro_batch_size: m samples per micro-batch; the ``M = G/m`` of a step are dealt in
            contiguous runs, the first ``M mod W`` ranks taking one more than the others.

    Raises:
        ValueError: on every rank, for a bad size, rank or world size (more ranks than
            ``G/m`` micro-batches, too).

    >>> import fluxmpi_py as fm
    >>> shard = fm.DistributedDataContainer(list("abcdefg"), rank=1, world_size=2)
    >>> len(shard), [shard[i] for i in range(len(shard))]
    (4, ['e', 'f', 'g', 'a'])
    >>> mixed = fm.DistributedDataContainer(range(10), shuffle=True, seed=3, rank=0, world_size=2)
    >>> mixed.set_epoch(1); sorted(mixed) == sorted(mixed.indices().tolist())
    True
    """

    _n: int  # the dataset's length
    _shuffle: bool
    _mode: str  # "pad", "drop_last" or "even"

    # given a good rank= or world_size=, it agrees with no rank: its errors stay its own
    @entry_point(
        "DistributedDataContainer()",
        local_if=lambda a: a.get("group") is None and _explicit_world(a, "rank", "world_size"),
    )
    def __init__(
        self,
        data: Any,
        *,
        shuffle: bool = False,
        seed: int = 0,
        pad: bool = True,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        group=None,
        global_batch_size: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        owner = "DistributedDataContainer"
        if group is not None:
            if rank is not None or world_size is not None:
                raise ValueError(f"{owner}: pass group= or rank= and world_size=, not both")
            with on_group(group, f"{owner}()"):
                rank, world_size = group.rank, group.size
                type(self).__init__(
                    self,
                    data,
                    shuffle=shuffle,
                    seed=seed,
                    pad=pad,
                    drop_last=drop_last,
                    rank=rank,
                    world_size=world_size,
                    global_batch_size=global_batch_size,
                    micro_batch_size=micro_batch_size,
                )
                _agree_across_ranks(
                    owner,
                    False,
                    n=self._n,
                    seed=_check_seed(seed, owner),
                    shuffle=self._shuffle,
                    mode=("pad", "drop_last", "even").index(self._mode),
                    global_batch_size=_int_or(global_batch_size),
                    micro_batch_size=_int_or(micro_batch_size),
                )
            return
        if not hasattr(type(data), "__getitem__"):
            raise TypeError(
                f"{owner}: data must support data[i] (__getitem__), got {type(data).__name__}"
            )
        self._n = _dataset_length(data, "data", owner)
        self._rank, self._world = _world(owner, rank, world_size, "rank", "world_size")
        seed = _check_seed(seed, owner)
        self._shuffle = bool(shuffle)
        self._mode = _mode(pad, drop_last)
        self.batches, error = _global_batches(
            self._n, global_batch_size, micro_batch_size, self._rank, self._world, owner
        )
        if error is not None:  # this rank's own: the entry rule makes it every rank's verdict
            raise error
        _agree_across_ranks(
            owner,
            rank is not None or world_size is not None,
            n=self._n,
            seed=seed,
            shuffle=self._shuffle,
            mode=("pad", "drop_last", "even").index(self._mode),
            global_batch_size=_int_or(global_batch_size),
            micro_batch_size=_int_or(micro_batch_size),
        )
        if self.batches is not None:
            self._full = self.batches.length
        else:
            self._full = C.shard_range(self._n, self._world, self._rank, self._mode)[1]
        # (epoch, seed, start): what set_epoch and load_state_dict change, shared with the copies
        # in DataLoader workers; start is the resume offset into the shard for this epoch.
        self._view = SharedInts((0, seed, 0))
        self._yielded = 0  # items the container's own iterator delivered after start
        self._loaded = False  # load_state_dict, the loader's draw not put back yet (_after_load)
        self.data = data

    def __copy__(self) -> DistributedDataContainer:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._view = SharedInts(self._view.read())  # a copy's set_epoch is its own
        return new

    # --- the shard -------------------------------------------------------------------------
    def _spec(self, epoch: int, seed: int) -> tuple[int, int, int, str, bool, int, int]:
        return (self._n, self._world, self._rank, self._mode, self._shuffle, seed, epoch)

    def __len__(self) -> int:
        if self._loaded:
            self._after_load(fetched=False)
        return self._full - self._view.read()[2]

    def _position(self, i: Any, start: int) -> int:
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(
                f"DistributedDataContainer indices must be ints, got {type(i).__name__}"
            ) from None
        length = self._full - start
        if i < 0:
            i += length
        if not 0 <= i < length:
            raise IndexError(
                f"DistributedDataContainer index out of range: rank {self._rank} holds {length} samples"
            )
        return start + i

    def _after_load(self, fetched: bool) -> None:
        """After ``load_state_dict``: the resumed loop iterates the rest of the epoch with a
        new DataLoader, which, built without ``generator=``, drew its base seed from torch's
        generator, one draw that a run never stopped did not make. In this process, at the
        first touch after it (a batched loader's sampler asks the length; the first fetch; at
        an epoch's end, where the rest is empty, ``set_epoch`` to the next epoch), where the
        generator stands exactly that draw past what ``load_checkpoint(rng=True)`` restored,
        it is put back (_util/rng.py), so dropout draws the same; a loader with a generator of
        its own drew nothing, and nothing changes. A fetch or a new epoch ends the wait
        (``fetched``). In a DataLoader worker, where the draw cannot be undone: worker 0's
        first fetch warns when its loader drew from the global generator."""
        worker = torch.utils.data.get_worker_info()
        if worker is None:
            if _rng.undo_one_draw() or fetched:
                self._loaded = False
            return
        self._loaded = False
        if worker.id == 0 and _rng.drew_resume_point(worker.seed - worker.id):
            # In a worker the main process's draw cannot be undone: say how to avoid it.
            warnings.warn(
                "fluxmpi_py: this run resumed mid-epoch with rng=True, and its DataLoader "
                "(with workers) drew its base seed from torch's global generator, one draw "
                "more than a run that never stopped: its random numbers (dropout) now differ "
                "from that run's. Give the DataLoader a generator of its own: "
                "DataLoader(..., generator=torch.Generator().manual_seed(seed))",
                RuntimeWarning,
                stacklevel=2,
            )

    def __getitem__(self, i: int):
        if self._loaded:
            self._after_load(fetched=True)
        epoch, seed, start = self._view.read()
        return self.data[self._index(epoch, seed, self._position(i, start))]

    def _index(self, epoch: int, seed: int, position: int) -> int:
        """The dataset index at ``position`` of this rank's shard."""
        if self.batches is not None:
            return self.batches.indices(self._shuffle, seed, epoch, position, 1)[0]
        return C.shard_index(*self._spec(epoch, seed), position)

    def __getitems__(self, indices: list[int]) -> list:
        # DataLoader's batched fetch; forwards to data.__getitems__ when the data has one.
        if self._loaded:
            self._after_load(fetched=True)
        epoch, seed, start = self._view.read()
        spec = self._spec(epoch, seed)
        if self.batches is not None:
            globals_ = [self._index(epoch, seed, self._position(i, start)) for i in indices]
        else:
            globals_ = [C.shard_index(*spec, self._position(i, start)) for i in indices]
        getitems = getattr(self.data, "__getitems__", None)
        if getitems is not None:
            return getitems(globals_)
        return [self.data[g] for g in globals_]

    def __iter__(self) -> Iterator:
        self._yielded = 0
        epoch, seed, start = self._view.read()
        it = (
            GlobalBatchIterator(self.batches, self._shuffle, seed, epoch, start)
            if self.batches is not None
            else C.shard_iter(*self._spec(epoch, seed), start, self._full)
        )
        for g in it:
            item = self.data[g]
            self._yielded += 1
            yield item

    @local_call
    def indices(self) -> torch.Tensor:
        """The global indices of the current view of this rank's shard, as an int64 tensor.

        >>> import fluxmpi_py as fm
        >>> fm.DistributedDataContainer(range(5), pad=False, rank=0, world_size=2).indices().tolist()
        [0, 1, 2]
        """
        epoch, seed, start = self._view.read()
        if self.batches is not None:
            got = self.batches.indices(self._shuffle, seed, epoch, start, self._full - start)
            return torch.tensor(got, dtype=torch.int64)
        return C.shard_indices(*self._spec(epoch, seed), start, self._full - start)

    # --- epochs and resume -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._view.read()[0]

    @property
    def seed(self) -> int:
        return self._view.read()[1]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def micro_batches_per_rank(self) -> int:
        """With ``global_batch_size=``: the micro-batches this rank takes per step (``k``);
        where the world size does not divide the step's micro-batches, the first ranks take
        one more (here 8 at 3 ranks: 3, 3 and 2).

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(64), rank=1, world_size=4,
        ...                                 global_batch_size=16, micro_batch_size=2)
        >>> d.micro_batches_per_rank, len(d), d.micro_batch(1)
        (2, 16, (0, 3))
        >>> d = fm.DistributedDataContainer(range(64), rank=2, world_size=3,
        ...                                 global_batch_size=16, micro_batch_size=2)
        >>> d.micro_batches_per_rank, len(d), d.micro_batch(1)
        (2, 16, (0, 7))
        """
        if self.batches is None:
            raise ValueError(
                "DistributedDataContainer: micro_batches_per_rank needs global_batch_size="
            )
        return self.batches.per_rank

    @local_call
    def micro_batch(self, j: int) -> tuple[int, int]:
        """With ``global_batch_size=``: ``(step, index in the step's global batch)`` of this
        rank's ``j``-th micro-batch of the epoch.

        Args:
            j: the micro-batch's number on this rank in the epoch, from 0.

        """
        if self.batches is None:
            raise ValueError("DistributedDataContainer: micro_batch() needs global_batch_size=")
        return self.batches.micro_batch(j)

    @local_call
    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation; a new epoch starts at position 0.

        Args:
            epoch: the epoch, the same on every rank; it picks the permutation with ``seed``.

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(8), shuffle=True, rank=0, world_size=1)
        >>> d.set_epoch(2); d.epoch
        2
        """
        epoch = _check_epoch(epoch, "DistributedDataContainer.set_epoch")
        current, seed, start = self._view.read()
        if epoch != current:
            if self._loaded:
                self._after_load(fetched=True)
            start = 0
            self._yielded = 0
        self._view.write((epoch, seed, start))

    @local_call
    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        """``{"epoch", "seed", "position", "n", "world_size"}`` for resuming.

        ``position`` = the resume offset plus ``consumed`` (samples your loop took from the
        current view), by default the items the container's own iterator yielded.

        Args:
            consumed: the samples your loop has taken this epoch (``steps * batch_size``),
                since a DataLoader reads ahead; None: those delivered so far.

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(10), rank=0, world_size=2)
        >>> d.state_dict(consumed=3)["position"]
        3
        """
        if consumed is None:
            consumed = self._yielded
        consumed = _check_range(
            consumed,
            "consumed",
            "DistributedDataContainer.state_dict",
            0,
            len(self) + 1,
            f"len(self)={len(self)}]",
        )
        epoch, seed, start = self._view.read()
        return {
            "epoch": epoch,
            "seed": seed,
            "position": start + consumed,
            "n": self._n,
            "world_size": self._world,
        }

    @local_call
    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at ``state``'s epoch, seed and position (see ``state_dict``).

        Args:
            state: what ``state_dict`` returned (its ``n`` and ``world_size`` must match).

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(10), rank=0, world_size=2)
        >>> d.load_state_dict({"epoch": 0, "seed": 0, "position": 3}); d.indices().tolist()
        [3, 4]
        """
        s = _check_state(state, "DistributedDataContainer", self._n, self._world, self._full)
        self._view.write((s["epoch"], s["seed"], s["position"]))
        self._yielded = 0
        # past the epoch's start: the loop resumes with a new DataLoader iterator (_after_load)
        self._loaded = s["position"] > 0

    def __repr__(self) -> str:
        return (
            f"DistributedDataContainer(n={self._n}, rank={self._rank}, world_size={self._world}, "
            f"len={len(self)}, mode={self._mode!r}, shuffle={self._shuffle}, seed={self.seed}, "
            f"epoch={self.epoch})"
        )
