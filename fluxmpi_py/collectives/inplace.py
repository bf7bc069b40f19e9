"""In-place collectives on tensors: allreduce_, bcast_, reduce_, and their async forms.

Every rank must call the same collectives in the same order. Before any data moves, the ranks
compare (in one small allreduce, which carries a small call's data too) the call, op, root,
dtype and shape; a difference, or a bad argument on any rank, raises the same exception on
every rank instead of hanging.

Supported dtypes: float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8 (and
bool). Any strided tensor works, contiguous or not (a transposed view, a strided slice): the
result is written back into it. Host tensors travel through MPI; CUDA tensors through NCCL in
builds with CUDA.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from .._core import REDUCE_OPS, ROOT_LIMIT, C, parse_root
from ..runtime.agreement import debug_box
from ..runtime.entry import local_call, mark, pass_on
from ..runtime.groups import group_dispatch
from ..runtime.pending_steps import PENDING

__all__ = [
    "allreduce_",
    "bcast_",
    "reduce_",
    "Iallreduce",
    "Ibcast",
    "Request",
    "OPS",
    "set_sum_order",
    "sum_order",
]

OPS = REDUCE_OPS
"""The reduction op names every reducing collective accepts: ``("sum", "average", "min",
"max", "prod", "band", "bor", "bxor")``; ``"mean"`` and ``"avg"`` are also taken for
``"average"``."""


_NO_ROOT = object()


def _call(fn, tensor, *args, root_rank=_NO_ROOT):
    """Call the compiled collective ``fn(tensor, *args[, root_rank])``. The common case
    costs two type checks. A wrong argument type is not raised here, on this rank alone:
    it is passed on as text, and the compiled core raises it on every rank together, so
    that no rank is left waiting in the collective."""
    has_root = root_rank is not _NO_ROOT
    if isinstance(tensor, torch.Tensor) and (
        not has_root or (type(root_rank) is int and -ROOT_LIMIT <= root_rank < ROOT_LIMIT)
    ):
        return fn(tensor, *args, root_rank) if has_root else fn(tensor, *args)
    errors = []
    if not isinstance(tensor, torch.Tensor):
        errors.append(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        tensor = None
    root = ()
    if has_root:
        value, error = parse_root(root_rank)
        root = (value,)
        if error:
            errors.append(error)
    return fn(tensor, *args, *root, "; ".join(errors))


# The hot calls: allreduce_, bcast_ and reduce_ of a tensor, with no group=, no name= and not in
# the detail debug mode, go straight to the compiled call (one Python frame: about 0.15 µs
# instead of 0.5-0.8 through group_dispatch's generic wrapper, docs/measurements.md). What
# they do on an error is group_dispatch's common case itself: `pass_on` with the agreements'
# count read before the call. Every other call takes the general form, through group_dispatch,
# and so does every call while this rank has a backward pass open (runtime/pending_steps.py).
_agreements = C.thread_agreements
_Tensor = torch.Tensor
_allreduce_c, _bcast_c, _reduce_c = C.allreduce_, C.bcast_, C.reduce_


def _allreduce(tensor, op="sum", *, group=None, name=None):
    _call(C.allreduce_, tensor, op if type(op) is str else str(op))
    return tensor


def _bcast(tensor, root_rank=0, *, group=None, name=None):
    _call(C.bcast_, tensor, root_rank=root_rank)
    return tensor


def _reduce(tensor, op="sum", root_rank=0, *, group=None, name=None):
    _call(C.reduce_, tensor, op if type(op) is str else str(op), root_rank=root_rank)
    return tensor


_allreduce_general = group_dispatch("allreduce_()")(_allreduce)
_bcast_general = group_dispatch("bcast_()")(_bcast)
_reduce_general = group_dispatch("reduce_()")(_reduce)


def allreduce_(
    tensor: torch.Tensor, op: str = "sum", *, group=None, name: str | None = None
) -> torch.Tensor:
    """Reduce ``tensor`` over all ranks, in place, and return it. A collective.

    ``op`` is one of "sum", "average", "min", "max", "prod", or the bitwise "band", "bor",
    "bxor" (integer and bool CPU tensors; a float tensor is a TypeError); "avg" and "mean" are
    spellings of "average", "product" of "prod". Another name raises ValueError listing these. float16 and bfloat16 sums,
    products and averages are computed in fp32 and rounded once (so 4 ranks averaging
    40000.0 in float16 get 40000.0, not inf); sums in gloo's order (:func:`set_sum_order`)
    round every addition, as gloo does. Integer "average" is the floor of the mean,
    summed in int64 so that it cannot wrap. Complex tensors take "sum" and "average" (as pairs
    of reals); :func:`bcast_`, :func:`reduce_`, reduce_scatter (sum, average) and the
    collectives that only move data (the gathers, scatter, alltoall, grouped_bcast_) take them
    too.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> t = torch.tensor([1.0, 2.0]) * (fm.local_rank() + 1)
    >>> n = fm.total_workers()
    >>> fm.allreduce_(t, op="sum").tolist() == [n * (n + 1) / 2, n * (n + 1)]
    True

    With ``group=`` (:func:`new_group`) the members reduce among themselves.
    """
    if (
        group is None
        and name is None
        and type(op) is str
        and isinstance(tensor, _Tensor)
        and debug_box[0] != "detail"
        and not PENDING
    ):
        start = _agreements()
        try:
            _allreduce_c(tensor, op)
        except Exception as e:
            pass_on(e, start, "allreduce_()")
        return tensor
    return _allreduce_general(tensor, op, group=group, name=name)


def bcast_(
    tensor: torch.Tensor, root_rank: int = 0, *, group=None, name: str | None = None
) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with root_rank's values, in place; return it.
    A collective: every rank passes a tensor of the same shape and dtype.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.bcast_(torch.full((3,), float(fm.local_rank())), root_rank=0).tolist()
    [0.0, 0.0, 0.0]

    With ``group=``, ``root_rank`` is a rank in the group.
    """
    if (
        group is None
        and name is None
        and isinstance(tensor, _Tensor)
        and type(root_rank) is int
        and -ROOT_LIMIT <= root_rank < ROOT_LIMIT
        and debug_box[0] != "detail"
        and not PENDING
    ):
        start = _agreements()
        try:
            _bcast_c(tensor, root_rank)
        except Exception as e:
            pass_on(e, start, "bcast_()")
        return tensor
    return _bcast_general(tensor, root_rank, group=group, name=name)


