"""Each rank's shard of a dataset: DistributedDataContainer and DistributedSampler.

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
and a reference to the data: they pickle for DataLoader workers.

Resuming: ``state_dict()`` holds ``epoch``, ``seed`` and ``position``, the number of samples
of this rank's shard already delivered in that epoch (plus ``n`` and ``world_size``, checked on
load). After ``load_state_dict`` the object continues at exactly that position.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, Iterator, List, Optional

import torch

from . import runtime
from ._agreement import mark_raised_on_every_rank, span, user_call
from ._loader import C

__all__ = ["DistributedDataContainer", "DistributedSampler"]

_U64 = 1 << 64
_MAX_N = 1 << 62


def _as_int(value: Any, name: str, owner: str) -> int:
    """An exact integer (Python or numpy), not a bool or a float; TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}") from None


def _check_range(value: Any, name: str, owner: str, lo: int, hi: int, hi_text: str) -> int:
    """lo <= value < hi; ``hi_text`` ends the range in the message, e.g. "2**31]" or "5)"."""
    v = _as_int(value, name, owner)
    if not lo <= v < hi:
        raise ValueError(f"{owner}: {name} must be an int in [{lo}, {hi_text}, got {v}")
    return v


def _check_u64(value: Any, name: str, owner: str) -> int:
    # Seeds and epochs: any bad value (negative, too large, not an int) is a ValueError, so
    # callers handle one exception class for "not a usable seed/epoch".
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ValueError(f"{owner}: {name} must be an int in [0, 2**64), got {type(value).__name__} {value!r}")
    v = operator.index(value)
    if not 0 <= v < _U64:
        raise ValueError(f"{owner}: {name} must be an int in [0, 2**64), got {v}")
    return v


def _check_seed(seed: Any, owner: str) -> int:
    return _check_u64(seed, "seed", owner)


def _check_epoch(epoch: Any, owner: str) -> int:
    return _check_u64(epoch, "epoch", owner)


def _dataset_length(data: Any, name: str, owner: str, allow_int: bool = False) -> int:
    if allow_int and isinstance(data, int) and not isinstance(data, bool):
        n = data
    else:
        if not hasattr(type(data), "__len__"):
            raise TypeError(
                f"{owner}: {name} must have __len__ (a map-style dataset, list, tensor or array), "
                f"got {type(data).__name__}; an IterableDataset cannot be sharded by index"
            )
        n = len(data)
    if not 0 <= n <= _MAX_N:
        raise ValueError(f"{owner}: the length of {name} must be in [0, 2**62], got {n}")
    return n


def _world(owner: str, rank: Any, world_size: Any, rank_name: str, size_name: str):
    if rank is None or world_size is None:
        if not runtime.Initialized():
            raise RuntimeError(
                f"{owner}: {rank_name} and {size_name} come from fluxmpi_py.Init(); call it first, "
                f"or pass {rank_name}= and {size_name}= explicitly"
            )
        if world_size is None:
            world_size = runtime.total_workers()
        if rank is None:
            rank = runtime.local_rank()
    world_size = _check_range(world_size, size_name, owner, 1, (1 << 31) + 1, "2**31]")
    rank = _check_range(rank, rank_name, owner, 0, world_size, f"{size_name}={world_size})")
    return rank, world_size



def _agree_across_ranks(owner: str, explicit: bool, **fields: int) -> None:
    """When rank and size come from Init, check (one small allreduce) that every rank built
    the same shard spec: a different seed or length would silently overlap the shards."""
    if explicit or not runtime.Initialized() or runtime.total_workers() == 1:
        return
    # seeds may use 64 bits: fold every value into 61 bits, enough to see a difference
    vals = [(int(v) ^ (int(v) >> 61)) & ((1 << 61) - 1) for v in fields.values()]
    rank = runtime.local_rank()
    bad = [f"{k} differs (rank {rank} has {int(v)})" if k == "seed" else
           f"{k} ranges over [{lo}, {hi}] (rank {rank} has {int(v)})"
           for (k, v), (lo, hi) in zip(fields.items(), span(vals)) if lo != hi]
    if bad:
        raise mark_raised_on_every_rank(ValueError(
            f"{owner}(): ranks disagree: " + "; ".join(bad) +
            ". Every rank must pass the same data length, seed, shuffle, pad and drop_last."))


def _mode(pad: Any, drop_last: Any) -> str:
    if bool(drop_last):
        return "drop_last"
    return "pad" if bool(pad) else "even"


