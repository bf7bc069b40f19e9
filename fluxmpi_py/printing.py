"""print() for many ranks: every line says which rank wrote it, and no line is cut by another
rank's output."""
from __future__ import annotations

import os
import sys

import torch

from ._loader import C

__all__ = ["fluxmpi_print", "fluxmpi_println"]


def _prefix() -> str:
    if not C.initialized():
        raise RuntimeError("fluxmpi_py is not initialized: call fluxmpi_py.Init() first")
    return f"[{C.rank()} / {C.size()}] "


def _write(text: str, file) -> None:
    # One write per call, so lines from different ranks never interleave mid-line.
    file = file or sys.stdout
    file.flush()
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None  # Jupyter and captured streams have no descriptor
    if fd is None:
        file.write(text)
        file.flush()
        return
    data = text.encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]


def fluxmpi_print(*args, sep: str = " ", end: str = "", file=None, ordered: bool = False) -> None:
    """print() with a ``[rank / size] `` prefix, written atomically; no newline by default.

    Not a collective: one rank alone may call it. ``ordered=True`` is a collective (every
    rank must call it): rank 0 gathers every rank's text and writes it in rank order, in one
    write to its ``file`` (separate writes from each rank could reach the terminal in any
    order, since mpiexec forwards each rank's output on its own).

    >>> import fluxmpi_py as fm; fm.Init(); fm.fluxmpi_print("loss", 0.5, end="\\n")
    [0 / 1] loss 0.5
    """
    text = _prefix() + sep.join(str(a) for a in args) + end
    if not ordered or C.size() == 1:
        _write(text, file)
        return
    from .collectives import allreduce_

    data = bytearray(text.encode())
    rank, size = C.rank(), C.size()
    lengths = torch.zeros(size, dtype=torch.int64)
    lengths[rank] = len(data)
    allreduce_(lengths)
    start = int(lengths[:rank].sum())
    buf = torch.zeros(int(lengths.sum()), dtype=torch.uint8)
    if data:
        buf[start : start + len(data)] = torch.frombuffer(data, dtype=torch.uint8)
    allreduce_(buf)
    if rank == 0:
        _write(buf.numpy().tobytes().decode(errors="replace"), file)


def fluxmpi_println(*args, sep: str = " ", file=None, ordered: bool = False) -> None:
    """fluxmpi_print with a trailing newline.

    >>> import fluxmpi_py as fm; fm.Init(); fm.fluxmpi_println("hello")
    [0 / 1] hello
    """
    fluxmpi_print(*args, sep=sep, end="\n", file=file, ordered=ordered)
