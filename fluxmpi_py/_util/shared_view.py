"""SharedInts: a few unsigned 64-bit integers that a Dataset's copies in DataLoader worker
processes read, so state set in the main process (an epoch) reaches them.

Persistent workers receive the dataset once, when they start: by inheritance (``fork``) or
through multiprocessing's pickler (``spawn``, ``forkserver``). The integers live in an
anonymous shared mapping, which a forked worker inherits, so a write in the main process is
seen at the worker's next read. The first time multiprocessing's pickler sends them to another
process they are also put in a shared-memory tensor (torch passes its handle along) and from
then on every write goes to both. Until then no file descriptor is held, so any number of
objects can exist.

A copy made any other way (``pickle.dumps``, ``copy.copy``, ``copy.deepcopy``) is independent:
it starts with the values of the original.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler

import torch

_U64 = 1 << 64


class SharedInts:
    """``count`` integers in ``[0, 2**64)`` shared with forked and spawned worker processes.

    ``read()`` costs about 0.1-0.3 µs (a memoryview over the shared bytes, no tensor op).

    >>> from fluxmpi_py._util.shared_view import SharedInts
    >>> v = SharedInts((3, 2**64 - 1))
    >>> v.write((4, 5)); v.read()
    (4, 5)
    >>> import copy; w = copy.copy(v); w.write((6, 7)); v.read(), w.read()
    ((4, 5), (6, 7))
    """

    __slots__ = ("_views", "_keep")

    def __init__(self, values: Sequence[int]) -> None:
        mapping = mmap.mmap(-1, 8 * len(values))  # anonymous and MAP_SHARED: fork keeps it shared
        self._keep: list[object] = [mapping]
        self._views = [memoryview(mapping).cast("Q")]
        self.write(values)

    def read(self) -> tuple[int, ...]:
        return tuple(self._views[0].tolist())

    def write(self, values: Sequence[int]) -> None:
        if len(values) != len(self._views[0]):
            raise ValueError(
                f"SharedInts.write: expected {len(self._views[0])} values, got {len(values)}"
            )
        for k, v in enumerate(values):
            if not 0 <= v < _U64:
                raise ValueError(f"SharedInts.write: value {k} must be in [0, 2**64), got {v}")
        for view in self._views:
            for k, v in enumerate(values):
                view[k] = v

    def _shared_tensor(self) -> torch.Tensor:
        """The values in a shared-memory tensor, made on first use and kept in step."""
        for kept in self._keep:
            if isinstance(kept, torch.Tensor):
                return kept
        tensor = torch.zeros(len(self._views[0]), dtype=torch.int64).share_memory_()
        view = _u64_view(tensor)
        view[:] = self._views[0]
        self._keep.append(tensor)
        self._views.append(view)
        return tensor

    # pickle and copy: the values, in a new independent object
    def __reduce__(self):
        return (SharedInts, (self.read(),))

    def __copy__(self) -> SharedInts:
        return SharedInts(self.read())

    def __deepcopy__(self, memo) -> SharedInts:
        return SharedInts(self.read())

    def __repr__(self) -> str:
        return f"SharedInts({self.read()})"


def _u64_view(tensor: torch.Tensor) -> memoryview:
    raw = (ctypes.c_uint64 * tensor.numel()).from_address(tensor.data_ptr())
    return memoryview(raw).cast("B").cast("Q")


def _attach(tensor: torch.Tensor) -> SharedInts:
    # In the receiving process: read and write the sender's shared tensor.
    shared = SharedInts.__new__(SharedInts)
    shared._keep = [tensor]
    shared._views = [_u64_view(tensor)]
    return shared


def _send_to_process(shared: SharedInts):
    return (_attach, (shared._shared_tensor(),))


# multiprocessing's pickler (spawn/forkserver process start, queues) shares; plain pickle copies
ForkingPickler.register(SharedInts, _send_to_process)
