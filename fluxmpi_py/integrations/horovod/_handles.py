"""``hvd`` handles and Horovod's ``name=`` rule: what the ``_async`` calls return, the names
they hold until synchronized, the lanes where named ``_async`` calls wait until every rank of
their process set has made one of that name (Horovod pairs collectives by name, not by call
order), and the context that runs a call on a process set's group.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

import fluxmpi_py as _fm

from ...collectives.inplace import raise_in_collective
from ...runtime.agreement import hash64, mark_raised_on_every_rank, named_call, span, user_call
from ...runtime.groups import on_group
from ._process_sets import group_of


def _in_set(process_set, call: str) -> on_group:
    """Context: the compiled calls inside run on ``process_set``'s group (None or
    ``hvd.global_process_set``: the world)."""
    return on_group(group_of(process_set, call), call)


#: (process set, name) -> (weak reference to the handle, the settle count when it started),
#: for each ``name=`` async call not yet synchronized: Horovod's duplicate-name rule, which it
#: keeps per process set. Horovod frees a name when its collective finishes, a moment that
#: differs by rank; here every step is one of the program's, so that ranks running the same
#: program agree on whether a name is taken: ``hvd.synchronize`` frees the handle's name, and
#: a handle dropped unsynchronized (Horovod's handles are integers) holds its name while it
#: waits in its lane and, once started, until the next blocking hvd collective or
#: ``hvd.synchronize`` returns (collectives finish in call order, so its own has by then).
_NAMES_IN_FLIGHT: dict = {}
_settled = 0


def settled() -> None:
    """A blocking hvd call or ``hvd.synchronize`` returned: dropped handles' names are free."""
    global _settled
    _settled += 1


def _taken(key) -> bool:
    if key not in _NAMES_IN_FLIGHT:
        return False
    entry = _NAMES_IN_FLIGHT[key]
    if entry is None:  # held by a call that is making its handle
        return True
    handle, started_at = entry
    if handle() is None and _settled > started_at:
        del _NAMES_IN_FLIGHT[key]
        return False
    return True


def _name_key(name, process_set, call: str):
    if name is None:
        return None
    group = group_of(process_set, call)
    return (group, str(name))


def _taken_error(name: str) -> str:
    return (
        f"name {name!r} is taken by an async collective whose handle is not done yet "
        "(Horovod's duplicate-name rule): hvd.synchronize() that handle first, or give "
        "this call another name"
    )


class NameInFlightError(ValueError, TypeError):
    """A ``name=`` reused by a blocking call while an async call holds it: Horovod's
    ValueError on the rank that reused it. The set's other ranks, inside whatever call they
    made, raise the TypeError of a local error on another rank, with the same message."""


@contextmanager
def named(name, process_set, call: str, *, hold: bool = True):
    """Context for a call with Horovod's ``name=`` that starts at once (a blocking call, or
    an ``_async`` one without a name or inside :func:`started_at_once`): a name still held by
    an async call on the same process set raises a ValueError on every rank of the set
    (through the agreement, so that the set's other ranks never wait in a collective this
    rank left), else yields the name's key, held (``hold``) by the handle made with it (see
    ``_NAMES_IN_FLIGHT``). A call that raises inside frees it; a blocking call (not
    ``hold``) that returns settles."""
    key = _name_key(name, process_set, call)
    if key is not None and _taken(key):
        try:
            with _in_set(process_set, call), user_call(call):
                raise_in_collective(_taken_error(key[1]))  # raises on every rank of the set
        except TypeError as e:  # the class of local errors on the other ranks
            raise NameInFlightError(str(e)) from None
        raise AssertionError("unreachable: the agreement raises")
    if key is not None and hold:
        _NAMES_IN_FLIGHT[key] = None  # taken; the handle made inside fills it in
    # The name (and the call site, under FLUXMPI_DEBUG=detail) enters the ranks' agreement:
    # named calls that start at once in another order on another rank raise, naming both.
    try:
        with named_call(call, name):
            yield key if hold else None
    except BaseException:
        if hold:
            _NAMES_IN_FLIGHT.pop(key, None)
        raise
    if not hold:
        settled()


