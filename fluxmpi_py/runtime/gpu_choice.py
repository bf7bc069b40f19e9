"""Which GPU each rank of a node takes, and which ranks would then share one: pure, so that
the rule is tested without a GPU. ``Init`` applies it (runtime.py).

Two moments: before ``MPI_Init`` the launcher's local-rank variable picks the device
(``device_before_init``), so that a CUDA-aware MPI starts on the right GPU; after it, MPI's
node-local rank picks it again (``choose_gpu``), and whether ranks share a GPU is decided by
the GPU's physical identity gathered from every rank (``sharing_by_identity``), not by its
logical index: with ``CUDA_VISIBLE_DEVICES`` set per rank, every rank sees ``cuda:0`` and
none shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

# The launchers' node-local rank, most specific first: SLURM_LOCALID last, because mpirun
# inside a Slurm allocation leaves the daemon's step value (0 on every rank) in the
# environment of the ranks it starts.
LOCAL_RANK_VARIABLES = (
    "OMPI_COMM_WORLD_LOCAL_RANK",  # Open MPI (mpirun, prterun)
    "MV2_COMM_WORLD_LOCAL_RANK",  # MVAPICH
    "MPI_LOCALRANKID",  # MPICH's Hydra, Intel MPI
    "PMI_LOCAL_RANK",  # PMI / PMIx launchers, Cray PALS
    "PALS_LOCAL_RANKID",  # Cray PALS
    "SLURM_LOCALID",  # srun
)


@dataclass(frozen=True)
class GpuChoice:
    """This rank's GPU (None without one); per GPU that more than one node-local rank takes,
    those ranks (``{gpu: (node_rank, ...)}``, the GPU named ``cuda:N`` by ``choose_gpu`` or by
    its physical identity by ``sharing_by_identity``; NCCL allows one rank per GPU); the
    node's ranks and GPUs."""

    device: int | None
    shared: dict[str, tuple[int, ...]]
    ranks: int
    gpus: int

    def sharing_message(self) -> str:
        """Why NCCL cannot run on this node, or "" when every GPU has one rank.

        >>> choose_gpu(0, 3, 2).sharing_message()
        'node-local ranks 0 and 2 share cuda:0 (3 ranks, 2 GPUs)'
        """
        if not self.shared:
            return ""
        parts = []
        for dev, ranks in sorted(self.shared.items()):
            who = ", ".join(str(r) for r in ranks[:-1]) + " and " + str(ranks[-1])
            parts.append(f"node-local ranks {who} share {dev}")
        return "; ".join(parts) + f" ({self.ranks} ranks, {self.gpus} GPUs)"


def choose_gpu(
    node_rank: int, node_size: int, device_count: int, gpu_devices: Sequence[int] | None = None
) -> GpuChoice:
    """Node-local rank r takes ``gpu_devices[r]``, or GPU ``r % device_count``.

    A ValueError names a ``gpu_devices`` too short for the node's ranks, or an index that is
    not a GPU of this machine.

    >>> choose_gpu(1, 2, 2)
    GpuChoice(device=1, shared={}, ranks=2, gpus=2)
    >>> choose_gpu(1, 2, 1).shared
    {'cuda:0': (0, 1)}
    >>> choose_gpu(0, 2, 4, gpu_devices=[3, 2]).device
    3
    """
    if device_count <= 0:
        return GpuChoice(None, {}, node_size, 0)
    if gpu_devices is None:
        devices = [r % device_count for r in range(node_size)]
    else:
        devices = [int(d) for d in gpu_devices]
        if len(devices) < node_size:
            raise ValueError(
                f"Init(gpu_devices={devices}): {node_size} ranks run on this node, so it needs "
                f"at least {node_size} entries (node-local rank {node_rank} takes entry "
                f"{node_rank})"
            )
        bad = [d for d in devices[:node_size] if not 0 <= d < device_count]
        if bad:
            raise ValueError(
                f"Init(gpu_devices={devices}): cuda:{bad[0]} is not a GPU of this machine, "
                f"which has {device_count} (cuda:0 to cuda:{device_count - 1})"
            )
    by_device: dict[int, list[int]] = {}
    for r in range(node_size):
        by_device.setdefault(devices[r], []).append(r)
    shared = {f"cuda:{d}": tuple(rs) for d, rs in by_device.items() if len(rs) > 1}
    return GpuChoice(devices[node_rank], shared, node_size, device_count)


