"""Cross-rank checks for Python callers: the one hash of a structure, and the collectives
that compare values or errors across ranks before any data moves (the compiled core does the
same for its own calls, csrc/ops/consensus). Each function except ``hash64``, ``user_call``
and the two marking helpers is a collective: every rank calls it, in the same order, and
every rank returns or raises together.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Sequence
from typing import Any, Callable, TypeVar, cast

import torch

from .._core import C

# Errors that keep their type when raised on every rank; anything else becomes RuntimeError.
PORTABLE_ERRORS = {
    t.__name__: t
    for t in (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        RuntimeError,
        OSError,
        FileNotFoundError,
        PermissionError,
        IsADirectoryError,
        NotADirectoryError,
        FileExistsError,
        pickle.UnpicklingError,
    )
}


_F = TypeVar("_F", bound=Callable)


class user_call:
    """Context manager (and decorator factory, ``user_call.of``) that names the user's call
    while it runs, e.g. ``"DistributedOptimizer.step()"``: the messages of the ranks'
    agreement and of the watchdog then name it instead of the collective inside it. The
    outermost named call wins; work it hands to the engine thread keeps its name.

    >>> with user_call("save_checkpoint()"):
    ...     pass
    """

    __slots__ = ("_name", "_checked", "_entered")

    def __init__(self, name: str, checked: bool = False):
        self._name = name
        self._checked = checked  # the ranks' agreement compares the name (checked_call)

    def __enter__(self) -> user_call:
        self._entered = C.enter_user_call(self._name, checked=self._checked)
        return self

    def __exit__(self, *exc) -> None:
        C.leave_user_call(self._entered)

    @staticmethod
    def of(name: str) -> Callable[[_F], _F]:
        """Decorator: the function runs as the user call ``name``.

        >>> @user_call.of("f()")
        ... def f(): return 1
        >>> f()
        1
        """

        def wrap(fn):
            @functools.wraps(fn)
            def named(*args, **kwargs):
                entered = C.enter_user_call(name)
                try:
                    return fn(*args, **kwargs)
                finally:
                    C.leave_user_call(entered)

            return named

        return wrap


DEBUG_MODES = ("off", "detail")
# [mode]: a box, so that the collectives' fast paths (groups.group_dispatch, the hot calls of
# collectives/inplace.py) read it without a call.
debug_box = [os.environ.get("FLUXMPI_DEBUG", "off").strip().lower() or "off"]


def debug_mode() -> str:
    """``"detail"`` when every public collective's agreement checks its call site
    (``Init(debug="detail")`` or ``FLUXMPI_DEBUG=detail``), else ``"off"``.

    >>> debug_mode() in DEBUG_MODES
    True
    """
    return debug_box[0] if debug_box[0] in DEBUG_MODES else "off"


def set_debug_mode(mode: object) -> ValueError | None:
    """Set the debug mode (Init's ``debug=``; None keeps ``FLUXMPI_DEBUG``'s). Returns the
    error for a mode that is not one of DEBUG_MODES, which Init raises on every rank.

    >>> str(set_debug_mode("loud"))
    "Init(debug='loud'): expected 'off' or 'detail'"
    """
    if mode is None:
        if debug_box[0] in DEBUG_MODES:
            return None
        return ValueError(f"FLUXMPI_DEBUG={debug_box[0]!r}: expected 'off' or 'detail'")
    if isinstance(mode, str) and mode in DEBUG_MODES:
        debug_box[0] = mode
        return None
    return ValueError(f"Init(debug={mode!r}): expected 'off' or 'detail'")


def checked_call(call: str, name: object) -> str | None:
    """The name under which a public collective ``call`` ("allreduce_()") enters the ranks'
    agreement as a checked name (csrc/runtime/user_call.h), or None when it enters unnamed:
    with ``name=``, ``allreduce_(name='w')``; in the detail mode, with the user's call site,
    ``allreduce_() at train.py:42``. Ranks in calls of different checked names raise together,
    naming both, instead of pairing two calls of the same shape by their position.

    >>> checked_call("allreduce_()", "grads")
    "allreduce_(name='grads')"
    """
    detail = debug_mode() == "detail"
    if name is None and not detail:
        return None
    head = call[:-2] if call.endswith("()") else call
    label = head + ("()" if name is None else f"(name={str(name)!r})")
    if detail:
        frame = _user_frame()
        if frame is not None:
            label += f" at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return label


def named_call(call: str, name: object) -> contextlib.AbstractContextManager:
    """The context a public collective ``call`` runs in: a checked user call when it has a
    ``name=`` or the detail mode is on (checked_call), else nothing."""
    label = checked_call(call, name)
    return contextlib.nullcontext() if label is None else user_call(label, checked=True)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PASS_THROUGH = ("contextlib.py", "functools.py")


def _user_frame():
    """The innermost frame outside fluxmpi_py (and contextlib/functools wrappers): the
    user's call site."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_PACKAGE_DIR) and not path.endswith(_PASS_THROUGH):
            return frame
        frame = frame.f_back
    return None