def _check_state(state: Any, owner: str, n: int, world: int, length: int) -> Dict[str, int]:
    if not isinstance(state, dict):
        raise TypeError(f"{owner}.load_state_dict: state must be a dict from state_dict(), got {type(state).__name__}")
    missing = [k for k in ("epoch", "seed", "position") if k not in state]
    if missing:
        raise ValueError(f"{owner}.load_state_dict: state lacks {missing}; expected the dict state_dict() returns")
    for key, mine in (("n", n), ("world_size", world)):
        if key in state and _as_int(state[key], f"state[{key!r}]", owner) != mine:
            raise ValueError(
                f"{owner}.load_state_dict: state[{key!r}] is {state[key]} but this object has {key}={mine}; "
                f"a position only means the same samples for the same dataset length and world size"
            )
    epoch = _check_epoch(state["epoch"], owner)
    seed = _check_seed(state["seed"], owner)
    pos = _check_range(state["position"], "state['position']", owner, 0, length + 1, f"{length}]")
    return {"epoch": epoch, "seed": seed, "position": pos}


class DistributedDataContainer(torch.utils.data.Dataset):
    """This rank's shard of ``data``, as a map-style torch Dataset.

    ``data`` is anything with ``__len__`` and ``__getitem__`` (a Dataset, TensorDataset, list,
    tensor or numpy array). Rank and world size come from ``fluxmpi_py.Init()``; pass ``rank=``
    and ``world_size=`` to use it without MPI. See the module docstring for ``shuffle``,
    ``pad`` and ``drop_last``. ``len(container)`` is this rank's sample count; item ``i`` is
    ``data[index]`` for the ``i``-th index of the shard in this epoch's order.

    ``set_epoch(e)`` picks the epoch's permutation (with ``shuffle=True``). Call it before the
    DataLoader iterator is created; with ``persistent_workers=True`` the workers keep the copy
    they started with, so use ``DistributedSampler`` there instead.

    Resuming: ``state_dict()`` reports ``position``, the number of this rank's samples already
    delivered this epoch. Iterating the container itself (``for x in container``) counts them.
    A DataLoader reads ahead of your loop, so when one drives the container pass what your
    loop consumed: ``state_dict(consumed=steps * batch_size)``. After ``load_state_dict`` the
    container shows the rest of that epoch (``len`` shrinks by ``position``) until
    ``set_epoch`` moves to another epoch; ``set_epoch`` with the same epoch keeps it.

    >>> import fluxmpi_py as fm
    >>> shard = fm.DistributedDataContainer(list("abcdefg"), rank=1, world_size=2)
    >>> len(shard), [shard[i] for i in range(len(shard))]
    (4, ['e', 'f', 'g', 'a'])
    >>> mixed = fm.DistributedDataContainer(range(10), shuffle=True, seed=3, rank=0, world_size=2)
    >>> mixed.set_epoch(1); sorted(mixed) == sorted(mixed.indices().tolist())
    True
    """

    @user_call.of("DistributedDataContainer()")
    def __init__(self, data: Any, *, shuffle: bool = False, seed: int = 0, pad: bool = True,
                 drop_last: bool = False, rank: Optional[int] = None,
                 world_size: Optional[int] = None) -> None:
        owner = "DistributedDataContainer"
        if not hasattr(type(data), "__getitem__"):
            raise TypeError(f"{owner}: data must support data[i] (__getitem__), got {type(data).__name__}")
        self._n = _dataset_length(data, "data", owner)
        self._rank, self._world = _world(owner, rank, world_size, "rank", "world_size")
        self._seed = _check_seed(seed, owner)
        self._shuffle = bool(shuffle)
        self._mode = _mode(pad, drop_last)
        _agree_across_ranks(owner, rank is not None or world_size is not None, n=self._n,
                            seed=self._seed, shuffle=self._shuffle, mode=("pad", "drop_last", "even").index(self._mode))
        self._full = C.shard_range(self._n, self._world, self._rank, self._mode)[1]
        self._epoch = 0
        self._start = 0      # resume offset into the shard for this epoch (load_state_dict)
        self._yielded = 0    # items the container's own iterator delivered after _start
        self.data = data

    # --- the shard -------------------------------------------------------------------------
    def _spec(self):
        return (self._n, self._world, self._rank, self._mode, self._shuffle, self._seed, self._epoch)

    def __len__(self) -> int:
        return self._full - self._start

    def _position(self, i: Any) -> int:
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(
                f"DistributedDataContainer indices must be ints, got {type(i).__name__}"
            ) from None
        length = self._full - self._start
        if i < 0:
            i += length
        if not 0 <= i < length:
            raise IndexError(
                f"DistributedDataContainer index out of range: rank {self._rank} holds {length} samples"
            )
        return self._start + i

    def __getitem__(self, i: int):
        return self.data[C.shard_index(*self._spec(), self._position(i))]

    def __getitems__(self, indices: List[int]) -> list:
        # DataLoader's batched fetch; forwards to data.__getitems__ when the data has one.
        globals_ = [C.shard_index(*self._spec(), self._position(i)) for i in indices]
        getitems = getattr(self.data, "__getitems__", None)
        if getitems is not None:
            return getitems(globals_)
        return [self.data[g] for g in globals_]

    def __iter__(self) -> Iterator:
        self._yielded = 0
        for g in C.shard_iter(*self._spec(), self._start, self._full):
            item = self.data[g]
            self._yielded += 1
            yield item

    def indices(self) -> torch.Tensor:
        """The global indices of the current view of this rank's shard, as an int64 tensor.

        >>> import fluxmpi_py as fm
        >>> fm.DistributedDataContainer(range(5), pad=False, rank=0, world_size=2).indices().tolist()
        [0, 1, 2]
        """
        return C.shard_indices(*self._spec(), self._start, self._full - self._start)

    # --- epochs and resume -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation; a new epoch starts at position 0.

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(8), shuffle=True, rank=0, world_size=1)
        >>> d.set_epoch(2); d.epoch
        2
        """
        epoch = _check_epoch(epoch, "DistributedDataContainer.set_epoch")
        if epoch != self._epoch:
            self._start = 0
            self._yielded = 0
        self._epoch = epoch

    def state_dict(self, consumed: Optional[int] = None) -> Dict[str, int]:
        """``{"epoch", "seed", "position", "n", "world_size"}`` for resuming.

        ``position`` = the resume offset plus ``consumed`` (samples your loop took from the
        current view), by default the items the container's own iterator yielded.

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(10), rank=0, world_size=2)
        >>> d.state_dict(consumed=3)["position"]
        3
        """
        if consumed is None:
            consumed = self._yielded
        consumed = _check_range(consumed, "consumed", "DistributedDataContainer.state_dict", 0,
                                len(self) + 1, f"len(self)={len(self)}]")
        return {"epoch": self._epoch, "seed": self._seed, "position": self._start + consumed,
                "n": self._n, "world_size": self._world}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Continue at ``state``'s epoch, seed and position (see ``state_dict``).

        >>> import fluxmpi_py as fm
        >>> d = fm.DistributedDataContainer(range(10), rank=0, world_size=2)
        >>> d.load_state_dict({"epoch": 0, "seed": 0, "position": 3}); d.indices().tolist()
        [3, 4]
        """
        s = _check_state(state, "DistributedDataContainer", self._n, self._world, self._full)
        self._epoch, self._seed, self._start, self._yielded = s["epoch"], s["seed"], s["position"], 0

    def __repr__(self) -> str:
        return (f"DistributedDataContainer(n={self._n}, rank={self._rank}, world_size={self._world}, "
                f"len={len(self)}, mode={self._mode!r}, shuffle={self._shuffle}, seed={self._seed}, "
                f"epoch={self._epoch})")