def launcher_local_rank(environ: Mapping[str, str]) -> int | None:
    """This process's node-local rank as its launcher set it, before ``MPI_Init`` can say it;
    None where no launcher variable holds a rank (a plain ``python``, an unknown launcher).

    >>> launcher_local_rank({"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "3"})
    3
    >>> launcher_local_rank({"PMI_LOCAL_RANK": "x"}) is None
    True
    """
    for name in LOCAL_RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


#: What FLUXMPI_CUDA_SCHEDULE may say: how a host thread waiting for the GPU uses its CPU
#: (cudaSetDeviceFlags). "" leaves CUDA's default ("auto": spin unless contexts outnumber CPUs).
CUDA_SCHEDULES = ("auto", "spin", "yield", "blocking")


def cuda_schedule_setting(environ: Mapping[str, str], rank: int = 0) -> str:
    """``FLUXMPI_CUDA_SCHEDULE``: "" when unset, else one of ``CUDA_SCHEDULES``; ValueError
    naming the variable, its value, this rank and the choices otherwise (Init raises it on
    every rank).

    >>> cuda_schedule_setting({"FLUXMPI_CUDA_SCHEDULE": " Blocking "})
    'blocking'
    >>> cuda_schedule_setting({})
    ''
    """
    value = environ.get("FLUXMPI_CUDA_SCHEDULE", "")
    mode = value.strip().lower()
    if mode and mode not in CUDA_SCHEDULES:
        raise ValueError(
            f"fluxmpi_py.Init(): FLUXMPI_CUDA_SCHEDULE is {value!r} on rank {rank}: expected "
            f"one of {', '.join(CUDA_SCHEDULES)} (or unset: CUDA's own default)"
        )
    return mode


def device_before_init(
    environ: Mapping[str, str], device_count: int, gpu_devices: Sequence[int] | None = None
) -> int | None:
    """The GPU to make current before ``MPI_Init``: the one ``choose_gpu`` gives the
    launcher's local rank. None where the launcher says no rank, there is no GPU, or
    ``gpu_devices`` has no valid entry for it: nothing is raised here, before the ranks can
    meet; ``choose_gpu`` raises on every rank after ``MPI_Init``.

    >>> device_before_init({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 2)
    1
    >>> device_before_init({"SLURM_LOCALID": "1"}, 4, gpu_devices=[3, 2])
    2
    """
    rank = launcher_local_rank(environ)
    if rank is None or device_count <= 0:
        return None
    if gpu_devices is None:
        return rank % device_count
    if rank >= len(gpu_devices):
        return None
    device = int(gpu_devices[rank])
    return device if 0 <= device < device_count else None


def physical_gpu_id(props, host: str) -> str:
    """A name of the GPU that ``props`` (``torch.cuda.get_device_properties``) describes,
    the same in every process that sees that GPU whatever its logical index: the UUID, or
    where torch gives none the PCI address on ``host``.

    >>> class P: uuid = "a1b2"
    >>> physical_gpu_id(P(), "n1")
    'GPU-a1b2'
    """
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        return uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid
    domain = int(getattr(props, "pci_domain_id", 0))
    bus = int(getattr(props, "pci_bus_id", 0))
    dev = int(getattr(props, "pci_device_id", 0))
    return f"{host}/pci:{domain:04x}:{bus:02x}:{dev:02x}"


def sharing_by_identity(
    choice: GpuChoice, gathered: Sequence[tuple[str, int, str]], me: int
) -> GpuChoice:
    """``choice`` with ``shared`` decided by physical identity. ``gathered[r]`` is world rank
    r's (host, node-local rank, identity of its GPU or "" for none), ``me`` this rank's index
    in it. Ranks whose GPUs have one identity share that GPU, whatever its logical index on
    each. ``shared`` names the shared GPUs on this rank's host, and this rank's own GPU where
    it is shared (its other users may name their host differently).

    >>> c = choose_gpu(0, 2, 1)  # CUDA_VISIBLE_DEVICES per rank: both see cuda:0
    >>> c.shared
    {'cuda:0': (0, 1)}
    >>> sharing_by_identity(c, [("n", 0, "GPU-a"), ("n", 1, "GPU-b")], 0).shared
    {}
    """
    host, _, mine = gathered[me]
    users: dict[str, list[tuple[str, int]]] = {}
    for h, node_rank, ident in gathered:
        if ident:
            users.setdefault(ident, []).append((h, int(node_rank)))
    shared = {
        ident: tuple(sorted(nr for _, nr in who))
        for ident, who in sorted(users.items())
        if len(who) > 1 and (ident == mine or any(h == host for h, _ in who))
    }
    return replace(choice, shared=shared)