class _Handle:
    """What the ``*_async`` calls return: a request, the step that finishes its result, and
    the ``name=`` it holds (see :func:`named`). A named call waiting in its lane has no
    request yet: ``start`` makes it, inside ``where`` (the set's group), as ``call``; an
    error of that start (or of the wait for it) is kept in ``error`` for ``synchronize``."""

    __slots__ = ("request", "finish", "name", "start", "where", "call", "error", "__weakref__")

    def __init__(self, request, finish=None, name=None, *, start=None, where=None, call=""):
        self.request = request
        self.finish = finish
        self.name = name
        self.start, self.where, self.call = start, where, call
        self.error = None
        if name is not None:
            _NAMES_IN_FLIGHT[name] = (weakref.ref(self), _settled)

    def release_name(self) -> None:
        if self.name is not None:
            _NAMES_IN_FLIGHT.pop(self.name, None)
            self.name = None


#: group (None: the world) -> this rank's named ``_async`` calls on that process set that have
#: not started, in call order. Rounds (:func:`_round`) start those made on every rank.
_LANES: dict = {}
_AT_ONCE = [0]  # > 0: inside started_at_once


@contextmanager
def started_at_once():
    """Context: named ``_async`` calls made inside start when made and pair by call order,
    as blocking calls do (the blocking calls built on an ``_async`` one and its synchronize:
    every rank makes them at the same point)."""
    _AT_ONCE[0] += 1
    try:
        yield
    finally:
        _AT_ONCE[0] -= 1


def start_async(name, process_set, call: str, start) -> _Handle:
    """An ``_async`` call: ``start()`` (run on the set's group; returns the request and the
    step that finishes its result, or None) runs now when the call has no ``name`` (or inside
    :func:`started_at_once`). A named call waits in its set's lane instead and starts in the
    first round in which every rank of the set has a call of that name waiting (Horovod's
    matching by name): in ``hvd.synchronize``, ``hvd.poll`` or ``hvd.barrier``. A name held by
    another async call of this rank raises Horovod's ValueError here, on this rank only."""
    if name is None or _AT_ONCE[0]:
        with named(name, process_set, call) as key, _in_set(process_set, call):
            request, finish = start()
            return _Handle(request, finish, key)
    where = _in_set(process_set, call)  # a rank outside the set raises here, as at once
    key = _name_key(name, process_set, call)
    if _taken(key):
        raise ValueError(f"{call}: rank {_fm.local_rank()}: {_taken_error(key[1])}")
    handle = _Handle(None, name=key, start=start, where=where, call=call)
    _LANES.setdefault(key[0], []).append(handle)
    return handle


def _start(handle: _Handle) -> None:
    """Start a handle taken from its lane, in a round (every rank of its set starts its call of
    this name at this point); an error is kept for ``synchronize`` (raised by the agreement,
    it is every rank's)."""
    start, handle.start = handle.start, None
    assert start is not None and handle.name is not None
    try:
        with handle.where, named_call(handle.call, handle.name[1]):
            handle.request, handle.finish = start()
    except Exception as e:
        handle.error = e
        handle.release_name()
        return
    _NAMES_IN_FLIGHT[handle.name] = (weakref.ref(handle), _settled)


def _call_of(waiting: _Handle | None, polling: bool) -> str:
    """The hvd call a round runs in: ``synchronize`` waiting on a handle, ``poll``, or
    ``barrier``."""
    if waiting is not None:
        return "hvd.synchronize()"
    return "hvd.poll()" if polling else "hvd.barrier()"


