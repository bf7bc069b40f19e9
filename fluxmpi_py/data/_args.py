"""Argument checks shared by DistributedDataContainer and DistributedSampler: exact ints,
seeds and epochs in [0, 2**64), dataset lengths, rank and world size (from Init or explicit),
the cross-rank agreement on the shard spec, and resume states."""

from __future__ import annotations

import operator
from typing import Any

from ..runtime import world as runtime
from ..runtime.agreement import mark_raised_on_every_rank, span

_U64 = 1 << 64
_MAX_N = 1 << 62


def _as_int(value: Any, name: str, owner: str) -> int:
    """An exact integer (Python or numpy), not a bool or a float; TypeError otherwise."""
    if isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}"
        ) from None


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
        raise ValueError(
            f"{owner}: {name} must be an int in [0, 2**64), got {type(value).__name__} {value!r}"
        )
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


def _explicit_world(arguments: dict, rank_name: str, size_name: str) -> bool:
    """Whether a constructor's ``arguments`` (by name) give its rank or size explicitly, and
    well: then it agrees with no other rank (_agree_across_ranks), and its errors stay its own
    (the entry rule's ``local_if``). A bad rank or size is a bad argument like any other."""
    rank, size = arguments.get(rank_name), arguments.get(size_name)
    if rank is None and size is None:
        return False
    try:
        _world("", rank, size, rank_name, size_name)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def _agree_across_ranks(owner: str, explicit: bool, **fields: int) -> None:
    """When rank and size come from Init, check (one small allreduce) that every rank built
    the same shard spec: a different seed or length would silently overlap the shards."""
    if explicit or not runtime.Initialized() or runtime.total_workers() == 1:
        return
    # seeds may use 64 bits: fold every value into 61 bits, enough to see a difference
    vals = [(int(v) ^ (int(v) >> 61)) & ((1 << 61) - 1) for v in fields.values()]
    rank = runtime.local_rank()
    bad = [
        f"{k} differs (rank {rank} has {int(v)})"
        if k == "seed"
        else f"{k} ranges over [{lo}, {hi}] (rank {rank} has {int(v)})"
        for (k, v), (lo, hi) in zip(fields.items(), span(vals))
        if lo != hi
    ]
    if bad:
        raise mark_raised_on_every_rank(
            ValueError(
                f"{owner}(): ranks disagree: "
                + "; ".join(bad)
                + ". Every rank must pass the same data length, seed, shuffle, pad and drop_last."
            )
        )


def _mode(pad: Any, drop_last: Any) -> str:
    if bool(drop_last):
        return "drop_last"
    return "pad" if bool(pad) else "even"


def _check_state(state: Any, owner: str, n: int, world: int, length: int) -> dict[str, int]:
    if not isinstance(state, dict):
        raise TypeError(
            f"{owner}.load_state_dict: state must be a dict from state_dict(), got {type(state).__name__}"
        )
    missing = [k for k in ("epoch", "seed", "position") if k not in state]
    if missing:
        raise ValueError(
            f"{owner}.load_state_dict: state lacks {missing}; expected the dict state_dict() returns"
        )
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
