"""fluxmpi_py: FluxMPI-style data-parallel training for PyTorch.

    import fluxmpi_py as fm
    fm.Init()
    fm.synchronize_(model)
    opt = fm.DistributedOptimizer(torch.optim.AdamW(model.parameters()))
    data = fm.DistributedDataContainer(dataset, shuffle=True)

Run with ``mpiexec -n N python train.py``; ``python train.py`` (or Jupyter) is a world of one.
Each submodule lists its public names in ``__all__``; this package re-exports all of them.
"""

import importlib as _importlib
import os as _os

# Open MPI busy-polls while a rank waits in a collective. With the gradient reduction on its own
# thread, that spinning takes the core from backward whenever a rank has no spare core (2 ranks
# on 2 cores here): a training step measured 1.2x the raw-MPI time with polling and 0.98-1.02x
# with yielding (benchmarks/bench_train_step.py). Open MPI reads this when MPI starts, so it is
# set here, before Init or mpi4py can start MPI; a value the user set is kept.
_os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")

__version__ = "0.1.0"

# One role per module; each lists its public names in __all__.
_MODULES = (
    "runtime",
    "groups",
    "printing",
    "preferences",
    "collectives",
    "differentiable",
    "gather_collectives",
    "object_collectives",
    "optimizer",
    "gradients",
    "buffers",
    "sync",
    "data",
    "sampler",
    "launch",
    "checkpoint",
    "logs",
    "consistency",
    "sync_batchnorm",
    "join",
    "c10d",
)

__all__ = []
for _name in _MODULES:
    _mod = _importlib.import_module(f".{_name}", __name__)
    for _sym in _mod.__all__:
        globals()[_sym] = getattr(_mod, _sym)
    __all__ += list(_mod.__all__)
del _importlib, _os, _name, _mod, _sym
