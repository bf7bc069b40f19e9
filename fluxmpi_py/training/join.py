"""Join: training on uneven inputs with DistributedOptimizer.

Inside ``with fluxmpi_py.Join([opt]):`` each of ``opt``'s gradient reductions starts with a
*round*: the ranks still in their loop agree on the index of the optimizer they step. A rank
whose data ran out leaves the ``with`` block and *joins*: it waits in every agreement of the
others (``csrc/ops/join.h``) with a mark instead of a signature, and for each round it shadows
that optimizer's step: it reduces zero gradients with the others, then applies the reduced
gradient like them (so its weights and optimizer state stay equal to theirs). When every rank
has joined, all leave together. A round is one agreement (the small allreduce every
collective starts with) while no rank has joined, and one more 8-byte allreduce once one has;
outside a Join, steps pay nothing for this.

Limits: once a rank has joined, the only collectives the others may issue are the steps of
the optimizers given to Join (with their ``module=`` buffer sync and ``check_every``).
Anything else (a loss allreduce, ``synchronize_``, a closure step) meets the joined rank's
mark: every rank raises (RuntimeError on the joined rank, naming this limit) instead of
hanging. ``hvd.join()`` (:mod:`fluxmpi_py.horovod`) uses the same wait, and its joined ranks
also reduce zeros with the others' allreduces, on the world and (one thread each) on the
process sets they are in.

A Join whose optimizers were made on a group (``DistributedOptimizer(group=...)``, all on the
same one) runs its rounds and its joined ranks' wait on that group: only its members enter
the block, and the others may meanwhile do anything but call with the group.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .._core import C
from ..collectives.objects import allgather_object
from ..runtime.agreement import raised_on_every_rank
from ..runtime.entry import local_call
from ..runtime.groups import on_group

__all__ = ["Join"]


class Joinable:
    """What :class:`Join` takes: a DistributedOptimizer subclasses it, so that this module
    needs nothing from the optimizer's. Join sets ``_join`` (the state and the optimizer's
    index) and reads ``_group``."""

    _join: tuple[JoinState, int] | None = None
    _group: Any = None


class JoinState:
    """The optimizers taking part in one join (a Join context, or ``hvd.join``'s registry)
    and this rank's bookkeeping."""

    def __init__(self, divide_by_initial_world_size: bool, what: str, group=None):
        # Weak: hvd.join's registry must not keep every optimizer ever made alive. Indices
        # stay stable (ranks register in the same order); a dead one is never stepped.
        self.optimizers: list[weakref.ref] = []
        self.divide_by_initial_world_size = divide_by_initial_world_size
        self.what = what
        # hvd.join: joined ranks also reduce zeros with the others' allreduces (and keep
        # waiting when the others' other calls raise); fluxmpi_py.Join: rounds only.
        self.shadows_allreduces = False
        self.group = group  # the optimizers' group (fluxmpi_py.Join), None for the world
        self.rounds = 0  # rounds this rank took part in while active: the last to join has most

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


def round_(state: JoinState, index: int) -> int:
    """An active rank's round before a step of optimizer ``index`` (a collective): returns
    how many ranks are active. RuntimeError on every rank when the active ranks step
    different optimizers."""
    count, same = C.join_round(index)
    if not same:
        raise RuntimeError(_different_optimizers(state))
    state.rounds += 1
    return count


def _different_optimizers(state: JoinState) -> str:
    return (
        f"{state.what}: the ranks still training stepped different optimizers in the same "
        "round; every rank must step the Join's optimizers in the same order"
    )


def grad_scale(state: JoinState, count: int) -> float:
    """Factor on the averaged gradients of a round with ``count`` active ranks."""
    if state.divide_by_initial_world_size or count == 0:
        return 1.0
    return (C.size() if state.group is None else state.group.size) / count


def wait_for_all(state: JoinState, who: str, sets=()) -> int:
    """This rank has joined: shadow the active ranks' steps until none is left. Returns the
    last rank to join (the highest on a tie).

    ``sets``: (group, JoinState) of the process sets this rank is in (``hvd.join``): each is
    waited on by a thread of its own (its group current there) while this thread waits on
    the world; they end when every member of their set has joined, before this returns."""
    if not sets:
        return _wait(state, who, beside=False)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(
            target=_wait_on_set,
            args=(group, set_state, who, errors),
            name=f"{who} on {list(group.ranks)}",
            daemon=True,
        )
        for group, set_state in sets
    ]
    for t in threads:
        t.start()
    last = _wait(state, who, beside=True)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return last


