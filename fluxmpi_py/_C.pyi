# Type stubs for fluxmpi_py._C, the compiled core (csrc/python/). Users call the fluxmpi_py
# package; this module is its private half. tests/test_stub.py checks that every public name of
# the built module is here and every name here is in the module.
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch

compiled_torch_version: str

# ---- runtime (bind_runtime.cpp) -----------------------------------------------------------
def init(comm_handle: int = 0) -> None: ...
def initialized() -> bool: ...
def shutdown() -> None: ...
def abort(why: str, code: int = 1) -> None: ...
def meet_before_abort(timeout_s: float) -> bool: ...
def enter_user_call(name: str) -> bool: ...
def leave_user_call(entered: bool) -> None: ...
def rank() -> int: ...
def size() -> int: ...
def node_rank() -> int: ...
def node_size() -> int: ...
def thread_level() -> int: ...
def mpi_library_version() -> str: ...
def mpi_standard_version() -> str: ...
def compiled_with_cuda() -> bool: ...
def nccl_version() -> str: ...
def barrier() -> None: ...

# ---- collectives (bind_collectives.cpp) ---------------------------------------------------
class Work:
    def wait(self) -> None: ...
    def test(self) -> bool: ...
    @property
    def what(self) -> str: ...

def allreduce_(tensor: torch.Tensor | None, op: str, local_error: str = "") -> None: ...
def bcast_(tensor: torch.Tensor | None, root_rank: int, local_error: str = "") -> None: ...
def reduce_(
    tensor: torch.Tensor | None, op: str, root_rank: int, local_error: str = ""
) -> None: ...
def iallreduce_(tensor: torch.Tensor | None, op: str, local_error: str = "") -> Work: ...
def ibcast_(tensor: torch.Tensor | None, root_rank: int, local_error: str = "") -> Work: ...

class RingOptions:
    """When the MPI ring allreduce runs and how it cuts its messages (bytes); the same on every
    rank."""

    enabled: bool
    sum_min_bytes: int
    average_min_bytes: int
    min_segment_bytes: int
    max_segment_bytes: int
    def __init__(
        self,
        *,
        enabled: bool = True,
        sum_min_bytes: int = 16 << 20,
        average_min_bytes: int = 1 << 20,
        min_segment_bytes: int = 256 << 10,
        max_segment_bytes: int = 2 << 20,
    ) -> None: ...

def ring_options() -> RingOptions: ...
def set_ring_options(options: RingOptions) -> None: ...
def ring_calls() -> int: ...

# ---- node-aware allreduce (bind_hierarchical.cpp) ------------------------------------------
class HierarchicalOptions:
    """How the MPI backend's allreduce runs in jobs spanning hosts with more than one rank on a
    host: when the node-aware path runs (bytes), and whether the ring may; the same on every
    rank."""

    enabled: bool
    min_bytes: int
    max_bytes: int
    ring_across_hosts: bool
    def __init__(
        self,
        *,
        enabled: bool = True,
        min_bytes: int = 64 << 10,
        max_bytes: int = 16 << 20,
        ring_across_hosts: bool = False,
    ) -> None: ...

def hierarchical_options() -> HierarchicalOptions: ...
def set_hierarchical_options(options: HierarchicalOptions) -> None: ...
def hierarchical_calls() -> int: ...

# ---- gradients (bind_gradients.cpp) -------------------------------------------------------
class PlanOptions:
    """The bucket planner's limits (bytes)."""

    cap_bytes: int
    direct_min_bytes: int
    def __init__(self, *, cap_bytes: int = 25 << 20, direct_min_bytes: int = 1 << 20) -> None: ...

class ReducerOptions:
    """How a GradientReducer reduces. op: 'sum' or 'average'; compression: None, 'fp16' or
    'bf16'."""

    plan: PlanOptions
    op: str
    compression: str | None
    plan_hash: int
    def __init__(
        self,
        *,
        plan: PlanOptions = ...,
        op: str = "average",
        compression: str | None = None,
        plan_hash: int = 0,
    ) -> None: ...

