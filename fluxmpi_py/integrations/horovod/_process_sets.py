"""Horovod's process sets on fluxmpi_py's sub-groups (:func:`fluxmpi_py.new_group`).

A registered :class:`ProcessSet` holds a :class:`fluxmpi_py.Group` of its ranks; the hvd
collectives given ``process_set=`` run on that group. As in Horovod, a ``root_rank`` is a
world rank (``hvd.rank()``), results come in the set's rank order, and only members may call
a collective with the set. ``hvd.global_process_set`` (id 0) is every rank.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...runtime.entry import local_call
from ...runtime.groups import new_group
from ...runtime.world import local_rank, total_workers

__all__ = [
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "get_process_sets",
]


class ProcessSet:
    """The ranks that run some collectives together: ``hvd.ProcessSet([0, 2])``, registered
    by ``hvd.add_process_set(ps)`` (or ``hvd.init(process_sets=[...])``) on every rank before
    use. ``size()``, ``rank()`` (the rank in the set; None outside it) and ``included()`` are
    None until it is registered. An mpi4py communicator is not accepted: give its ranks.

    Args:
        ranks_or_comm: the world ranks of the set (any order); not an mpi4py communicator.

    >>> import fluxmpi_py.horovod as hvd; ps = hvd.ProcessSet([2, 0]); ps.ranks, ps.size()
    ([0, 2], None)
    """

    def __init__(self, ranks_or_comm):
        if not isinstance(ranks_or_comm, Iterable) or isinstance(ranks_or_comm, (str, bytes)):
            raise ValueError(
                "hvd.ProcessSet takes a list of world ranks (an mpi4py communicator is not "
                f"supported here: pass its ranks), got {type(ranks_or_comm).__name__}"
            )
        ranks = list(ranks_or_comm)
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
            raise ValueError(f"hvd.ProcessSet takes a list of int ranks, got {ranks!r}")
        self.ranks = sorted(ranks)
        self.process_set_id = None
        self._group = None  # the fluxmpi_py.Group once registered (None for the global set)

    @local_call
    def size(self) -> int | None:
        """Number of ranks in the set (None until registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    @local_call
    def rank(self) -> int | None:
        """This process's rank in the set (its place in ``ranks``); None until registered
        or when this process is not in the set."""
        if self.process_set_id is None:
            return None

        me = local_rank()
        return self.ranks.index(me) if me in self.ranks else None

    @local_call
    def included(self) -> bool | None:
        """Whether this process is in the set (None until registered)."""
        if self.process_set_id is None:
            return None

        return local_rank() in self.ranks

    def _invalidate(self) -> None:
        self.process_set_id, self.ranks, self._group = None, None, None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __str__ = __repr__


global_process_set = ProcessSet([])
"""The process set of every rank (id 0): ``process_set=hvd.global_process_set``."""
global_process_set.process_set_id = 0

# id -> the registered ProcessSet objects with that id (the first one answers for the id).
_registry: dict[int, list[ProcessSet]] = {0: [global_process_set]}


def _on_init(process_sets) -> None:
    """From ``hvd.init``: the global set's ranks, then each of ``process_sets`` (a set whose
    ranks are already registered gets that id: Horovod's init drops duplicates, where its
    ``add_process_set`` refuses them)."""

    global_process_set.ranks = list(range(total_workers()))
    for ps in process_sets or ():
        _register(ps, reuse=True)


def add_process_set(process_set) -> ProcessSet:
    """Register ``process_set`` (a :class:`ProcessSet` or a list of ranks) and return it.
    A collective over every rank: all call it with the same ranks, in the same order as
    their other ``add_process_set`` calls (different lists raise a RuntimeError on every
    rank). As in Horovod, the ranks of a set already registered (the global set's too: every
    rank) raise ValueError ("duplicate process set") on every rank.

    >>> import fluxmpi_py.horovod as hvd; hvd.init()
    >>> if hvd.size() > 1:
    ...     ps = hvd.add_process_set([0])
    ...     assert ps.size() == 1 and ps.included() == (hvd.rank() == 0)
    ...     assert hvd.remove_process_set(ps)
    """
    return _register(process_set, reuse=False)


def _register(process_set, reuse: bool) -> ProcessSet:
    """add_process_set; ``reuse``: ranks already registered take that set's id (hvd.init's
    ``process_sets=``) instead of raising."""

    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise ValueError("hvd.add_process_set: this ProcessSet was removed; make a new one")
    if process_set.process_set_id is not None:
        raise ValueError(f"hvd.add_process_set: {process_set} is already registered")
    group = new_group(process_set.ranks)  # agrees on the ranks across every rank
    same = [i for i, sets in _registry.items() if i and sets[0].ranks == process_set.ranks]
    if process_set.ranks == list(range(total_workers())):
        same = [0]
    if same and not reuse:
        raise ValueError(
            f"hvd.add_process_set: attempted to add a duplicate process set: ranks "
            f"{process_set.ranks} are already process set {same[0]} "
            f"({_registry[same[0]][0]}); use that one, or remove_process_set it first"
        )
    if same:
        process_set.process_set_id = same[0]
        process_set._group = _registry[same[0]][0]._group
    else:
        process_set.process_set_id = max(_registry) + 1
        process_set._group = group
    _registry.setdefault(process_set.process_set_id, []).append(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` and every set object with its id; False for the global
    set (never removed) or a set that is not registered. Local: no communication.

    >>> import fluxmpi_py.horovod as hvd; hvd.remove_process_set(hvd.global_process_set)
    False
    """
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            f"hvd.remove_process_set takes a ProcessSet, got {type(process_set).__name__}"
        )
    pid = process_set.process_set_id
    if pid is None or pid == 0 or pid not in _registry:
        return False
    for ps in _registry.pop(pid):
        ps._invalidate()
    return True


def get_process_sets() -> dict[int, list[int]]:
    """The registered sets as {id: ranks}.

    >>> import fluxmpi_py.horovod as hvd; hvd.init(); hvd.get_process_sets()[0] == list(range(hvd.size()))
    True
    """
    return {i: list(sets[0].ranks) for i, sets in sorted(_registry.items())}


def group_of(process_set, call: str):
    """The fluxmpi_py group for ``process_set=`` (None: the world)."""
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            f"{call}: process_set must be an hvd.ProcessSet, got {type(process_set).__name__}"
        )
    if process_set.process_set_id is None:
        raise ValueError(
            f"{call}: {process_set} is not registered; call hvd.add_process_set(ps) on every "
            "rank first (or pass it to hvd.init(process_sets=[...]))"
        )
    return process_set._group


def member_groups() -> list:
    """The groups of the registered sets this process is in, other than the world (for
    ``hvd.join()``: it waits on each)."""
    groups = (sets[0]._group for i, sets in sorted(_registry.items()) if i)
    return [g for g in groups if g is not None and g.rank is not None]


def group_root(group, root_rank: int, call: str) -> tuple[int, str]:
    """Horovod's world ``root_rank`` as a rank in ``group``: (rank, error text for the
    compiled call to raise on every rank; empty when fine)."""
    if group is None or type(root_rank) is not int:
        return root_rank, ""
    ranks = group.ranks
    if root_rank in ranks:
        return ranks.index(root_rank), ""
    return 0, f"{call}: root_rank {root_rank} is not in the process set {list(ranks)}"
