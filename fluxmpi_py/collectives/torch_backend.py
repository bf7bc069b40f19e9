"""The collectives of a torch.distributed group on fluxmpi_py's engine: the compiled c10d
``Backend`` (csrc/c10d/), whose calls take the same agreement, stall watch and backends as the
in-place and row collectives. For the c10d face (:mod:`fluxmpi_py.integrations.c10d`), which
hands it to torch through ``Backend.register_backend``.
"""

from __future__ import annotations

import torch

from .._core import C
from ..runtime.groups import Group


def torch_backend(
    group_rank: int, group_size: int, group: Group | None = None
) -> torch._C._distributed_c10d.Backend:
    """A ``torch.distributed`` backend for a process group of ``group_size`` ranks in which
    this one is ``group_rank``: on the world (``group`` None; its size must be the world's),
    or on ``group`` (one made with :func:`fluxmpi_py.runtime.groups.new_local_group` in the
    process group's rank order). Call after ``Init``.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> torch_backend(fm.local_rank(), fm.total_workers()).size() == fm.total_workers()
    True
    """
    if group is None:
        return C.c10d_backend(group_rank, group_size)
    if not isinstance(group, Group):
        raise TypeError(
            f"torch_backend: group must be a fluxmpi_py.Group, got {type(group).__name__}"
        )
    return C.c10d_backend(group_rank, group_size, group._handle)
