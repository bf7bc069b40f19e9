"""How the Horovod face's public callables get the rule of every public call
(fluxmpi_py/runtime/entry.py): a collective's bad argument on one rank raises on every rank,
checked before the ranks meet; the face's package calls `give_the_rule` once on its names, so
that a new callable gets it without a decorator to remember.
"""

from __future__ import annotations

import functools
import inspect
import numbers

from fluxmpi_py.runtime.entry import entry_kind, entry_point, local_call, mark

from ._handles import _in_set

# Horovod's argument names that a face function may use after its collective (scaling a
# result): checked first, so that a bad one raises before the ranks meet, on every rank.
_FACTORS = ("prescale_factor", "postscale_factor")


def _checked_first(fn):
    """``fn``, checking its Horovod scale factors before it runs (the signature says where)."""
    params = list(inspect.signature(fn).parameters)
    where = [(params.index(n), n) for n in _FACTORS if n in params]
    if not where:
        return fn

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        for i, n in where:
            v = args[i] if i < len(args) else kwargs.get(n, 1.0)
            if type(v) is not float and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
                raise TypeError(
                    f"hvd.{fn.__name__}(): {n} must be a number, got {type(v).__name__}"
                )
        return fn(*args, **kwargs)

    return checked


def _at_once_only(fn, ruled):
    """An ``_async`` call with a ``name=`` waits in its lane and starts in a later round
    (``_handles.start_async``): until then it has not met the other ranks, and its errors are
    its rank's own. Without a name it starts at once, a collective: ``ruled``."""
    index = list(inspect.signature(fn).parameters).index("name")

    @functools.wraps(fn)
    def call(*args, **kwargs):
        name = args[index] if index < len(args) else kwargs.get("name")
        return (ruled if name is None else fn)(*args, **kwargs)

    return mark(call, "collective")


def _verdict_on(fn, n: str):
    """A call with ``process_set=`` runs on that set's group, entered inside it: an error
    raised before that (a bad scale factor, a tensor it cannot read) must go out on the set's
    group, where its other members wait, not on the world (whose other ranks are elsewhere)."""
    if "process_set" not in inspect.signature(fn).parameters:
        return None
    return lambda arguments: _in_set(arguments.get("process_set"), f"hvd.{n}()")


def give_the_rule(space: dict, names, local: set[str]) -> None:
    """Give each public callable `names` of the module namespace `space` its kind: `local` ones
    stay their rank's own, classes other than errors are made without communication, and every
    other callable becomes an entry point whose bad argument raises on every rank."""
    for n in names:
        obj = space[n]
        if not callable(obj) or entry_kind(obj) is not None:
            continue
        if isinstance(obj, type):
            if not issubclass(obj, BaseException):
                local_call(obj)  # ops, compressors, ProcessSet: made without communication
        elif n in local:
            space[n] = local_call(obj)
        else:
            ruled = entry_point(f"hvd.{n}()", named=False, verdict_on=_verdict_on(obj, n))(
                _checked_first(obj)
            )
            if "_async" in n and "name" in inspect.signature(obj).parameters:
                ruled = _at_once_only(obj, ruled)
            space[n] = ruled
