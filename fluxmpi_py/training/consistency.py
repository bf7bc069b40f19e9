"""check_consistency: are the ranks' models and optimizers still bit-identical?

Data-parallel ranks should hold the same parameters, buffers and optimizer state after every
step. Nondeterministic kernels, a rank that skipped a step or an update made outside the
optimizer make them drift apart silently. ``check_consistency(obj)`` hashes every tensor's
bytes (and every plain value) of ``obj`` on each rank and compares one 64-bit hash across the
ranks in one small allreduce. Only when the hashes differ does it look further, to name the
first entry that differs and which ranks disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import torch
from torch import nn

from .._core import C
from ..runtime.agreement import (
    bcast_bytes,
    hash64,
    mark_raised_on_every_rank,
    require_same,
    span,
)
from ..runtime.entry import entry_point
from ..sync._walk import _attr_path, _is_optimizer, _is_stateful, _key_path, _module_walk

__all__ = ["check_consistency"]

_PLAIN = (type(None), bool, int, float, complex, str, bytes)


class _Value:
    """A non-tensor entry: plain values compare by repr; other objects by type only (their
    repr may hold an address, which differs across ranks)."""

    __slots__ = ("text", "kind")

    def __init__(self, x: Any):
        self.kind = type(x).__qualname__
        self.text = repr(x) if isinstance(x, _PLAIN) else f"<{self.kind}>"


class _Walk:
    """One rank's entries of ``obj``, in a fixed order: (path, tensor or _Value)."""

    def __init__(self, names: dict[int, str]):
        self.names = names  # id(parameter) -> name, for optimizer state
        self.entries: list[tuple[str, torch.Tensor | _Value]] = []
        self._active: set[int] = set()

    def visit(self, x: Any, path: str) -> None:
        if isinstance(x, torch.Tensor):
            self.entries.append((path or "obj", x))
        elif isinstance(x, nn.Module):
            walk = _module_walk(x)
            prefix = f"{path}." if path else ""
            self.entries.extend((prefix + n, t) for n, t in zip(walk.names, walk.tensors))
        elif isinstance(x, torch.Generator):
            self.entries.append((path or "obj", x.get_state()))
        elif _is_optimizer(x):
            self.optimizer(x, path)
        elif _is_stateful(x):
            self.visit(x.state_dict(), path)
        elif isinstance(x, (dict, list, tuple)) or (
            dataclasses.is_dataclass(x) and not isinstance(x, type)
        ):
            self.container(x, path)
        else:
            self.entries.append((path or "obj", _Value(x)))

    def optimizer(self, opt, path: str) -> None:
        # The live state, not state_dict() (which copies it), named by parameter.
        for g, group in enumerate(opt.param_groups):
            settings = {k: v for k, v in group.items() if k != "params"}
            self.visit(settings, _attr_path(path, f"param_groups[{g}]"))
        for g, group in enumerate(opt.param_groups):
            for i, p in enumerate(group["params"]):
                state = opt.state.get(p)
                if state:
                    name = self.names.get(id(p), f"param_groups[{g}][{i}]")
                    self.visit(state, _attr_path(path, f"state[{name}]"))

    def container(self, x, path: str) -> None:
        if id(x) in self._active:
            raise ValueError(f"check_consistency: {path or 'obj'} contains itself")
        self._active.add(id(x))
        try:
            if isinstance(x, dict):
                for k, v in x.items():
                    self.visit(v, _key_path(path, k))
            elif isinstance(x, tuple) and hasattr(type(x), "_fields"):  # namedtuple
                for f, v in zip(cast(Any, type(x))._fields, x):
                    self.visit(v, _attr_path(path, f))
            elif isinstance(x, (list, tuple)):
                for i, v in enumerate(x):
                    self.visit(v, f"{path}[{i}]")
            else:
                for f in dataclasses.fields(x):
                    self.visit(getattr(x, f.name), _attr_path(path, f.name))
        finally:
            self._active.discard(id(x))


