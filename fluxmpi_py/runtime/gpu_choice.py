"""Which GPU each rank of a node takes, and which ranks would then share one: pure, so that
the rule is tested without a GPU. ``Init`` applies it (runtime.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuChoice:
    """This rank's GPU (None without one); per GPU that more than one node-local rank takes,
    those ranks (``{device: (node_rank, ...)}``; NCCL allows one rank per GPU); the node's
    ranks and GPUs."""

    device: int | None
    shared: dict[int, tuple[int, ...]]
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
            parts.append(f"node-local ranks {who} share cuda:{dev}")
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
    {0: (0, 1)}
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
    shared = {d: tuple(rs) for d, rs in by_device.items() if len(rs) > 1}
    return GpuChoice(devices[node_rank], shared, node_size, device_count)
