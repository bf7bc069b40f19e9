"""Module buffers kept equal across ranks: ``synchronize_buffers_`` and the per-step sync
behind ``DistributedOptimizer(module=...)``.

Each rank's forward passes update buffers such as BatchNorm's running statistics from that
rank's data alone, so without a sync they drift apart and evaluation differs by rank.
"""

from __future__ import annotations

import operator
import warnings
from typing import cast

import torch

from .._core import C
from ..collectives.inplace import Iallreduce, Ibcast
from ..runtime.agreement import require_same
from ..runtime.entry import entry_point
from ..sync.synchronize import synchronized_modules

__all__ = ["synchronize_buffers_"]

_MODES = ("average", "broadcast")


def _named_buffer_slots(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module, str]]:
    """(name, owning module, key) of every buffer of ``module``, each tensor once."""
    return [
        (name, module.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
        for name, _ in module.named_buffers()
    ]


def _buffer(owner: torch.nn.Module, key: str) -> torch.Tensor:
    """The buffer in a slot (named_buffers lists only the slots that hold a tensor)."""
    return cast(torch.Tensor, owner._buffers[key])


class BufferSync:
    """A module's buffers and the collectives that make them equal on every rank.

    Constructing it is a collective: the ranks check that they hold the same buffers (names,
    shapes, dtypes, in order) and otherwise raise ValueError on every rank naming the first
    that differs. Each sync then copies the buffers into one persistent flat tensor per
    (dtype, device), in one multi-tensor copy, and makes one collective on each: "average"
    averages floating buffers and takes the others (counters such as num_batches_tracked)
    from ``root_rank``; "broadcast" takes all from ``root_rank``. A buffer the module
    replaced (``.to()``, assignment) is followed; one registered later is not.
    """

    def __init__(self, module: torch.nn.Module, mode: str, what: str, root_rank: int = 0):
        if mode not in _MODES:
            raise ValueError(f"{what}: buffers mode {mode!r}: expected 'average' or 'broadcast'")
        if type(root_rank) is not int or not 0 <= root_rank < C.size():
            raise ValueError(
                f"{what}: root_rank must be an int in [0, {C.size()}), got {root_rank!r}"
            )
        self._mode, self._root = mode, root_rank
        self._bufs: list[torch.Tensor] | None = None
        self._slots = _named_buffer_slots(module)
        descs = []
        for name, owner, key in self._slots:
            b = _buffer(owner, key)
            descs.append(
                f"{name}: shape {tuple(b.shape)}, dtype {str(b.dtype).replace('torch.', '')}, "
                f"device {b.device.type}"
            )
        require_same(descs, what, "module's buffers", "buffer")

    def _plan(self, bufs: list[torch.Tensor]) -> None:
        """One persistent flat tensor per (dtype, device), with a view per buffer."""
        groups: dict = {}
        for b in bufs:
            groups.setdefault((b.dtype, b.device), []).append(b)
        self._groups = []
        for (dtype, device), members in groups.items():
            flat = torch.empty(sum(b.numel() for b in members), dtype=dtype, device=device)
            views = [
                c.view(b.shape) for c, b in zip(flat.split([b.numel() for b in members]), members)
            ]
            average = self._mode == "average" and (dtype.is_floating_point or dtype.is_complex)
            self._groups.append((members, flat, views, average))
        self._bufs = bufs

    def start(self) -> list:
        """Launch the collectives on packed copies of the buffers (the buffers themselves
        stay readable); ``finish`` writes the results back. A collective."""
        bufs = [_buffer(owner, key) for _, owner, key in self._slots]
        if self._bufs is None or not all(map(operator.is_, bufs, self._bufs)):
            self._plan(bufs)  # first call, or a module replaced a buffer (e.g. .to(device))
        pending = []
        with torch.no_grad():
            for members, flat, views, average in self._groups:
                torch._foreach_copy_(views, members)
                req = Iallreduce(flat, "average") if average else Ibcast(flat, self._root)
                pending.append((members, views, req))
        return pending

    @staticmethod
    def finish(pending: list) -> None:
        """Wait for ``start``'s collectives and copy the results into the buffers."""
        for members, views, req in pending:
            req.wait()
            with torch.no_grad():
                torch._foreach_copy_(members, views)

    def __call__(self) -> None:
        self.finish(self.start())


@entry_point("synchronize_buffers_()")
def synchronize_buffers_(
    module: torch.nn.Module, mode: str = "average", *, root_rank: int = 0
) -> torch.nn.Module:
    """Make ``module``'s buffers (BatchNorm's running statistics, counters) equal on every
    rank, in place, and return the module. A collective.

    ``mode="average"`` averages floating buffers over the ranks (for BatchNorm's running_mean
    with equal per-rank batches, that is one process that saw every rank's batch) and takes
    integer buffers, such as ``num_batches_tracked``, from ``root_rank``. ``"broadcast"`` takes
    every buffer from ``root_rank``, as DDP's ``broadcast_buffers`` does. Raises ValueError on
    every rank, naming the buffer, when the ranks' buffers differ in name, shape or dtype.
    Use it in loops without DistributedOptimizer (e.g. before evaluating); with one, pass
    ``module=model`` instead, which syncs after every step.

    Args:
        module: the model whose buffers to make equal.
        mode: ``"average"`` (floating buffers averaged, integer ones from ``root_rank``) or
            ``"broadcast"`` (every buffer from ``root_rank``).
        root_rank: the rank whose buffers are taken where they are not averaged.

    Returns:
        ``module``, its buffers now equal on every rank.

    Raises:
        ValueError: on every rank, naming the buffer, when the ranks' buffers differ in name,
            shape or dtype.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> bn = torch.nn.BatchNorm1d(3)
    >>> _ = bn(torch.randn(8, 3) + fm.local_rank())     # each rank's own statistics
    >>> bn = fm.synchronize_buffers_(bn)                # now the average over ranks
    >>> int(bn.num_batches_tracked)
    1
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"synchronize_buffers_ takes an nn.Module, got {type(module).__name__}")
    if not C.initialized():
        raise RuntimeError("fluxmpi_py is not initialized: call fluxmpi_py.Init() first")
    BufferSync(module, mode, "synchronize_buffers_", root_rank)()
    return module


class _BufferWatch:
    """Buffers nothing syncs, with their version counters: ``check`` warns (on rank 0) when
    one changed in place or was replaced, as BatchNorm's do in training (its
    num_batches_tracked counts; the native kernel updates the running statistics without
    bumping their version)."""

    def __init__(self, slots):
        self._seen = [
            (name, owner, key, owner._buffers[key], owner._buffers[key]._version)
            for name, owner, key in slots
        ]

    def check(self) -> None:
        changed = next(
            (
                (name, owner)
                for name, owner, key, b, v in self._seen
                if owner._buffers.get(key) is not b or b._version != v
            ),
            None,
        )
        if changed is not None and C.rank() == 0:
            name, owner = changed
            warnings.warn(
                f"fluxmpi_py: the model's buffer '{name}' (of a {type(owner).__name__}) changed "
                f"during training, as each rank's BatchNorm statistics follow its own data, and "
                f"nothing keeps buffers equal across ranks, so evaluation will differ by rank. "
                f"Pass module=model to DistributedOptimizer (it then averages buffers after each "
                f"step), or call fluxmpi_py.synchronize_buffers_(model) before evaluating.",
                stacklevel=4,
            )


def watch_unsynced_buffers(param_groups) -> _BufferWatch | None:
    """A watch over the buffers of a module passed to synchronize_ that owns these
    parameters, or None (no such module, it has no buffers, or the world is one rank)."""
    if C.size() == 1 or not len(synchronized_modules):
        return None  # in a world of one no buffer can differ
    ids = {id(p) for g in param_groups for p in g["params"]}
    for m in list(synchronized_modules):
        if any(id(p) in ids for p in m.parameters()):
            slots = _named_buffer_slots(m)
            if slots:
                return _BufferWatch(slots)
    return None