class GradientReducer:
    def __init__(self, params: Sequence[torch.Tensor], options: ReducerOptions) -> None: ...
    def mark_ready(self, index: int) -> None: ...
    def finalize(self, flag: bool = False) -> bool: ...
    def watch_requires_grad(self, tensors: Sequence[torch.Tensor]) -> None: ...
    def requires_grad_changed(self) -> bool: ...
    @property
    def launched_early(self) -> int: ...
    def plan(self) -> list[dict[str, Any]]: ...

def plan_buckets(tensors: Sequence[torch.Tensor], options: PlanOptions) -> list[dict[str, Any]]: ...

# ---- synchronize_ (bind_sync.cpp) ---------------------------------------------------------
class ErrorClass:
    """The exception a rank's local error becomes on every rank."""

    NONE: ClassVar[ErrorClass]
    VALUE: ClassVar[ErrorClass]
    TYPE: ClassVar[ErrorClass]
    RUNTIME: ClassVar[ErrorClass]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class BroadcastPlanOptions:
    """The broadcast planner's limits (bytes)."""

    bucket_bytes: int
    direct_bytes: int
    pack_cpu: bool
    def __init__(
        self, *, bucket_bytes: int = 64 << 20, direct_bytes: int = 64 << 10, pack_cpu: bool = False
    ) -> None: ...

class CoalescedOptions:
    """How synchronize_'s tensors travel."""

    plan: BroadcastPlanOptions
    relocate: bool
    def __init__(self, *, plan: BroadcastPlanOptions = ..., relocate: bool = False) -> None: ...

class TensorList:
    def __init__(self, tensors: Sequence[torch.Tensor]) -> None: ...
    def __len__(self) -> int: ...

def dict_version(d: dict) -> int: ...
def dicts_unchanged(snapshot: list) -> bool: ...
def sync_fast_path(
    tensors: TensorList,
    root_rank: int,
    structure_hash: int,
    options: CoalescedOptions,
    *,
    needs_skeleton: bool = False,
    error_class: ErrorClass = ...,
    error_text: str = "",
) -> bool: ...
def broadcast_bytes(
    data: bytes | None, root_rank: int, *, error_class: ErrorClass = ..., error_text: str = ""
) -> bytes: ...
def coalesced_broadcast(
    tensors: Sequence[torch.Tensor],
    root_rank: int,
    options: CoalescedOptions,
    *,
    error_class: ErrorClass = ...,
    error_text: str = "",
) -> None: ...
def sync_copy_counters() -> tuple[int, int]: ...
def plan_broadcast(
    tensors: Sequence[torch.Tensor], options: BroadcastPlanOptions
) -> list[tuple[bool, list[int], int]]: ...

# ---- shards (bind_shard.cpp) --------------------------------------------------------------
class ShardIterator:
    @property
    def position(self) -> int: ...
    @property
    def stop(self) -> int: ...
    def __iter__(self) -> Iterator[int]: ...
    def __next__(self) -> int: ...
    def __length_hint__(self) -> int: ...

def shard_range(n: int, world_size: int, rank: int, mode: str) -> tuple[int, int]: ...
def shard_index(
    n: int,
    world_size: int,
    rank: int,
    mode: str,
    shuffle: bool,
    seed: int,
    epoch: int,
    position: int,
) -> int: ...
def shard_indices(
    n: int,
    world_size: int,
    rank: int,
    mode: str,
    shuffle: bool,
    seed: int,
    epoch: int,
    first: int,
    count: int,
) -> torch.Tensor: ...
def shard_iter(
    n: int,
    world_size: int,
    rank: int,
    mode: str,
    shuffle: bool,
    seed: int,
    epoch: int,
    first: int,
    stop: int,
) -> ShardIterator: ...
def permutation_inverse(n: int, seed: int, epoch: int, values: torch.Tensor) -> torch.Tensor: ...