def mark_raised_on_every_rank(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised by every rank together (only where that holds: after an
    agreement), so that one rank reports it for all (_excepthooks). Returns ``exc``.

    >>> raised_on_every_rank(mark_raised_on_every_rank(ValueError("bad")))
    True
    """
    cast(Any, exc).raised_on_every_rank = True  # read by the excepthook: one rank reports
    return exc


def raised_on_every_rank(exc: BaseException) -> bool:
    """Whether every rank raised ``exc`` together (marked by the agreement).

    >>> raised_on_every_rank(ValueError("only here"))
    False
    """
    return getattr(exc, "raised_on_every_rank", False) is True


def hash64(text: str) -> int:
    """A hash of ``text`` in [0, 2**63): the same on every rank and in every run, and small
    enough that its negative is an int64 too (``span`` compares max(v) with -max(-v)).

    >>> hash64("fc.weight") == hash64("fc.weight"), 0 <= hash64("") < 2**63
    (True, True)
    """
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def span(values: Sequence[int]) -> list[tuple[int, int]]:
    """(min, max) over all ranks of each value, in one small allreduce. Values must lie in
    (-2**63, 2**63).

    >>> import fluxmpi_py as fm; fm.Init()
    >>> span([3, -1])
    [(3, 3), (-1, -1)]
    """
    n = len(values)
    if C.size() == 1 or n == 0:
        return [(int(v), int(v)) for v in values]
    v = torch.tensor(list(values), dtype=torch.int64)
    both = torch.cat([v, -v])
    C.allreduce_(both, "max")
    return [(-int(both[n + i]), int(both[i])) for i in range(n)]


def bcast_bytes(data: bytes | None, root: int) -> bytes:
    """``root``'s bytes on every rank (other ranks' ``data`` is ignored).

    >>> import fluxmpi_py as fm; fm.Init()
    >>> bcast_bytes(b"hi", 0)
    b'hi'
    """
    return C.broadcast_bytes(data if C.rank() == root else None, root)


def raise_together(
    error: BaseException | None, what: str, same: tuple[str, str] | None = None
) -> None:
    """If any rank has an ``error``, raise the lowest such rank's on every rank: the same
    exception type where it is a common one (ValueError, OSError, ...; else RuntimeError),
    its message, and where it came from: ``"<message> (on rank R, in <what>)"``, R its rank
    in the world. The rank that had it chains the original. Returns when no rank has one.
    Runs on the current group (inside ``on_group``, its members alone take part).

    ``same=(noun, value)``: a value every rank must give alike (a checkpoint's path), compared
    in the same small allreduce; where it differs (and no rank has an error) every rank raises
    ValueError naming the first rank that differs, its value and rank 0's.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> raise_together(None, "nothing")
    >>> raise_together(ValueError("bad"), "load")
    Traceback (most recent call last):
    ...
    ValueError: bad (on rank 0, in load)
    """
    group = C.current_group()
    size, rank = group.size, group.rank
    spans = span([rank if error is not None else size] + ([hash64(same[1])] if same else []))
    bad = spans[0][0]
    if bad == size:
        if same is not None and spans[1][0] != spans[1][1]:
            _raise_differing(what, *same)
        return
    mine = b""
    if rank == bad:
        text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        mine = pickle.dumps((type(error).__name__, str(text)))
    name, message = pickle.loads(C.broadcast_bytes(mine if rank == bad else None, bad))
    exc = PORTABLE_ERRORS.get(name, RuntimeError)
    if name not in PORTABLE_ERRORS:
        message = f"{name}: {message}"
    world_rank = group.ranks[bad]
    raised = mark_raised_on_every_rank(exc(f"{message} (on rank {world_rank}, in {what})"))
    if rank == bad:
        raise raised from error
    raise raised


def _raise_differing(what: str, noun: str, value: str) -> None:
    """Every rank (they saw the values differ): ValueError naming the first rank whose
    ``value`` differs from rank 0's."""
    diff = first_difference([value])
    if diff is None:  # unreachable: the hashes differed
        return
    _, rank, theirs, ref0 = diff
    raise mark_raised_on_every_rank(
        ValueError(
            f"{what}: the ranks give different {noun}s: rank {rank} has {theirs!r}, rank 0 has "
            f"{ref0!r}; every rank must give the same {noun}"
        )
    )


def first_difference(items: Sequence[str], noun: str = "items") -> tuple[int, int, str, str] | None:
    """Compare every rank's list of strings with rank 0's. None when all are equal; else
    ``(index, rank, that rank's item, rank 0's item)`` for the lowest index at which some
    rank differs (the lowest such rank). A missing item reads "nothing (it has only N
    <noun>)".

    >>> import fluxmpi_py as fm; fm.Init()
    >>> first_difference(["a", "b"]) is None
    True
    """
    items = list(items)
    h = hash64("\n".join(items))
    (lo_n, hi_n), (lo_h, hi_h) = span([len(items), h])
    if lo_n == hi_n and lo_h == hi_h:
        return None
    size, rank = C.size(), C.rank()
    ref = pickle.loads(bcast_bytes(pickle.dumps(items), 0))

    def item(lst, i):
        return lst[i] if i < len(lst) else f"nothing (it has only {len(lst)} {noun})"

    first = next(
        (i for i, (a, b) in enumerate(zip(items, ref)) if a != b), min(len(items), len(ref))
    )
    if first == len(items) == len(ref):
        first = 1 << 40  # the same as rank 0
    ((key, _),) = span([first * size + rank])
    index, who = divmod(key, size)
    mine = item(items, index).encode() if rank == who else None
    return index, who, bcast_bytes(mine, who).decode(), item(ref, index)


def require_same(
    items: Sequence[str], what: str, noun: str, singular: str, advice: str = ""
) -> None:
    """Collective: return when every rank's ``items`` equal rank 0's; else raise ValueError on
    every rank naming the first one that differs: ``"<what>: the <noun> differ across ranks;
    first difference at <singular> <index>: rank R has ..., rank 0 has ...<advice>"``.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> require_same(["w: shape (3,)"], "doc", "parameters", "parameter")
    """
    diff = first_difference(items, noun)
    if diff is None:
        return
    index, rank, theirs, ref0 = diff
    raise mark_raised_on_every_rank(
        ValueError(
            f"{what}: the {noun} differ across ranks; first difference at {singular} {index}: "
            f"rank {rank} has {theirs}, rank 0 has {ref0}{advice}"
        )
    )
