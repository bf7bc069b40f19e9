"""Data sharding: DistributedDataContainer and DistributedSampler."""

from .container import (
    DistributedDataContainer,
    FullDatasetWarning,
)
from .sampler import (
    DistributedSampler,
)

__all__ = [
    "DistributedDataContainer",
    "FullDatasetWarning",
    "DistributedSampler",
]
