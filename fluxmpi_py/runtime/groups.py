"""Sub-groups: collectives among some of the ranks while the others do something else.

``new_group(ranks)`` is called by every rank with the same list, in the same order as the
other groups (as ``torch.distributed.new_group`` is). The collectives, DistributedOptimizer,
synchronize_ and DistributedDataContainer take the group as ``group=``; only its members may
call with it. Inside a group, ranks are numbered by their place in the sorted list: a
``root_rank`` is a rank in the group, and results come in that order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Callable, TypeVar

from .._core import C
from .agreement import debug_box, named_call
from .entry import entry_point, local_call, mark, outside_the_call, pass_on
from .pending_steps import PENDING, settle_pending

_F = TypeVar("_F", bound=Callable)

__all__ = ["Group", "new_group"]


@local_call
class Group:
    """A subset of the ranks, made by :func:`new_group`.

    ``ranks`` are the world ranks of its members (ascending), ``size`` their number, ``rank``
    this process's rank in the group (None outside it); ``r in group`` asks about world rank r.

    Args:
        handle: the compiled group; made by `new_group`, not by hand.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> g = fm.new_group([0])
    >>> g.ranks, g.size, 0 in g, g.rank == (0 if fm.local_rank() == 0 else None)
    ((0,), 1, True, True)
    """

    __slots__ = ("_handle",)

    def __init__(self, handle):
        self._handle = handle

    @property
    def ranks(self) -> tuple:
        """World ranks of the members, ascending."""
        return tuple(self._handle.ranks)

    @property
    def size(self) -> int:
        """Number of members."""
        return self._handle.size

    @property
    def rank(self) -> int | None:
        """This process's rank in the group (its place in ``ranks``), or None outside it."""
        r = self._handle.rank
        return None if r < 0 else r

    def __contains__(self, world_rank: int) -> bool:
        return world_rank in self._handle.ranks

    def __repr__(self) -> str:
        return f"Group(ranks={list(self.ranks)}, rank={self.rank})"


@entry_point("new_group()")
def new_group(ranks: Iterable[int]) -> Group:
    """Make a group of the world ranks ``ranks``. A collective over every rank: all call it
    with the same list (order and repeats aside: a repeated rank is a ValueError), in the same
    order as their other ``new_group`` calls. Different lists raise a RuntimeError on every
    rank, naming each rank's list; a bad list raises a ValueError on every rank.

    Args:
        ranks: the world ranks of the members, the same on every rank (any order).

    Returns:
        The group, on every rank (``group.rank`` is None outside it).

    Raises:
        ValueError: on every rank, for a repeated or out-of-range rank.
        RuntimeError: on every rank, when the ranks passed different lists.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.new_group(range(fm.total_workers())).size == fm.total_workers()
    True
    """
    try:
        ranks = [int(r) for r in ranks]
    except TypeError as e:
        raise TypeError(f"new_group: ranks must be an iterable of ints ({e})") from None
    return Group(C.new_group(ranks))


def new_local_group(ranks: Iterable[int], *, sort: bool = True, timeout_s: float) -> Group:
    """Make a group of the world ranks ``ranks``, called by its members alone (MPI_Comm_create_group):
    ranks outside it take no part. The members first compare their lists and raise together when
    they differ; ``sort=False`` keeps the order given (the rank in the group is the place in the
    list); ``timeout_s`` bounds the members' wait for each other. For faces whose groups are
    made by their members only (torch.distributed's ``new_group``); users call
    :func:`new_group`.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> new_local_group([fm.local_rank()], timeout_s=60.0).size
    1
    """
    return Group(C.new_local_group([int(r) for r in ranks], sort, float(timeout_s)))


def current_group() -> Group:
    """The group that collectives called now, on this thread, run on: the world, or the group
    of an enclosing ``group=`` call or :class:`on_group` context. For collectives whose later
    part (an autograd backward) must run on the group of their first part: keep it, and enter
    ``on_group`` with it later.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> current_group().size == fm.total_workers()
    True
    >>> g = fm.new_group([0])
    >>> if fm.local_rank() == 0:
    ...     with on_group(g, "example"):
    ...         assert current_group().ranks == (0,)
    """
    return Group(C.current_group())


class on_group:
    """Run the collectives called inside this context on ``group`` (None: the world): what
    ``group=`` does for one call, for a face that runs several calls on a group of its own
    (Horovod's process sets). A rank outside the group gets a ValueError naming its rank,
    ``call`` and the group's ranks, raised here, before any communication.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> g = fm.new_group([0])
    >>> if fm.local_rank() == 0:
    ...     with on_group(g, "example"):
    ...         assert fm.allreduce_(torch.ones(1)).item() == 1.0
    """

    __slots__ = ("_handle", "_previous")

    def __init__(self, group: Group | None, call: str):
        if group is None:
            self._handle = None
            return
        if not isinstance(group, Group):
            raise TypeError(
                f"{call}: group must be a fluxmpi_py.Group (from new_group) or None, "
                f"got {type(group).__name__}"
            )
        try:
            group._handle.check_member(call)
        except ValueError as e:
            raise outside_the_call(e) from None
        self._handle = group._handle

    def __enter__(self):
        if self._handle is not None:
            self._previous = C.set_current_group(self._handle)
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            C.set_current_group(self._previous)
        return False


def group_dispatch(call: str) -> Callable[[_F], _F]:
    """The one ``group=`` rule of the public collectives, as a decorator, with the rule of every
    public call (entry.py): an exception raised on this rank before the call met the others
    becomes this rank's verdict in their agreement, on the group they wait on. Called with a
    group, the function runs inside ``on_group(group, call)``: a non-member raises, naming
    ``call``, before any communication (it takes no part, and no member waits for it); a
    ``group=`` that is no Group is a bad argument like any other. Without one, it runs on the
    world. A ``name=``, and the call site in the detail debug mode, enter the ranks' agreement
    (agreement.named_call). The function keeps ``group=None, name=None`` in its signature for
    its readers; it always sees None there."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def dispatch(*args, group=None, name=None, **kwargs):
            if PENDING:  # a step this rank left half-done goes first (pending_steps.py)
                settle_pending()
            start = C.thread_agreements()
            if group is None and name is None and debug_box[0] != "detail":
                try:  # the common call: nothing to set up (no context)
                    return fn(*args, **kwargs)
                except Exception as e:
                    pass_on(e, start, call)
            with named_call(call, name):
                if group is None:
                    try:
                        return fn(*args, **kwargs)
                    except Exception as e:
                        pass_on(e, start, call)
                try:
                    chosen = on_group(group, call)
                except TypeError as e:  # no Group: a bad argument, on the current group
                    pass_on(e, start, call)
                with chosen:
                    try:
                        return fn(*args, **kwargs)
                    except Exception as e:  # on the group, where its members wait
                        pass_on(e, start, call)

        return mark(dispatch, "group")

    return wrap


class on_handle:
    """Make the compiled group ``handle`` (``C.current_group()`` taken earlier) current inside
    this context: a backward pass runs its collectives on the forward pass's group."""

    __slots__ = ("_handle", "_previous")

    def __init__(self, handle):
        self._handle = handle

    def __enter__(self):
        self._previous = C.set_current_group(self._handle)
        return self

    def __exit__(self, *exc):
        C.set_current_group(self._previous)
        return False
