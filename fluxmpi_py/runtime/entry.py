"""The one rule of the public calls' arguments, in one place: a bad argument given on one rank
only raises on every rank, and the ranks stay in step.

A public call that is a collective checks its arguments before it meets the other ranks. When
such a check raises on one rank only, the others are already waiting in the call's first
agreement (ops/consensus: every collective starts with one). So the rank that raised enters
that agreement itself, with its error as its verdict: every rank of the group then raises
together, this one its own exception, the others one of the same type (ValueError, TypeError,
OSError, KeyError, ...; else RuntimeError) naming the call, the rank and the message, and the
next call finds them in step. Errors that are already every
rank's (an agreement's verdict) pass through unchanged, and so does an error after the call's
first agreement (the ranks met; its own checks decided). Nothing is added to a call that
succeeds but the read of a counter (``thread_agreements``): no collective, no allocation.

Every public callable says which it is, and tests/test_entry_points.py fails for one that does
not: :func:`entry_point` (a collective: the rule above), ``groups.group_dispatch`` (a
collective with the ``group=`` and ``name=`` of the collectives: the same rule, on the group),
or :func:`local_call` (no communication: an error stays on its rank, where no other rank
waits for it).

>>> @local_call
... def f(x): return x + 1
>>> f(1), entry_kind(f)
(2, 'local')
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import Any, Callable, NoReturn, TypeVar, cast

from .._core import C
from .agreement import PORTABLE_ERRORS, mark_raised_on_every_rank, raised_on_every_rank
from .binding_errors import clear_binding_error
from .pending_steps import PENDING, settle_pending

_F = TypeVar("_F", bound=Callable)

__all__ = [
    "entry_point",
    "local_call",
    "own_agreement",
    "mark",
    "entry_kind",
    "raise_as_verdict",
    "raise_noted",
    "error_class",
    "pass_on",
    "outside_the_call",
]

# The attribute that marks a public callable's kind ("collective", "group", "local").
_KIND = "__fluxmpi_entry__"


def entry_kind(fn) -> str | None:
    """How the public callable ``fn`` (a function, or a class: its ``__init__``) keeps the ranks
    in step: "collective", "group" (a collective with ``group=``), "local", or None when it is
    not marked (tests/test_entry_points.py fails for such a public name).

    >>> import fluxmpi_py as fm
    >>> entry_kind(fm.allreduce_), entry_kind(fm.DistributedSampler), entry_kind(fm.local_rank)
    ('group', 'collective', 'local')
    """
    if isinstance(fn, type) and _KIND not in fn.__dict__:
        fn = fn.__dict__.get("__init__")
    return getattr(fn, _KIND, None)


def local_call(fn: _F) -> _F:
    """Mark ``fn`` (a function or a class) as a public call that never communicates: its
    errors are its rank's own, and no other rank waits for them. Returns ``fn`` itself.

    >>> @local_call
    ... def rank_name(): return "rank 0"
    >>> entry_kind(rank_name)
    'local'
    """
    return mark(fn, "local")


def own_agreement(fn: _F) -> _F:
    """Mark ``fn`` (a method) as a public collective that carries its own argument checks
    into the agreement it meets the other ranks in, with no wrapper: where that agreement is
    not the first thing the call does on this thread (``DistributedOptimizer.step()``, whose
    reduction began in backward's hooks, on the engine thread), this rank's bad argument
    travels in the call's reduction instead (``ReductionPlan.finalize(error=)``), and every
    rank raises it there. Returns ``fn`` itself.

    >>> @own_agreement
    ... def step(self, closure=None): ...
    >>> entry_kind(step)
    'collective'
    """
    return mark(fn, "collective")


def mark(fn, kind: str) -> Any:
    """Mark the public callable ``fn`` with its kind (see :func:`entry_kind`); returns it (as
    Any: a decorator's wrapper stands for the decorated function's own type).

    >>> entry_kind(mark(lambda: None, "collective"))
    'collective'
    """
    setattr(fn, _KIND, kind)
    return fn


def error_class(error: BaseException):
    """The verdict's class (``C.ErrorClass``) of ``error``: ValueError or TypeError, whichever
    comes first in the error's type's MRO (a class of both keeps its first), else RuntimeError.

    >>> error_class(KeyError("k")).name
    'RUNTIME'
    """
    for base in type(error).__mro__:
        if base is ValueError:
            return C.ErrorClass.VALUE
        if base is TypeError:
            return C.ErrorClass.TYPE
    return C.ErrorClass.RUNTIME


def _verdict_text(error: BaseException) -> str:
    """The error's message; a type that the verdict's classes lose (OSError, KeyError ...)
    leads it, so that the other ranks raise that type again (:func:`_as_raised`)."""
    if isinstance(error, KeyError) and error.args:
        text = str(error.args[0])
    else:
        text = str(error) or type(error).__name__
    if not isinstance(error, (ValueError, TypeError, RuntimeError)):
        text = f"{type(error).__name__}: {text}"
    return text


# "<call>: rank R: <Type>: <message>": a verdict whose error type the classes lost.
_TYPED_VERDICT = re.compile(r": rank \d+: (\w+): ")


def _as_raised(agreed: Exception) -> Exception:
    """The agreement's RuntimeError as the type the erring rank raised, where that is a
    common one (agreement.PORTABLE_ERRORS: OSError and its kinds, KeyError, ...)."""
    if type(agreed) is not RuntimeError:
        return agreed
    m = _TYPED_VERDICT.search(str(agreed))
    kind = PORTABLE_ERRORS.get(m.group(1)) if m else None
    if kind is None or kind is RuntimeError:
        return agreed
    again = kind(str(agreed))
    mark_raised_on_every_rank(again)
    return again


def raise_as_verdict(error: BaseException, call: str) -> NoReturn:
    """Enter an agreement on the current group with ``error``, this rank's verdict on its own
    arguments: every rank of the group, waiting in its call's first agreement, raises it
    together, naming ``call``, this rank and the message, as a ValueError or TypeError, or as
    the same common type (OSError, KeyError, ...; else RuntimeError). This rank raises
    ``error`` itself, marked as raised on every rank (a type of none of those families: the
    others' RuntimeError, chaining it). Without a world of several ranks (before
    ``Init``, after shutdown, a group of one) it just raises ``error``.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> raise_as_verdict(ValueError("seed must be >= 0"), "f()")
    Traceback (most recent call last):
    ...
    ValueError: seed must be >= 0
    """
    if not C.initialized() or C.current_group().size == 1:
        raise error
    entered = C.enter_user_call(call)
    try:
        C.broadcast_bytes(None, 0, error_class=error_class(error), error_text=_verdict_text(error))
    except Exception as agreed:  # the agreement's verdict, which every other rank raises now
        if isinstance(error, tuple(PORTABLE_ERRORS.values())):
            raise mark_raised_on_every_rank(error) from None  # the others raise its type
        raise agreed from error  # a RuntimeError on every rank
    finally:
        C.leave_user_call(entered)
    raise AssertionError(f"unreachable: the agreement raises {error!r}")


def raise_noted(error: BaseException | None, call: str) -> NoReturn:
    """Every rank of the group calls this together, once they all know that some rank noted
    an error it could not raise where it happened (a backward hook, which its rank alone runs
    while the others' collectives go on): that rank passes its ``error``, the others None.
    Every rank, the noting one too, then raises the same verdict (see :func:`raise_as_verdict`),
    naming ``call``, that rank and its message.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> raise_noted(RuntimeError("parameter w: resized"), "DistributedOptimizer.step()")
    Traceback (most recent call last):
    ...
    RuntimeError: parameter w: resized
    """
    if not C.initialized() or C.current_group().size == 1:
        if error is None:
            raise AssertionError(f"{call}: no rank gave the error that some rank noted")
        raise error
    kind, text = (
        (C.ErrorClass.NONE, "") if error is None else (error_class(error), _verdict_text(error))
    )
    entered = C.enter_user_call(call)
    try:  # the noting ranks' errors are this agreement's verdict, which every rank raises
        C.broadcast_bytes(None, 0, error_class=kind, error_text=text)
    except Exception as agreed:
        again = _as_raised(agreed)
        raise again from (error if again is agreed else agreed)
    finally:
        C.leave_user_call(entered)
    raise AssertionError(f"{call}: no rank gave the error that some rank noted")


def outside_the_call(error: BaseException) -> BaseException:
    """Mark ``error`` as the error of a rank that takes no part in the call (a non-member of
    its group): it stays that rank's own, since no other rank waits for it. Returns it.

    >>> outside_the_call(ValueError("rank 3 is not in the group")).outside_the_call
    True
    """
    cast(Any, error).outside_the_call = True
    return error


def pass_on(error: Exception, start: int, call: str) -> NoReturn:
    """Raise ``error`` out of the public call ``call``: as this rank's verdict
    (:func:`raise_as_verdict`) when the call has not met the other ranks yet, that is, when
    ``C.thread_agreements()`` still reads ``start``, what it read as the call began; else as
    it is. For the decorators of public calls (this module's, ``groups.group_dispatch``).

    >>> import fluxmpi_py as fm; fm.Init()
    >>> pass_on(KeyError("k"), C.thread_agreements(), "f()")  # one rank: raised as it is
    Traceback (most recent call last):
    ...
    KeyError: 'k'
    """
    clear = clear_binding_error(error)  # pybind11's own text, in words
    if clear is not error:
        error = cast(Exception, clear)
    if raised_on_every_rank(error):
        again = _as_raised(error)
        if again is error:
            raise error
        raise again from error
    if getattr(error, "outside_the_call", False) or C.thread_agreements() != start:
        raise error
    raise_as_verdict(error, call)


def _arguments(fn, args, kwargs) -> dict:
    """The call's arguments by name ({} where they do not fit the signature)."""
    try:
        return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return {}


def _verdict_scope(verdict_on, error: Exception, arguments: dict):
    """Where ``error``'s verdict goes out: the context ``verdict_on(arguments)`` makes (the
    group the call runs on), or the current group where the arguments name none that this
    rank can enter; a rank outside that group keeps ``error`` (no other rank waits for it)."""
    if verdict_on is None:
        return contextlib.nullcontext()
    try:
        return verdict_on(arguments)
    except Exception as e:  # noqa: BLE001 - its own bad group: the current one then
        if getattr(e, "outside_the_call", False):
            outside_the_call(error)
        return contextlib.nullcontext()


def entry_point(
    call: str,
    *,
    named: bool = True,
    local_if: Callable[[dict], bool] | None = None,
    verdict_on: Callable[[dict], Any] | None = None,
) -> Callable[[_F], _F]:
    """Decorator of a public call that is a collective, named ``call`` ("save_checkpoint()")
    in messages (the outermost named call wins, as ``user_call.of``): an exception it raises
    before its first agreement, on this rank alone, becomes this rank's verdict in the
    agreement the other ranks wait in (:func:`raise_as_verdict`), so every rank raises
    together. The collectives with ``group=`` take ``groups.group_dispatch`` instead, which
    keeps the same rule. ``named=False`` leaves the naming to the function (a face whose calls
    enter checked names, ``name=``, which an outer name would hide). ``local_if(arguments)``
    (the call's arguments by name, read only when it raised): True where the arguments make
    the call local (a sampler given its rank and size: no agreement), so its errors stay its
    rank's own. ``verdict_on(arguments)``: the context of the group the call runs on (a
    Horovod process set, entered inside the call), so that an error raised before it was
    entered goes out on that group, where the other ranks wait, not on the current one.

    >>> @entry_point("f()")
    ... def f(x): return x * 2
    >>> f(2), entry_kind(f)
    (4, 'collective')
    """

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def entry(*args, **kwargs):
            if PENDING and (local_if is None or not local_if(_arguments(fn, args, kwargs))):
                settle_pending()  # a step this rank left half-done goes first (pending_steps.py)
            start = C.thread_agreements()
            entered = C.enter_user_call(call) if named else False
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if local_if is not None and local_if(_arguments(fn, args, kwargs)):
                    raise
                on = _verdict_scope(
                    verdict_on, e, _arguments(fn, args, kwargs) if verdict_on else {}
                )
                with on:
                    pass_on(e, start, call)
            finally:
                if entered:
                    C.leave_user_call(entered)

        return mark(entry, "collective")

    return wrap
