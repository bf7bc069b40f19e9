"""Collectives on picklable Python objects: broadcast_object and allgather_object.

The objects travel pickled (``pickle.HIGHEST_PROTOCOL``) over MPI; their sizes are agreed
before the bytes move. An object that does not pickle raises on every rank.
"""

from __future__ import annotations

import pickle
from typing import Any

from .._core import C, parse_root
from ..runtime.groups import group_dispatch

__all__ = ["broadcast_object", "allgather_object"]


def _pickled(obj) -> tuple[bytes, str]:
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), ""
    except Exception as e:  # any error of pickling: reported by every rank
        return b"", f"the object does not pickle: {type(e).__name__}: {e}"


@group_dispatch("broadcast_object()")
def broadcast_object(obj: Any, root_rank: int = 0, *, group=None, name: str | None = None) -> Any:
    """root_rank's ``obj`` on every rank (the root gets its own object back; the others an
    unpickled copy). A collective.

    Args:
        obj: the object to send, read on ``root_rank`` only; it must pickle.

    Returns:
        root_rank's object.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.broadcast_object({"step": 10 + fm.local_rank()}, root_rank=0)
    {'step': 10}
    """
    root, error = parse_root(root_rank)
    data = None
    if C.initialized() and C.current_group().rank == root and not error:
        data, error = _pickled(obj)
    out = C.broadcast_object_bytes(data, root, error)
    return obj if out is None else pickle.loads(out)


@group_dispatch("allgather_object()")
def allgather_object(obj: Any, *, group=None, name: str | None = None) -> list:
    """Every rank's ``obj``, in rank order (this rank's own object at its place; the others'
    unpickled copies). A collective.

    Args:
        obj: this rank's object; it must pickle.

    Returns:
        A list of ``total_workers()`` objects (of the group's size with ``group``).

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.allgather_object(fm.local_rank()) == list(range(fm.total_workers()))
    True
    """
    data, error = _pickled(obj)
    out = C.allgather_object_bytes(data, error)
    me = C.current_group().rank
    return [obj if r == me else pickle.loads(b) for r, b in enumerate(out)]
