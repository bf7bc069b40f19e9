"""Collectives on tensors and objects: in-place reductions and broadcasts, the row collectives
(gather, scatter, allgather, reduce_scatter, alltoall) and their differentiable forms."""

# --- re-exports (scripts/gen_reexports.py) ---
from .inplace import (
    allreduce_,
    bcast_,
    reduce_,
    Iallreduce,
    Ibcast,
    Request,
    OPS,
    set_sum_order,
    sum_order,
)
from .differentiable import (
    allreduce,
    broadcast,
)
from .rows import (
    allgather,
    gather,
    scatter,
    reduce_scatter,
    alltoall,
    Iallgather,
    Igather,
    Iscatter,
    Ireduce_scatter,
    Ialltoall,
    grouped_allgather,
    grouped_gather,
    grouped_scatter,
    grouped_reduce_scatter,
    grouped_alltoall,
    grouped_allreduce_,
    grouped_bcast_,
)
from .objects import (
    broadcast_object,
    allgather_object,
)

__all__ = [
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
]