class DistributedSampler(torch.utils.data.Sampler):
    """Drop-in for ``torch.utils.data.DistributedSampler`` that needs no ``randperm(n)`` list.

    Same arguments, ``set_epoch``, ``len`` and ``iter`` (plus ``pad``, see the module
    docstring). ``dataset`` may also be the dataset's length as an int. Rank and replica
    count come from ``fluxmpi_py.Init()`` unless given. Indices are computed in C++ in chunks
    of 4 Ki as the iterator advances: the first comes at once and memory stays flat.

    Unlike torch's sampler (which deals positions round-robin), each rank takes a contiguous
    range of the epoch's order, as DistributedDataContainer does; with ``shuffle=True`` (the
    default) that is equally random.

    Resuming: ``state_dict()`` reports ``position``, how far the latest iterator got in this
    rank's shard this epoch. A DataLoader draws indices ahead of your loop (prefetch), so pass
    what the loop consumed: ``state_dict(consumed=steps * batch_size)``. After
    ``load_state_dict`` the next iterator starts at that position (``len`` is the remainder);
    later iterators, and ``set_epoch`` with another epoch, start at 0.

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

    @user_call.of("DistributedSampler()")
    def __init__(self, dataset: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, pad: bool = True) -> None:
        super().__init__()
        owner = "DistributedSampler"
        self._n = _dataset_length(dataset, "dataset", owner, allow_int=True)
        self.rank, self.num_replicas = _world(owner, rank, num_replicas, "rank", "num_replicas")
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = _check_seed(seed, owner)
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.epoch = 0
        self._mode = _mode(pad, drop_last)
        _agree_across_ranks(owner, rank is not None or num_replicas is not None, n=self._n, seed=self.seed,
                            shuffle=self.shuffle, mode=("pad", "drop_last", "even").index(self._mode))
        self.num_samples = C.shard_range(self._n, self.num_replicas, self.rank, self._mode)[1]
        # torch's attribute: positions dealt out over all ranks this epoch
        self.total_size = self._n if self._mode == "even" else self.num_samples * self.num_replicas
        self._resume = 0     # start of the next iterator (load_state_dict), then 0
        self._first = 0      # start of the latest iterator
        self._last = None    # the latest iterator (read .position), or its position once pickled

    def _spec(self):
        # Read at each iterator, as torch does, so attributes set directly are honoured.
        return (self._n, self.num_replicas, self.rank, self._mode, bool(self.shuffle),
                _check_seed(self.seed, "DistributedSampler"),
                _check_epoch(self.epoch, "DistributedSampler"))

    def __len__(self) -> int:
        return self.num_samples - self._resume

    def __iter__(self) -> Iterator[int]:
        spec = self._spec()
        self._first, self._resume = self._resume, 0
        # A C iterator: indices are computed in chunks of 4 Ki and handed out as ints without
        # a Python frame per index; its .position says exactly how far the consumer got.
        self._last = C.shard_iter(*spec, self._first, self.num_samples)
        return self._last

    def _position(self) -> int:
        if self._last is None:
            return self._resume
        return self._last if isinstance(self._last, int) else self._last.position

    def __getstate__(self) -> dict:
        # The live iterator does not pickle; its position does.
        state = dict(self.__dict__)
        state["_last"] = None if self._last is None else self._position()
        return state

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation; a new epoch starts at position 0.

        >>> import fluxmpi_py as fm
        >>> s = fm.DistributedSampler(8, num_replicas=1, rank=0)
        >>> s.set_epoch(1); first = list(s); s.set_epoch(2); first != list(s)
        True
        """
        epoch = _check_epoch(epoch, "DistributedSampler.set_epoch")
        if epoch != self.epoch:
            self._resume, self._first, self._last = 0, 0, None
        self.epoch = epoch

    def state_dict(self, consumed: Optional[int] = None) -> Dict[str, int]:
        """``{"epoch", "seed", "position", "n", "world_size"}`` for resuming.

        ``position`` is how far the latest iterator got; with ``consumed``, it is where that
        iterator started plus ``consumed`` (the samples your loop took from it).

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
            consumed = _check_range(consumed, "consumed", owner, 0, self.num_samples - base + 1,
                                    f"{self.num_samples - base}]")
            position = base + consumed
        return {"epoch": _check_epoch(self.epoch, owner), "seed": _check_seed(self.seed, owner),
                "position": position, "n": self._n, "world_size": self.num_replicas}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Make the next iterator continue at ``state``'s epoch, seed and position.

        >>> import fluxmpi_py as fm
        >>> s = fm.DistributedSampler(10, num_replicas=2, rank=1, shuffle=False)
        >>> s.load_state_dict({"epoch": 0, "seed": 0, "position": 3}); list(s)
        [8, 9]
        """
        s = _check_state(state, "DistributedSampler", self._n, self.num_replicas, self.num_samples)
        self.epoch, self.seed, self._resume = s["epoch"], s["seed"], s["position"]
        self._first, self._last = 0, None

    def __repr__(self) -> str:
        return (f"DistributedSampler(n={self._n}, rank={self.rank}, num_replicas={self.num_replicas}, "
                f"len={len(self)}, mode={self._mode!r}, shuffle={self.shuffle}, seed={self.seed}, "
                f"epoch={self.epoch})")
