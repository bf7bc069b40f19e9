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

# --- re-exports (scripts/gen_reexports.py) ---
from .collectives import (
    OPS,
    Iallgather,
    Iallreduce,
    Ialltoall,
    Ibcast,
    Igather,
    Ireduce_scatter,
    Iscatter,
    Request,
    allgather,
    allgather_object,
    allreduce,
    allreduce_,
    alltoall,
    bcast_,
    broadcast,
    broadcast_object,
    gather,
    grouped_allgather,
    grouped_allreduce_,
    grouped_alltoall,
    grouped_bcast_,
    grouped_gather,
    grouped_reduce_scatter,
    grouped_scatter,
    reduce_,
    reduce_scatter,
    scatter,
    set_sum_order,
    sum_order,
)
from .data import (
    DistributedDataContainer,
    DistributedSampler,
    FullDatasetWarning,
    check_dataloader,
)
from .integrations import c10d as _c10d  # noqa: F401  (registers "fluxmpi")
from .runtime import (
    RANK_FORMAT,
    REQUEUE_STATUS,
    Group,
    Init,
    Initialized,
    LaunchError,
    RankFilter,
    RanksLostError,
    add_recovery_hook,
    barrier,
    build_info,
    cudampi_enabled,
    disable_cudampi_support,
    fluxmpi_print,
    fluxmpi_println,
    get_logger,
    launch,
    local_rank,
    new_group,
    node_local_rank,
    node_size,
    on_failure,
    recover,
    recoveries,
    request_stop,
    stop_requested,
    total_workers,
)
from .sync import (
    synchronize_,
)
from .training import (
    DistributedOptimizer,
    GridOverflowError,
    Join,
    SyncBatchNorm,
    allreduce_gradients,
    check_consistency,
    elastic_step,
    latest_checkpoint,
    load_checkpoint,
    record_step,
    save_checkpoint,
    synchronize_buffers_,
)

__all__ = [
    "Init",
    "Initialized",
    "local_rank",
    "total_workers",
    "node_local_rank",
    "node_size",
    "barrier",
    "build_info",
    "stop_requested",
    "request_stop",
    "REQUEUE_STATUS",
    "RanksLostError",
    "recover",
    "recoveries",
    "on_failure",
    "add_recovery_hook",
    "Group",
    "new_group",
    "fluxmpi_print",
    "fluxmpi_println",
    "disable_cudampi_support",
    "cudampi_enabled",
    "launch",
    "LaunchError",
    "get_logger",
    "RankFilter",
    "RANK_FORMAT",
    "allreduce_",
    "bcast_",
    "reduce_",
    "Iallreduce",
    "Ibcast",
    "Request",
    "OPS",
    "set_sum_order",
    "sum_order",
    "allreduce",
    "broadcast",
    "allgather",
    "gather",
    "scatter",
    "reduce_scatter",
    "alltoall",
    "Iallgather",
    "Igather",
    "Iscatter",
    "Ireduce_scatter",
    "Ialltoall",
    "grouped_allgather",
    "grouped_gather",
    "grouped_scatter",
    "grouped_reduce_scatter",
    "grouped_alltoall",
    "grouped_allreduce_",
    "grouped_bcast_",
    "broadcast_object",
    "allgather_object",
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
    "synchronize_",
    "DistributedDataContainer",
    "DistributedSampler",
    "FullDatasetWarning",
    "check_dataloader",
]
