"""The training step: DistributedOptimizer, gradient reduction, join, buffers, consistency checks,
SyncBatchNorm and checkpoints."""

# --- re-exports (scripts/gen_reexports.py) ---
from .optimizer import (
    DistributedOptimizer,
)
from .gradients import (
    allreduce_gradients,
)
from .buffers import (
    synchronize_buffers_,
)
from .checkpoint import (
    save_checkpoint,
    load_checkpoint,
)
from .checkpoint_dir import (
    latest_checkpoint,
)
from .consistency import (
    check_consistency,
)
from .sync_batchnorm import (
    SyncBatchNorm,
)
from .join import (
    Join,
)
from .exact_sum import (
    GridOverflowError,
)
from .record import (
    record_step,
)
from .elastic_step import (
    elastic_step,
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