def _round(group, waiting: _Handle | None = None, polling: bool = False) -> None:
    """One round on ``group``'s lane, a collective of the set's ranks: one small allreduce
    tells every rank whether all ranks have the same names waiting in the same order (then
    they all start, in that order), whether some rank has joined (``hvd.join``: it gives
    zeros; the waiting calls start in call order), and whether every rank is blocked
    (``waiting``: in ``hvd.synchronize``). Otherwise an allgather of the names follows and the
    names waiting on every rank start, in the first rank's order; the rest keep waiting. When
    nothing can start and every rank is blocked, every rank raises, naming the names waiting
    on each (instead of waiting forever)."""
    lane = _LANES.setdefault(group, [])
    names = [h.name[1] for h in lane]
    call = _call_of(waiting, polling)
    with on_group(group, call), user_call(call):
        # the lane's hash, whether blocked, and -1 (a joined rank gives 0 to each): the
        # least "blocked" is 1 when every rank is
        (low, high), (all_blocked, _), (_, joined) = span(
            [hash64(repr(names)), int(waiting is not None), -1]
        )
        if joined == 0 or low == high:  # the same names everywhere (or a rank joined)
            ready = list(lane)
        else:
            every = _fm.allgather_object(names)
            common = [n for n in every[0] if all(n in other for other in every[1:])]
            ready = [h for n in common for h in lane if h.name[1] == n]  # names are unique
            if not ready and all_blocked == 1:  # every rank blocked, nothing can start
                ranks = list(range(len(every))) if group is None else list(group.ranks)
                raise _blocked(waiting, call, ranks, every)
    for h in ready:
        lane.remove(h)
        _start(h)


def _blocked(waiting: _Handle | None, call: str, ranks, every) -> RuntimeError:
    """The error of a round in which every rank waits on a name no other rank has waiting:
    the handle this rank waits on leaves its lane, failed (its name free again)."""
    waits = "; ".join(f"rank {r}: {names}" for r, names in zip(ranks, every))
    error = RuntimeError(
        f"{call}: every rank waits on a named async collective that the other ranks have "
        f"not made, so none can start (Horovod pairs async calls by name=; ranks that "
        f"wait on different names never meet). Names waiting: {waits}"
    )
    mark_raised_on_every_rank(error)  # the verdict of the round: every rank raises it
    if waiting is not None:
        _LANES[waiting.name[0]].remove(waiting)
        waiting.start, waiting.error = None, error
        waiting.release_name()
    return error


def round_on(process_set, call: str) -> None:
    """One round on ``process_set``'s lane (``hvd.barrier``: every rank of the set calls it),
    so that named calls made on different sides of a barrier meet."""
    _round(group_of(process_set, call))


def start_waiting() -> None:
    """``hvd.join``: this rank's named calls still waiting in their lanes start first, in
    rounds (as in ``hvd.synchronize``), so that they take part as Horovod's, which its ranks
    submit when made, do; a joined rank would only shadow the others' calls with zeros."""
    for group, lane in list(_LANES.items()):
        while lane:
            _round(group, waiting=lane[0])


def poll_started(handle: _Handle) -> bool:
    """``hvd.poll``: whether ``handle``'s collective is done. One still waiting in its lane
    runs a round first (a collective of its set, so every rank of the set must poll or
    synchronize too), and is not done when it did not start there."""
    if handle.start is not None:
        _round(handle.name[0], polling=True)
    if handle.error is not None:
        return True  # done: synchronize raises its error
    return handle.start is None and handle.request.test()


def synchronize_now(handle: _Handle):
    """Wait for ``handle`` (a named one still waiting runs rounds until it starts) and apply
    its finishing step, once: a second synchronize returns the result unscaled again."""
    while handle.start is not None:
        _round(handle.name[0], waiting=handle)
    if handle.error is not None:
        raise handle.error
    try:
        out = handle.request.wait()
    finally:
        handle.release_name()
        settled()
    finish, handle.finish = handle.finish, None  # a second synchronize must not rescale
    return finish(out) if finish is not None else out
