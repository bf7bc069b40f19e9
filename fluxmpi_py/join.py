"""Join: training on uneven inputs with DistributedOptimizer.

Inside ``with fluxmpi_py.Join([opt]):`` each of ``opt``'s gradient reductions starts with one
tiny allreduce, the *round*: every rank still in its loop contributes 1 and the index of the
optimizer it steps. A rank whose data ran out leaves the ``with`` block and *joins*: it keeps
answering rounds with 0, and for each round with an active rank it shadows that optimizer's
step: it reduces zero gradients with the others, then applies the reduced gradient like them
(so its weights and optimizer state stay equal to theirs). When a round counts no active rank,
every rank leaves together. Outside a Join, steps pay nothing for this.

Limits: once a rank has joined, the only collectives the others may issue are the steps of
the optimizers given to Join (with their ``module=`` buffer sync and ``check_every``).
Anything else (a loss allreduce, ``synchronize_``, a closure step) meets the joined rank's
round: the ranks' calls differ, so every rank raises (RuntimeError on the joined rank,
naming this limit) instead of hanging.
"""

from __future__ import annotations

import weakref

import torch

from ._loader import C
from .collectives import allreduce_
from .object_collectives import allgather_object

__all__ = ["Join"]

# The round's allreduce: a length no other call is likely to use, so that a different
# collective issued against it fails the cross-rank check instead of matching it.
_ROUND_LEN = 13


class JoinState:
    """The optimizers taking part in one join (a Join context, or ``hvd.join``'s registry)
    and this rank's bookkeeping."""

    def __init__(self, divide_by_initial_world_size: bool, what: str):
        # Weak: hvd.join's registry must not keep every optimizer ever made alive. Indices
        # stay stable (ranks register in the same order); a dead one is never stepped.
        self.optimizers: list[weakref.ref] = []
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.what = what
        self.active_rounds = 0  # rounds this rank took part in as active
        # hvd.join's extensions: a round with a negative index is another collective, which
        # on_other(index, count) shadows on a joined rank; with keep_waiting, a joined rank
        # whose round met a different collective (which then raised on the active ranks too)
        # keeps waiting instead of raising.
        self.on_other = None
        self.keep_waiting = False

    def register(self, opt) -> None:
        if getattr(opt, "_join", None) is not None:
            raise ValueError(f"{self.what}: this DistributedOptimizer is already in a join")
        opt._join = (self, len(self.optimizers))
        self.optimizers.append(weakref.ref(opt))

    def release(self) -> None:
        for ref in self.optimizers:
            opt = ref()
            if opt is not None:
                opt._join = None
        self.optimizers = []


def round_(state: JoinState, index: int, active: bool) -> tuple[int, int]:
    """One round (a collective): returns (active ranks, the optimizer index they step; -1
    when none). RuntimeError on every rank when the active ranks step different ones."""
    a = int(active)
    t = torch.zeros(_ROUND_LEN, dtype=torch.int64)
    t[0], t[1], t[2] = a, a * index, a * index * index
    allreduce_(t, "sum")
    count, s1, s2 = int(t[0]), int(t[1]), int(t[2])
    if active:
        state.active_rounds += 1
    if count == 0:
        return 0, -1
    if s2 * count != s1 * s1:  # equality iff every active rank gave the same index
        raise RuntimeError(
            f"{state.what}: the ranks still training stepped different optimizers in the "
            "same round; every rank must step the Join's optimizers in the same order"
        )
    return count, s1 // count


def grad_scale(state: JoinState, count: int) -> float:
    """Factor on the averaged gradients of a round with ``count`` active ranks."""
    if state.divide_by_initial_world_size or count == 0:
        return 1.0
    return C.size() / count


def wait_for_all(state: JoinState, who: str) -> int:
    """This rank has joined: shadow the active ranks' steps until none is left. Returns the
    last rank to join (the one active longest; the highest such rank on a tie)."""
    while True:
        try:
            count, index = round_(state, -1, active=False)
        except (ValueError, RuntimeError, TypeError) as e:
            if state.keep_waiting:
                continue
            raise RuntimeError(
                f"{who}: rank {C.rank()} had joined and a rank still training issued a "
                "collective other than a step of the joined DistributedOptimizers; inside a "
                "join only those steps may communicate"
            ) from e
        if count == 0:
            break
        if index < 0 and state.on_other is not None:
            state.on_other(index, count)
            continue
        opt = state.optimizers[index]()
        if opt is None:
            raise RuntimeError(
                f"{who}: the others stepped an optimizer that rank {C.rank()} no longer has"
            )
        opt._shadow_step(count)
    rounds = allgather_object(state.active_rounds)
    state.active_rounds = 0
    return max(range(len(rounds)), key=lambda r: (rounds[r], r))


class Join:
    """Train on uneven inputs: ``with Join([opt]): for batch in my_shard: ...``.

    Every rank enters together; a rank that runs out of batches leaves the block and waits
    there, taking part in the others' gradient reductions with zeros and applying their
    steps, so that no rank hangs and all end with the same weights. The gradient is averaged
    over the initial world size (DDP's ``divide_by_initial_world_size=True``, the default:
    a joined rank counts as zeros); ``divide_by_initial_world_size=False`` averages over
    the ranks still training. ``last_joined_rank`` is set on exit. Costs one 104-byte
    allreduce per step inside the block; see the module docstring for what else may run.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))
    >>> with fm.Join([opt]) as j:
    ...     for _ in range(2 + fm.local_rank()):
    ...         w.sum().backward(); opt.step(); opt.zero_grad()
    >>> j.last_joined_rank == fm.total_workers() - 1
    True
    """

    def __init__(self, joinables, enable: bool = True, divide_by_initial_world_size: bool = True):
        from .optimizer import DistributedOptimizer

        self._joinables = list(joinables)
        for i, opt in enumerate(self._joinables):
            if not isinstance(opt, DistributedOptimizer):
                raise TypeError(
                    f"Join takes fluxmpi_py.DistributedOptimizer objects; joinables[{i}] is a "
                    f"{type(opt).__name__}"
                )
        self._enable = bool(enable)
        self._divide = bool(divide_by_initial_world_size)
        self._state = None
        self.last_joined_rank = None

    def __enter__(self):
        if self._enable:
            self._state = JoinState(self._divide, "fluxmpi_py.Join")
            for opt in self._joinables:
                self._state.register(opt)
        return self

    def __exit__(self, exc_type, exc, tb):
        state, self._state = self._state, None
        if state is None:
            return False
        try:
            if exc is not None:
                if isinstance(exc, (ValueError, RuntimeError, TypeError)):
                    exc.add_note(
                        "inside fluxmpi_py.Join, once some rank has joined only the steps of "
                        "the Join's DistributedOptimizers may communicate"
                    )
                return False
            self.last_joined_rank = wait_for_all(state, "fluxmpi_py.Join")
            return False
        finally:
            state.release()
