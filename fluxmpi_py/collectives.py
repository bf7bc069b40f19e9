"""In-place collectives on tensors: allreduce_, bcast_, reduce_, and their async forms.

Every rank must call the same collectives in the same order. Before any data moves, the ranks
compare (in one small allreduce) the call, op, root, dtype and shape; a difference, or a bad
argument on any rank, raises the same exception on every rank instead of hanging.
"""
from __future__ import annotations

import torch

from ._loader import C

__all__ = ["allreduce_", "bcast_", "reduce_", "Iallreduce", "Ibcast", "Request", "OPS"]

OPS = ("sum", "average", "min", "max", "prod")


def _check_tensor(t, name: str = "tensor") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def allreduce_(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Reduce ``tensor`` over all ranks, in place, and return it.

    ``op`` is one of "sum", "average", "min", "max", "prod". float16 and bfloat16 combine in
    fp32; "average" pre-scales them so that the sum cannot overflow. Integer "average" is the
    floor of the mean.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.allreduce_(torch.tensor([1.0, 2.0]) * (fm.local_rank() + 1), op="sum").tolist()
    [1.0, 2.0]
    """
    _check_tensor(tensor)
    C.allreduce_(tensor, str(op))
    return tensor


def bcast_(tensor: torch.Tensor, root_rank: int = 0) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with root_rank's values, in place; return it.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.bcast_(torch.arange(3), root_rank=0).tolist()
    [0, 1, 2]
    """
    _check_tensor(tensor)
    C.bcast_(tensor, int(root_rank))
    return tensor


def reduce_(tensor: torch.Tensor, op: str = "sum", root_rank: int = 0) -> torch.Tensor:
    """Reduce ``tensor`` onto root_rank, in place there; other ranks' tensors are unchanged.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.reduce_(torch.ones(2), op="sum", root_rank=0).tolist()
    [1.0, 1.0]
    """
    _check_tensor(tensor)
    C.reduce_(tensor, str(op), int(root_rank))
    return tensor


class Request:
    """A pending collective. ``wait()`` blocks (without the GIL) and returns the tensor;
    ``test()`` says whether it is done. The engine thread makes progress on its own.

    Errors that the ranks detect together (a mismatch, a bad dtype) are raised by ``wait()``.
    """

    __slots__ = ("_work", "_tensor")

    def __init__(self, work, tensor: torch.Tensor):
        self._work = work
        self._tensor = tensor

    def wait(self) -> torch.Tensor:
        self._work.wait()
        return self._tensor

    def test(self) -> bool:
        return bool(self._work.test())

    def __repr__(self) -> str:
        return f"Request({self._work.what}, done={self.test()})"


def Iallreduce(tensor: torch.Tensor, op: str = "sum") -> Request:
    """Start allreduce_ in the background and return a Request; the result is valid after
    ``wait()``. Do not touch the tensor until then.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Iallreduce(torch.ones(3), op="max").wait().tolist()
    [1.0, 1.0, 1.0]
    """
    _check_tensor(tensor)
    return Request(C.iallreduce_(tensor, str(op)), tensor)


def Ibcast(tensor: torch.Tensor, root_rank: int = 0) -> Request:
    """Start bcast_ in the background and return a Request.

    >>> import torch, fluxmpi_py as fm; fm.Init()
    >>> fm.Ibcast(torch.zeros(2), root_rank=0).wait().tolist()
    [0.0, 0.0]
    """
    _check_tensor(tensor)
    return Request(C.ibcast_(tensor, int(root_rank)), tensor)
