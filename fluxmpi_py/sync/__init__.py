"""synchronize_: one rank's models, optimizers and objects to every rank."""

from .synchronize import (
    synchronize_,
)

__all__ = [
    "synchronize_",
]
