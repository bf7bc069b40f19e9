"""Data sharding: DistributedDataContainer and DistributedSampler."""

# --- re-exports (scripts/gen_reexports.py) ---
from .container import (
    DistributedDataContainer,
)
from .sampler import (
    DistributedSampler,
    FullDatasetWarning,
    check_dataloader,
)

__all__ = [
    "DistributedDataContainer",
    "DistributedSampler",
    "FullDatasetWarning",
    "check_dataloader",
]
