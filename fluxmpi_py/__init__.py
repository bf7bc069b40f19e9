"""fluxmpi_py: FluxMPI-style data-parallel training for PyTorch.

    import fluxmpi_py as fm
    fm.Init()
    fm.synchronize_(model)
    opt = fm.DistributedOptimizer(torch.optim.AdamW(model.parameters()))
    data = fm.DistributedDataContainer(dataset, shuffle=True)

Run with ``mpiexec -n N python train.py``; ``python train.py`` (or Jupyter) is a world of one.
"""
from .runtime import (  # noqa: F401
    Init,
    Initialized,
    barrier,
    build_info,
    cudampi_enabled,
    disable_cudampi_support,
    fluxmpi_print,
    fluxmpi_println,
    local_rank,
    node_local_rank,
    total_workers,
)
from .collectives import OPS, Iallreduce, Ibcast, Request, allreduce_, bcast_, reduce_  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "Init", "Initialized", "local_rank", "total_workers", "node_local_rank", "barrier",
    "build_info", "fluxmpi_print", "fluxmpi_println", "disable_cudampi_support",
    "cudampi_enabled", "allreduce_", "bcast_", "reduce_", "Iallreduce", "Ibcast", "Request",
    "OPS",
]
