"""The runtime: Init and the world, groups, printing, preferences, stall settings, launch and logs."""

# --- re-exports (scripts/gen_reexports.py) ---
from .world import (
    Init,
    Initialized,
    local_rank,
    total_workers,
    node_local_rank,
    node_size,
    barrier,
    build_info,
)
from .stop import (
    stop_requested,
    request_stop,
    REQUEUE_STATUS,
)
from .elastic import (
    RanksLostError,
    recover,
    recoveries,
    on_failure,
    add_recovery_hook,
)
from .groups import (
    Group,
    new_group,
)
from .printing import (
    fluxmpi_print,
    fluxmpi_println,
)
from .preferences import (
    disable_cudampi_support,
    cudampi_enabled,
)
from .launch import (
    launch,
    LaunchError,
)
from .logs import (
    get_logger,
    RankFilter,
    RANK_FORMAT,
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
]
