"""synchronize_: one rank's models, optimizers and objects to every rank."""

# Each public module writes its names once, in its own __all__; the star imports re-export
# them. mypy reads a star import's names as public where the module has no __all__ it can
# read, and a computed one it reads as empty: so it is computed where mypy does not look.
import typing as _typing

from . import synchronize as _synchronize
from .synchronize import *  # noqa: F403

if not _typing.TYPE_CHECKING:
    __all__ = [
        *_synchronize.__all__,
    ]
