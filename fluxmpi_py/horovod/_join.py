"""``hvd.join()`` with plain allreduces: Horovod's joined ranks take part in the others'
``hvd.allreduce`` (and its in-place, async and grouped forms) with zeros.

Each world allreduce of the hvd face starts with the join round of :mod:`fluxmpi_py.join`
(one 104-byte allreduce) under the index :data:`ALLREDUCE`. When the round counts fewer
active ranks than the world, the active ranks send what they reduce (shapes, dtypes, op) in
one object allgather, and each joined rank reduces zeros of those shapes with them. Other
collectives issued while a rank has joined raise on the active ranks (Horovod's
semantics); the joined ranks keep waiting.

The round costs every world ``hvd.allreduce`` a small collective whether or not any rank
ever joins: measured 119 us against 30 us for a 1 KiB allreduce, 2.8 ms against 0.9 ms for
1 MiB (2 ranks on 2 shared cores, one launch). ``FLUXMPI_HVD_JOIN_ALLREDUCE=0`` (read at
import) leaves it out: a plain allreduce issued while a rank has joined then raises on the
active ranks instead. ``hvd.DistributedOptimizer`` steps keep their round either way.
"""

from __future__ import annotations

import os

import torch

from .._loader import C
from ..join import round_
from ..object_collectives import allgather_object
from ._optimizer import JOIN

#: The round index of a plain allreduce (optimizer steps use 0, 1, ...).
ALLREDUCE = -2

#: Whether world hvd.allreduce calls take the join round (see the module docstring).
ENABLED = os.environ.get("FLUXMPI_HVD_JOIN_ALLREDUCE", "1") != "0"


def before_allreduce(tensors, op: str, grouped: bool) -> None:
    """An active rank's round before a world allreduce of ``tensors`` (nothing inside a
    process set's group); when some rank has joined, tell the joined ranks what to reduce.
    Tensors the allreduce will reject skip the round: the allreduce raises on every rank."""
    if not ENABLED or C.size() == 1 or C.current_group().size != C.size():
        return
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return
    count, _ = round_(JOIN, ALLREDUCE, active=True)
    if count < C.size():
        desc = [(tuple(t.shape), t.dtype, t.device.type) for t in tensors]
        allgather_object((op, grouped, desc))


def _zeros(shape, dtype, device_type):
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else None
    return torch.zeros(shape, dtype=dtype, device=device)


def _shadow(index: int, count: int) -> None:
    """A joined rank's part in the active ranks' allreduce: the same call on zeros."""
    from .. import gather_collectives as gc
    from ..collectives import allreduce_

    if index != ALLREDUCE:
        raise RuntimeError(f"hvd.join: unknown round {index} from the active ranks")
    descs = [d for d in allgather_object(None) if d is not None]
    op, grouped, desc = descs[0]
    zeros = [_zeros(*d) for d in desc]
    if grouped:
        gc.grouped_allreduce_(zeros, op)
    else:
        allreduce_(zeros[0], op)


JOIN.on_other = _shadow
JOIN.keep_waiting = True
