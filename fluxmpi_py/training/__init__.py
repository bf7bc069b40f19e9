"""The training step: DistributedOptimizer, gradient reduction, join, buffers, consistency checks,
SyncBatchNorm and checkpoints."""

# Each public module writes its names once, in its own __all__; the star imports re-export
# them. mypy reads a star import's names as public where the module has no __all__ it can
# read, and a computed one it reads as empty: so it is computed where mypy does not look.
import typing as _typing

from . import buffers as _buffers
from . import checkpoint as _checkpoint
from . import checkpoint_dir as _checkpoint_dir
from . import consistency as _consistency
from . import elastic_step as _elastic_step
from . import exact_sum as _exact_sum
from . import gradients as _gradients
from . import join as _join
from . import optimizer as _optimizer
from . import record as _record
from . import sync_batchnorm as _sync_batchnorm
from .buffers import *  # noqa: F403
from .checkpoint import *  # noqa: F403
from .checkpoint_dir import *  # noqa: F403
from .consistency import *  # noqa: F403
from .elastic_step import *  # noqa: F403
from .exact_sum import *  # noqa: F403
from .gradients import *  # noqa: F403
from .join import *  # noqa: F403
from .optimizer import *  # noqa: F403
from .record import *  # noqa: F403
from .sync_batchnorm import *  # noqa: F403

if not _typing.TYPE_CHECKING:
    __all__ = [
        *_optimizer.__all__,
        *_gradients.__all__,
        *_buffers.__all__,
        *_checkpoint.__all__,
        *_checkpoint_dir.__all__,
        *_consistency.__all__,
        *_sync_batchnorm.__all__,
        *_join.__all__,
        *_exact_sum.__all__,
        *_record.__all__,
        *_elastic_step.__all__,
    ]
