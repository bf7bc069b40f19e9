"""synchronize_: one rank's models, optimizers and objects to every rank."""

# --- re-exports (scripts/gen_reexports.py) ---
from .synchronize import (
    synchronize_,
)

__all__ = [
    "synchronize_",
]
