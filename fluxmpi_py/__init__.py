"""fluxmpi_py: FluxMPI-style data-parallel training for PyTorch.

    import fluxmpi_py as fm
    fm.Init()
    fm.synchronize_(model)
    opt = fm.DistributedOptimizer(torch.optim.AdamW(model.parameters()))
    data = fm.DistributedDataContainer(dataset, shuffle=True)

Run with ``mpiexec -n N python train.py``; ``python train.py`` (or Jupyter) is a world of one.
The package is layered (docs/DEVELOPING.md): ``_core`` (the only module that imports ``_C``),
``runtime``, ``collectives``, ``sync`` and ``data``, ``training``, ``integrations``. Each subpackage
lists its public names in ``__all__``; this module re-exports them, so users write ``fm.X``.
"""

import os as _os

# Open MPI busy-polls while a rank waits in a collective. With the gradient reduction on its own
# thread, that spinning takes the core from backward whenever a rank has no spare core (2 ranks
# on 2 cores here): a training step measured 1.2x the raw-MPI time with polling and 0.98-1.02x
# with yielding (benchmarks/bench_train_step.py). Open MPI reads this when MPI starts, so it is
# set here, before Init or mpi4py can start MPI; a value the user set is kept.
_os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
del _os

__version__ = "0.1.0"

# Each layer's public names are its modules' __all__ (see runtime/__init__.py); the star
# imports re-export them as fm.X, and __all__ is theirs in the layers' order (computed where
# mypy does not look, as there).
import typing as _typing

from . import collectives, data, runtime, sync, training
from .collectives import *  # noqa: F403
from .data import *  # noqa: F403
from .integrations import c10d as _c10d  # noqa: F401  (registers "fluxmpi")
from .runtime import *  # noqa: F403
from .sync import *  # noqa: F403
from .training import *  # noqa: F403

if not _typing.TYPE_CHECKING:
    __all__ = [
        *runtime.__all__,
        *collectives.__all__,
        *training.__all__,
        *sync.__all__,
        *data.__all__,
    ]
