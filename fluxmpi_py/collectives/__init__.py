"""Collectives on tensors and objects: in-place reductions and broadcasts, the row collectives
(gather, scatter, allgather, reduce_scatter, alltoall) and their differentiable forms."""

# Each public module writes its names once, in its own __all__; the star imports re-export
# them. mypy reads a star import's names as public where the module has no __all__ it can
# read, and a computed one it reads as empty: so it is computed where mypy does not look.
import typing as _typing

from . import differentiable as _differentiable
from . import inplace as _inplace
from . import objects as _objects
from . import rows as _rows
from .differentiable import *  # noqa: F403
from .inplace import *  # noqa: F403
from .objects import *  # noqa: F403
from .rows import *  # noqa: F403

if not _typing.TYPE_CHECKING:
    __all__ = [
        *_inplace.__all__,
        *_differentiable.__all__,
        *_rows.__all__,
        *_objects.__all__,
    ]
