"""Checks of a DataLoader, for a world of more than one rank: ``check_dataloader(loader)``.

* A distributed sampler (ours, torch's, or any sampler with ``num_replicas``) over a
  DistributedDataContainer shards the data twice: each rank sees about 1/p**2 of it. The
  check raises TypeError.
* A DataLoader that walks a whole map-style dataset in the default way (torch's
  SequentialSampler or RandomSampler, or a distributed sampler with ``num_replicas=1``)
  gives every rank every sample. The check warns with FullDatasetWarning.

Our own objects check where they are built: ``DistributedSampler`` over a container raises the
same TypeError. A DataLoader built from torch's parts alone never reaches our code, and
fluxmpi_py does not patch torch's classes (a patch breaks on the next torch release), so for
those the check runs where the user calls ``check_dataloader``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler

from .._core import C
from ..runtime.entry import local_call
from .container import DistributedDataContainer

__all__ = ["FullDatasetWarning", "check_dataloader"]

_DEPTH = 8  # wrappers followed through .dataset / .sampler (Subset, BatchSampler, ...)


class FullDatasetWarning(UserWarning):
    """``check_dataloader`` found a DataLoader that gives every rank the whole dataset (no
    DistributedDataContainer, no distributed sampler), so each rank trains on all samples.

    Deliberate when every rank should see all of it, as when each rank evaluates the full
    validation set, or when the dataset is already this rank's part. Silence it there:

    >>> import torch, warnings, fluxmpi_py as fm
    >>> val_set = torch.arange(10.0)
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", fm.FullDatasetWarning)
    ...     fm.check_dataloader(torch.utils.data.DataLoader(val_set, batch_size=5))
    >>> issubclass(fm.FullDatasetWarning, UserWarning)
    True
    """


def container_in(dataset: Any):
    """The DistributedDataContainer that ``dataset`` is or wraps (via ``.dataset``), or None."""
    for _ in range(_DEPTH):
        if isinstance(dataset, DistributedDataContainer):
            return dataset
        dataset = getattr(dataset, "dataset", None)
        if not isinstance(dataset, torch.utils.data.Dataset):
            return None
    return None


def replicas_of(sampler: Any) -> int | None:
    """``num_replicas`` of a distributed sampler, or None for any other sampler."""
    replicas = getattr(sampler, "num_replicas", None)
    if isinstance(replicas, int) and not isinstance(replicas, bool) and hasattr(sampler, "rank"):
        return replicas
    return None


def _index_samplers(loader: DataLoader):
    """The samplers that pick the loader's indices, outermost first (a batch sampler, then the
    sampler it wraps, ...). The loader's ``sampler`` is a placeholder when a batch_sampler is
    given, so it is only looked at without one."""
    sampler: Any = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    for _ in range(_DEPTH):
        if sampler is None:
            return
        yield sampler
        sampler = getattr(sampler, "sampler", None)


def double_sharding_message(owner: str, container: Any, sampler_name: str, replicas: int) -> str:
    r, p = container.rank, container.world_size
    return (
        f"{owner}: the dataset is a DistributedDataContainer, already rank {r}'s shard of {p}, "
        f"and {sampler_name} (num_replicas={replicas}) would shard it again: rank {r} would see "
        f"about 1/{p * replicas} of the data. Shard once: iterate the container without a "
        f"distributed sampler (DistributedDataContainer(..., shuffle=True) and set_epoch), or "
        f"give the DataLoader the full dataset with {sampler_name}(full_dataset)."
    )


@local_call
def check_dataloader(loader: DataLoader) -> None:
    """Raise TypeError if ``loader`` shards a DistributedDataContainer a second time (a
    distributed sampler over it), warn FullDatasetWarning if it gives every rank the whole of
    a map-style dataset; nothing on one rank, before ``Init``, or for an IterableDataset.
    Local: no communication.

    Args:
        loader: the DataLoader this rank trains on.

    Raises:
        TypeError: the loader shards a DistributedDataContainer a second time.

    >>> import torch, fluxmpi_py as fm
    >>> fm.Init()
    >>> shard = fm.DistributedDataContainer(torch.arange(10.0))
    >>> fm.check_dataloader(torch.utils.data.DataLoader(shard, batch_size=5))  # sharded once
    """
    if not C.initialized() or C.size() == 1:
        return
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        return  # it shards itself, or not; nothing here can tell
    samplers = list(_index_samplers(loader))
    distributed = next((s for s in samplers if replicas_of(s) is not None), None)
    replicas = replicas_of(distributed) if distributed is not None else None
    container = container_in(dataset)
    if container is not None:
        if replicas is not None and replicas > 1 and container.world_size > 1:
            kind = type(distributed)
            raise TypeError(
                double_sharding_message(
                    "DataLoader", container, f"{kind.__module__}.{kind.__qualname__}", replicas
                )
            )
        return
    if distributed is not None:
        walks_all = replicas_of(distributed) == 1
    else:
        # only the defaults are known to walk every index; a custom sampler may shard itself
        walks_all = bool(samplers) and isinstance(samplers[-1], (SequentialSampler, RandomSampler))
    if walks_all:
        warnings.warn(
            _full_dataset_message(dataset, samplers[-1]), FullDatasetWarning, stacklevel=2
        )


def _full_dataset_message(dataset: Any, sampler: Any) -> str:
    try:
        size = f"{len(dataset)} samples"
    except Exception:  # a map-style dataset need not define __len__
        size = "length unknown"
    r, p = C.rank(), C.size()
    return (
        f"DataLoader over the full {type(dataset).__name__} ({size}) with {type(sampler).__name__}: "
        f"rank {r} of {p} will see every sample, as will every other rank. To give each rank its "
        f"share, wrap the data in fluxmpi_py.DistributedDataContainer, or pass "
        f"sampler=fluxmpi_py.DistributedSampler(dataset) to the DataLoader. If every rank should "
        f"see all of it (e.g. evaluation), silence this with "
        f"warnings.filterwarnings('ignore', category=fluxmpi_py.FullDatasetWarning)."
    )