def reduce_(
    tensor: torch.Tensor,
    op: str = "sum",
    root_rank: int = 0,
    *,
    group=None,
    name: str | None = None,
) -> torch.Tensor:
    """Reduce ``tensor`` onto root_rank, in place there, and return it. Other ranks' tensors
    are left unchanged. A collective; ``op`` as for :func:`allreduce_`.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> t = fm.reduce_(torch.ones(2), op="sum", root_rank=0)
    >>> t.tolist() == ([float(fm.total_workers())] * 2 if fm.local_rank() == 0 else [1.0, 1.0])
    True
    """
    if (
        group is None
        and name is None
        and type(op) is str
        and isinstance(tensor, _Tensor)
        and type(root_rank) is int
        and -ROOT_LIMIT <= root_rank < ROOT_LIMIT
        and debug_box[0] != "detail"
        and not PENDING
    ):
        start = _agreements()
        try:
            _reduce_c(tensor, op, root_rank)
        except Exception as e:
            pass_on(e, start, "reduce_()")
        return tensor
    return _reduce_general(tensor, op, root_rank, group=group, name=name)


for _hot in (allreduce_, bcast_, reduce_):
    mark(_hot, "group")


def raise_in_collective(
    error: str, tensor: torch.Tensor | None = None, *, like: str = "allreduce_"
) -> NoReturn:
    """Enter the collective ``like`` ("allreduce_" or "bcast_" of ``tensor``; by default one
    float) on the current group with ``error``, this rank's verdict on its own arguments: the
    ranks' agreement raises it on every rank of the group together, each inside whatever
    collective it called, instead of leaving them waiting for this one. For a face's argument
    rules that the compiled calls cannot check (Horovod's ``name=`` and root rules). Raises a
    TypeError naming the call, this rank and ``error``; never returns.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> raise_in_collective("root 7 is not in the set")
    Traceback (most recent call last):
    ...
    TypeError: allreduce_(): rank 0: root 7 is not in the set
    """
    if like not in ("allreduce_", "bcast_"):
        raise ValueError(
            f"raise_in_collective: like must be 'allreduce_' or 'bcast_', got {like!r}"
        )
    if not error:
        raise ValueError("raise_in_collective: error must be a non-empty text")
    tensor = torch.zeros(1) if tensor is None else tensor
    if like == "bcast_":
        C.bcast_(tensor, 0, error)
    else:
        C.allreduce_(tensor, "sum", error)
    raise AssertionError(f"unreachable: the agreement raises {error!r}")


