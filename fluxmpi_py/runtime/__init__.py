"""The runtime: Init and the world, groups, printing, preferences, stall settings, launch and logs."""

# --- re-exports (scripts/gen_reexports.py) ---
from .elastic import (
    RanksLostError,
    add_recovery_hook,
    on_failure,
    recover,
    recoveries,
)
from .groups import (
    Group,
    new_group,
)
from .launch import (
    LaunchError,
    launch,
)
from .logs import (
    RANK_FORMAT,
    RankFilter,
    get_logger,
)
from .preferences import (
    cudampi_enabled,
    disable_cudampi_support,
)
from .printing import (
    fluxmpi_print,
    fluxmpi_println,
)
from .stop import (
    REQUEUE_STATUS,
    request_stop,
    stop_requested,
)
from .world import (
    Init,
    Initialized,
    barrier,
    build_info,
    local_rank,
    node_local_rank,
    node_size,
    total_workers,
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