def _wait_on_set(group, state: JoinState, who: str, errors: list) -> None:
    """One process set's wait. An error that the set's active ranks raised too (a shadowed
    step they disagree on) is raised by ``wait_for_all`` once every rank has joined, and this
    thread keeps waiting meanwhile, as the others may go on; an error of this rank alone
    leaves the set's others waiting for it forever, so it stays uncaught: the thread's
    excepthook (``_excepthooks``) reports it and ends the job."""
    with on_group(group, who):
        while True:
            try:
                _wait(state, who, beside=True)
                return
            except (ValueError, RuntimeError, TypeError) as e:
                if not raised_on_every_rank(e):
                    raise
                errors.append(e)


def _wait(state: JoinState, who: str, beside: bool) -> int:
    """The wait on the current group (``beside``: other threads wait on other groups)."""
    rigid, first = not state.shadows_allreduces, True
    while True:
        try:
            count, index, same, last = C.join_wait(rigid, first, beside)
        except (ValueError, RuntimeError, TypeError) as e:
            if not rigid:  # not the others' refused calls: those never reach here
                raise
            raise RuntimeError(
                f"{who}: rank {C.rank()} had joined and a rank still training issued a "
                "collective other than a step of the joined DistributedOptimizers; inside a "
                "join only those steps may communicate"
            ) from e
        first = False
        if count == 0:
            return last
        if not same:  # the active ranks raise
            if rigid:
                raise RuntimeError(_different_optimizers(state))
            continue
        opt = state.optimizers[index]() if 0 <= index < len(state.optimizers) else None
        if opt is None:
            raise RuntimeError(
                f"{who}: the others stepped an optimizer that rank {C.rank()} no longer has"
            )
        opt._shadow_step(count)


@local_call  # its __enter__ and __exit__ are the collectives
class Join:
    """Train on uneven inputs: ``with Join([opt]): for batch in my_shard: ...``.

    Every rank enters together; a rank that runs out of batches leaves the block and waits
    there, taking part in the others' gradient reductions with zeros and applying their
    steps, so that no rank hangs and all end with the same weights. The gradient is averaged
    over the initial world size (DDP's ``divide_by_initial_world_size=True``, the default:
    a joined rank counts as zeros); ``divide_by_initial_world_size=False`` averages over
    the ranks still training. ``last_joined_rank`` is set on exit. Costs one agreement per
    step inside the block; see the module docstring for what else may run.

    Args:
        joinables: the DistributedOptimizers whose reductions the joined ranks take part in.
        enable: False: the block does nothing (the same code runs without Join).
        divide_by_initial_world_size: True: average over every rank (a joined rank counts as
            zeros); False: over the ranks still training.

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
        self._joinables = list(joinables)
        for i, opt in enumerate(self._joinables):
            if not isinstance(opt, Joinable):
                raise TypeError(
                    f"Join takes fluxmpi_py.DistributedOptimizer objects; joinables[{i}] is a "
                    f"{type(opt).__name__}"
                )
        self._group = _group_of(self._joinables)
        self._enable = bool(enable)
        self._divide = bool(divide_by_initial_world_size)
        self._state = None
        self.last_joined_rank = None

    def __enter__(self):
        if self._enable:
            self._state = JoinState(self._divide, "fluxmpi_py.Join", self._group)
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
            if self._group is None:
                self.last_joined_rank = wait_for_all(state, "fluxmpi_py.Join")
                return False
            with on_group(self._group, "fluxmpi_py.Join"):
                wait_for_all(state, "fluxmpi_py.Join")
                self.last_joined_rank = _last_on_group(state)
            return False
        finally:
            state.release()


def _group_of(joinables):
    """The group the optimizers were made on (None: the world). ValueError when they differ:
    a Join's rounds run on one communicator."""
    handles = {id(_handle(opt)): opt._group for opt in joinables}
    if len(handles) > 1:
        found = ", ".join("the world" if g is None else f"group {list(g.ranks)}"
                          for g in handles.values())  # fmt: skip
        raise ValueError(
            f"fluxmpi_py.Join: its DistributedOptimizers were made on different groups ({found}); "
            "one Join takes the optimizers of one group"
        )
    return next(iter(handles.values())) if handles else None


def _handle(opt):
    return None if opt._group is None else opt._group._handle


def _last_on_group(state: JoinState) -> int:
    """Every member of the Join's group has joined: the world rank of the one that took part
    in the most rounds while active (the highest on a tie), by a gather on the group."""
    rounds = allgather_object(state.rounds)
    best = max(range(len(rounds)), key=lambda i: (rounds[i], i))
    return state.group.ranks[best]