@local_call
class Request:
    """A collective running in the background (made by :func:`Iallreduce`, :func:`Ibcast`).

    ``wait()`` blocks (without holding the GIL) until it is done and returns the tensor;
    ``test()`` says whether it is done, without blocking. Requests complete in the order
    they were started, and progress does not depend on calling either: one engine thread
    runs them. Errors the ranks detect together (a mismatch, a bad dtype) are raised by
    ``wait()``, on every rank.

    Args:
        work: the running collective; Requests are made by the ``I`` calls, not by hand.
        tensor: the tensor that holds the result after ``wait()``.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> req = fm.Iallreduce(torch.ones(4))
    >>> req.wait().tolist() == [float(fm.total_workers())] * 4, req.test()
    (True, True)
    """

    __slots__ = ("_work", "_tensor")

    def __init__(self, work, tensor: torch.Tensor):
        self._work = work
        self._tensor = tensor

    @local_call
    def wait(self) -> torch.Tensor:
        """Block until done; return the tensor, which then holds the result."""
        self._work.wait()
        return self._tensor

    @local_call
    def test(self) -> bool:
        """True once done (the result, or the error that wait() raises, is then ready)."""
        return bool(self._work.test())

    def __repr__(self) -> str:
        return f"Request({self._work.what}, done={self.test()})"


@group_dispatch("Iallreduce()")
def Iallreduce(
    tensor: torch.Tensor, op: str = "sum", *, group=None, name: str | None = None
) -> Request:
    """Start :func:`allreduce_` in the background and return a :class:`Request`. The tensor
    holds the result after ``wait()``; do not read or write it before then.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Iallreduce(torch.ones(3), op="max").wait().tolist()
    [1.0, 1.0, 1.0]
    """
    return Request(_call(C.iallreduce_, tensor, op if type(op) is str else str(op)), tensor)


@group_dispatch("Ibcast()")
def Ibcast(
    tensor: torch.Tensor, root_rank: int = 0, *, group=None, name: str | None = None
) -> Request:
    """Start :func:`bcast_` in the background and return a :class:`Request`.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Ibcast(torch.full((2,), float(fm.local_rank())), root_rank=0).wait().tolist()
    [0.0, 0.0]
    """
    return Request(_call(C.ibcast_, tensor, root_rank=root_rank), tensor)


@local_call
def set_sum_order(order: str) -> None:
    """Choose how float sums over 3 or more ranks order their additions: "fastest" (the
    default) or "gloo". Not a collective; every rank must choose the same.

    A sum of three or more floats rounds differently in different orders. With "gloo",
    :func:`allreduce_` and ``torch.distributed.all_reduce`` sums of host tensors (float32,
    float64, float16, bfloat16) add each element's ranks in the order of torch's gloo backend,
    so that DDP on the "fluxmpi" backend trains bit for bit as DDP on gloo (the guide's
    [For DDP users][ddp-guide], with its cost). Single-tensor host sums only: grouped calls,
    reduce_, reduce_scatter, the DistributedOptimizer's gradients and CUDA tensors keep their
    own order. ``FLUXMPI_SUM_ORDER=gloo`` in the environment sets it at the first sum. Ranks
    whose orders differ raise a RuntimeError on every rank at their next sum, naming both.

    Args:
        order: ``"fastest"`` or ``"gloo"`` (the additions in torch's gloo order).

    Raises:
        TypeError: ``order`` is not a string.
        ValueError: ``order`` is neither name.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.set_sum_order("gloo"); fm.sum_order()
    'gloo'
    >>> fm.set_sum_order("fastest")
    """
    if not isinstance(order, str):
        raise TypeError(f'the sum order is "fastest" or "gloo", got {type(order).__name__}')
    C.set_sum_order(order)


@local_call
def sum_order() -> str:
    """This process's sum order, "fastest" or "gloo" (see :func:`set_sum_order`).

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.sum_order()
    'fastest'
    """
    return C.sum_order()