def _parameter_names(obj: Any, path: str = "", out: dict | None = None) -> dict[int, str]:
    """id(parameter) -> its name, from every module in ``obj`` and every
    DistributedOptimizer's named_parameters (so optimizer state is named by parameter)."""
    out = {} if out is None else out
    if isinstance(obj, nn.Module):
        prefix = f"{path}." if path else ""
        for n, p in obj.named_parameters():
            out.setdefault(id(p), prefix + n)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _parameter_names(v, _key_path(path, k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _parameter_names(v, f"{path}[{i}]", out)
    if _is_optimizer(obj) and isinstance(getattr(obj, "_names", None), dict):
        # DistributedOptimizer(named_parameters=...)
        for k, v in obj._names.items():
            out.setdefault(k, v)
    return out


def _describe(entry) -> str:
    path, x = entry
    if isinstance(x, torch.Tensor):
        return f"{path}: tensor of shape {tuple(x.shape)}, {x.dtype}, on {x.device.type}"
    return f"{path}: {x.kind}"  # the value itself is content, compared afterwards


def _ranks(rs: list[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def _largest_difference(t: torch.Tensor) -> str:
    """How far this floating tensor is from rank 0's, at most over all ranks (a collective)."""
    mine = t.detach().to("cpu", copy=True).contiguous()
    ref = mine.clone()
    C.bcast_(ref, 0, "")
    diff = (mine.double() - ref.double()).abs().nan_to_num(nan=float("inf"))
    worst = diff.max().reshape(1) if diff.numel() else torch.zeros(1, dtype=torch.float64)
    C.allreduce_(worst, "max", "")
    return f"; largest difference from rank 0's values: {float(worst):.3g}"


def _raise_first_difference(entries, digests: list[int], what: str) -> None:
    """Collective, on ranks whose hashes differ: raise on every rank, naming the first entry
    that differs and the ranks that disagree with rank 0."""
    require_same(
        [_describe(e) for e in entries],
        what,
        "entries",
        "entry",
        " (the ranks hold different structures: different models or optimizer settings)",
    )
    spans = span(digests)
    index = next((i for i, (lo, hi) in enumerate(spans) if lo != hi), None)
    if index is None:  # every entry agrees; only a hash collision of the lists gets here
        return
    size, rank = C.size(), C.rank()
    everyone = torch.full((size,), -1, dtype=torch.int64)
    everyone[rank] = digests[index]
    C.allreduce_(everyone, "max", "")  # an allgather of this entry's digest
    ref = int(everyone[0])
    differ = [r for r in range(size) if int(everyone[r]) != ref]
    agree = [r for r in range(size) if int(everyone[r]) == ref]
    path, x = entries[index]
    if isinstance(x, torch.Tensor):
        detail = _largest_difference(x) if x.is_floating_point() else ""
    else:
        theirs = bcast_bytes(x.text.encode() if rank == differ[0] else None, differ[0]).decode()
        ours = bcast_bytes(x.text.encode() if rank == 0 else None, 0).decode()
        detail = f"; rank {differ[0]} has {theirs}, rank 0 has {ours}"
    raise mark_raised_on_every_rank(
        ValueError(
            f"{what}: the ranks have diverged; first difference at entry {index} of "
            f"{len(entries)}, {path!r}: {_ranks(differ)} "
            f"{'differs' if len(differ) == 1 else 'differ'} from rank 0 "
            f"({_ranks(agree)} {'agrees' if len(agree) == 1 else 'agree'}){detail}"
        )
    )


def _check(obj: Any, names: dict[int, str], what: str) -> None:
    walk = _Walk(names)
    walk.visit(obj, "")
    entries = walk.entries
    tensors = [x for _, x in entries if isinstance(x, torch.Tensor)]
    tensor_digests = iter(C.tensor_digests(tensors))
    digests = [
        next(tensor_digests) if isinstance(x, torch.Tensor) else hash64(f"{path}={x.text}")
        for path, x in entries
    ]
    mine = hash64("\x1f".join(p for p, _ in entries) + "\x1e" + ",".join(map(str, digests)))
    ((lo, hi),) = span([mine])  # the one collective when the ranks agree
    if lo != hi:
        _raise_first_difference(entries, digests, what)


@entry_point("check_consistency()")
def check_consistency(obj: Any) -> None:
    """Raise ValueError on every rank unless every rank holds bit-identical ``obj``; a
    collective.

    ``obj`` is a model, an optimizer (its settings and state), a tensor, a torch.Generator,
    anything with ``state_dict()`` (schedulers, GradScaler), or dicts, lists, tuples and
    dataclasses of these. Plain values (numbers, strings) are compared too. The error names
    the first entry that differs by its path (``model.fc.weight``,
    ``optimizer.state[fc.weight].exp_avg``), the ranks that differ from rank 0 and, for
    floating tensors, the largest difference. Ranks holding different structures get the
    first differing entry's description instead. Cost: one allreduce of two int64s when the
    ranks agree, plus hashing every byte locally (measured: the guide's
    [Checkpoints][checkpoints-guide] page).

    Args:
        obj: what to compare: a model, an optimizer, a tensor, a generator, anything with
            ``state_dict()``, or dicts, lists, tuples and dataclasses of these.

    Raises:
        ValueError: on every rank, naming the first entry that differs and the ranks that hold
            another value.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = torch.optim.Adam(model.parameters())
    >>> fm.check_consistency({"model": model, "optimizer": opt})
    """
    _check(obj, _parameter_names(obj), "check_consistency()")
