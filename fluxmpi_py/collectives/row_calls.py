"""The one way Python calls the compiled row collectives and grouped forms
(csrc/ops/gather_collectives.h): argument checks that do not raise on this rank alone but
travel to the compiled core as text, so that every rank raises together; the name of the
user's call for messages; and the Request of an async call.

Public for faces built on fluxmpi_py (``fluxmpi_py.horovod``), which need what the functions
of :mod:`.rows` keep to themselves: their own call name in messages, and the rows each rank
sent (``received_splits`` of :func:`start`'s result), e.g. for a backward pass.
"""

from __future__ import annotations

import operator

import torch

from .._core import C, parse_root
from ..runtime.entry import local_call
from .inplace import Request


class PendingRequest(Request):
    """A :class:`Request` whose result is made by the call (a new tensor, or a list).

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> req = fm.Iallgather(torch.ones(2))
    >>> req.wait().shape[0] == 2 * fm.total_workers(), req.test()
    (True, True)
    """

    __slots__ = ("_finish",)

    def __init__(self, pending, finish):
        super().__init__(pending, None)
        self._finish = finish

    @local_call
    def wait(self):
        """Block until done; return the result."""
        return self._finish(self._work.wait(), self._work)


# The kinds whose compiled call takes the list as it is and checks its items itself (at C
# speed; a Python loop over a thousand tensors costs more than the collective's checks).
_CHECKS_ITEMS = frozenset({"grouped_allreduce_", "grouped_bcast_"})


def _tensors(tensors, grouped: bool, errors: list):
    if not grouped:
        if isinstance(tensors, torch.Tensor):
            return [tensors]
        errors.append(f"tensor must be a torch.Tensor, got {type(tensors).__name__}")
        return []
    if not isinstance(tensors, (list, tuple)):
        errors.append(f"tensors must be a list of torch.Tensor, got {type(tensors).__name__}")
        return []
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            errors.append(f"tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")
            return []
    return list(tensors)


def _ints(values) -> list[int]:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    return [operator.index(v) for v in values]


def _splits(splits, grouped: bool, errors: list) -> list[list[int]]:
    """[] for equal parts; else one list of row counts per tensor ([] for equal parts)."""
    if splits is None:
        return []
    try:
        if grouped:
            return [[] if s is None else _ints(s) for s in splits]
        return [_ints(splits)]
    except TypeError:
        errors.append(f"splits must be a list of ints (rows per rank), got {splits!r}")
        return []


def _flag(name: str, value, errors: list) -> bool:
    """``value`` as a bool where it is one (an int 0 or 1 too); else False, with the error."""
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    errors.append(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return False


def _root(root_rank, errors: list) -> int:
    root, error = parse_root(root_rank)
    if error:
        errors.append(error)
    return root


def start(
    kind: str, tensors, *, grouped: bool, async_op: bool, call: str, error="", grad=False, **args
):
    """Start the compiled ``kind`` ("allgather", "gather", "scatter", "reduce_scatter",
    "alltoall", "grouped_allreduce_", "grouped_bcast_") on one tensor (``grouped=False``) or
    a list, on the current group; ``call`` names it in messages. Returns its pending call:
    ``wait()`` gives the list of result tensors, ``received_splits`` then the rows received
    from each rank, one list per tensor (pass it to :func:`finish` for the caller's result).
    ``args``: root_rank, op, splits, as the kind takes them; ``error``: a TypeError the caller
    found, raised by the call on every rank; ``grad`` (the single-tensor row collectives): the
    differentiable form, which the ranks agree on.

    >>> import torch, fluxmpi_py as fm; fm.Init(); n = fm.total_workers()
    >>> p = start("alltoall", torch.ones(n), grouped=False, async_op=False, call="mine()", splits=[1] * n)
    >>> p.wait()[0].tolist() == [1.0] * n, p.received_splits == [[1] * n]
    (True, True)
    """
    errors: list[str] = [error] if error else []
    if type(async_op) is not bool:
        async_op = _flag("async_op", async_op, errors)
    if async_op and not grouped:
        call = "I" + call  # the name the user called: Iallgather()
    if kind in _CHECKS_ITEMS and type(tensors) in (list, tuple):
        ts = tensors
    else:
        ts = _tensors(tensors, grouped, errors)
    pos = [ts]
    if "op" in args:
        pos.append(args["op"] if type(args["op"]) is str else str(args["op"]))
    if "splits" in args:
        pos.append(_splits(args["splits"], grouped, errors))
    if "root_rank" in args:
        pos.append(_root(args["root_rank"], errors))
    if grad:
        return getattr(C, kind)(*pos, call, async_op, "; ".join(errors), True)
    return getattr(C, kind)(*pos, call, async_op, "; ".join(errors))


def first(tensors, _pending):
    """A result of :func:`finish`: the one tensor of a single-tensor call."""
    return tensors[0]


def first_or_none(tensors, _pending):
    """A result of :func:`finish`: the one tensor, or None where the call gave none (gather
    off the root)."""
    return tensors[0] if tensors else None


def as_list(tensors, _pending):
    """A result of :func:`finish`: the list of a grouped call."""
    return list(tensors)


def finish(pending, async_op: bool, result):
    """The call's result now (blocking), or a Request for it."""
    if async_op:
        return PendingRequest(pending, result)
    return result(pending.wait(), pending)
