"""``hvd`` handles and Horovod's ``name=`` rule: what the ``_async`` calls return, the names
they hold until synchronized, and the context that runs a call on a process set's group.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

from ...collectives.inplace import raise_in_collective
from ...runtime.agreement import named_call, user_call
from ...runtime.groups import on_group
from ._process_sets import group_of


def _in_set(process_set, call: str) -> on_group:
    """Context: the compiled calls inside run on ``process_set``'s group (None or
    ``hvd.global_process_set``: the world)."""
    return on_group(group_of(process_set, call), call)


#: (process set, name) -> (weak reference to the handle, the settle count when it was made),
#: for each ``name=`` async call not yet synchronized: Horovod's duplicate-name rule, which it
#: keeps per process set. Our collectives match by call order, so a reused name would not mix
#: two tensors here; the error is for code that relies on Horovod's (its duplicate-name tests)
#: and catches names reused by mistake. Horovod frees a name when its collective finishes, a
#: moment that differs by rank; here every step is one of the program's, so that ranks running
#: the same program agree on whether a name is taken: ``hvd.synchronize`` frees the handle's
#: name, and a handle dropped unsynchronized (Horovod's handles are integers) holds its name
#: until the next blocking hvd collective or ``hvd.synchronize`` returns (collectives finish
#: in call order, so its own has finished by then).
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
    handle, made_at = entry
    if handle() is None and _settled > made_at:
        del _NAMES_IN_FLIGHT[key]
        return False
    return True


def _name_key(name, process_set, call: str):
    if name is None:
        return None
    group = group_of(process_set, call)
    return (group, str(name))


class NameInFlightError(ValueError, TypeError):
    """A ``name=`` reused while an async call holds it: Horovod's ValueError on the rank that
    reused it. The set's other ranks, inside whatever call they made, raise the TypeError of
    a local error on another rank, with the same message."""


@contextmanager
def named(name, process_set, call: str, *, hold: bool = True):
    """Context for a call with Horovod's ``name=``: a name still held by an async call on the
    same process set raises a ValueError on every rank of the set (through the agreement, so
    that the set's other ranks never wait in a collective this rank left), else yields the
    name's key, held (``hold``) by the handle made with it (see ``_NAMES_IN_FLIGHT``). A
    call that raises inside frees it; a blocking call (not ``hold``) that returns settles."""
    key = _name_key(name, process_set, call)
    if key is not None and _taken(key):
        error = (
            f"name {key[1]!r} is taken by an async collective whose handle is not done yet "
            "(Horovod's duplicate-name rule): hvd.synchronize() that handle first, or give "
            "this call another name"
        )
        try:
            with _in_set(process_set, call), user_call(call):
                raise_in_collective(error)  # raises on every rank of the set
        except TypeError as e:  # the class of local errors on the other ranks
            raise NameInFlightError(str(e)) from None
        raise AssertionError("unreachable: the agreement raises")
    if key is not None and hold:
        _NAMES_IN_FLIGHT[key] = None  # taken; the handle made inside fills it in
    # The name (and the call site, under FLUXMPI_DEBUG=detail) enters the ranks' agreement:
    # named calls made in another order on another rank raise, naming both, never pair.
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
    the ``name=`` it holds (see :func:`named`)."""

    __slots__ = ("request", "finish", "name", "__weakref__")

    def __init__(self, request, finish=None, name=None):
        self.request = request
        self.finish = finish
        self.name = name
        if name is not None:
            _NAMES_IN_FLIGHT[name] = (weakref.ref(self), _settled)

    def release_name(self) -> None:
        if self.name is not None:
            _NAMES_IN_FLIGHT.pop(self.name, None)
            self.name = None


def synchronize_now(handle):
    """Wait for ``handle`` and apply its finishing step."""
    try:
        out = handle.request.wait()
    finally:
        handle.release_name()
        settled()
    return handle.finish(out) if handle.finish is not None else out
