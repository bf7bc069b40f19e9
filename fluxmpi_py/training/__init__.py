"""The training step: DistributedOptimizer, gradient reduction, join, buffers, consistency checks,
SyncBatchNorm and checkpoints."""

# --- re-exports (scripts/gen_reexports.py) ---
from .buffers import (
    synchronize_buffers_,
)
from .checkpoint import (
    load_checkpoint,
    save_checkpoint,
)
from .checkpoint_dir import (
    latest_checkpoint,
)
from .consistency import (
    check_consistency,
)
from .elastic_step import (
    elastic_step,
)
from .exact_sum import (
    GridOverflowError,
)
from .gradients import (
    allreduce_gradients,
)
from .join import (
    Join,
)
from .optimizer import (
    DistributedOptimizer,
)
from .record import (
    record_step,
)
from .sync_batchnorm import (
    SyncBatchNorm,
)

__all__ = [
    "DistributedOptimizer",
    "allreduce_gradients",
    "synchronize_buffers_",
    "save_checkpoint",
    "load_checkpoint",
    "latest_checkpoint",
    "check_consistency",
    "SyncBatchNorm",
    "Join",
    "GridOverflowError",
    "record_step",
    "elastic_step",
]
