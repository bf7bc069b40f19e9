"""Collectives on tensors and objects: in-place reductions and broadcasts, the row collectives
(gather, scatter, allgather, reduce_scatter, alltoall) and their differentiable forms."""

# --- re-exports (scripts/gen_reexports.py) ---
from .differentiable import (
    allreduce,
    broadcast,
)
from .inplace import (
    OPS,
    Iallreduce,
    Ibcast,
    Request,
    allreduce_,
    bcast_,
    reduce_,
    set_sum_order,
    sum_order,
)
from .objects import (
    allgather_object,
    broadcast_object,
)
from .rows import (
    Iallgather,
    Ialltoall,
    Igather,
    Ireduce_scatter,
    Iscatter,
    allgather,
    alltoall,
    gather,
    grouped_allgather,
    grouped_allreduce_,
    grouped_alltoall,
    grouped_bcast_,
    grouped_gather,
    grouped_reduce_scatter,
    grouped_scatter,
    reduce_scatter,
    scatter,
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
