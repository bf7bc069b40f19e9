"""print() for many ranks: every line says which rank wrote it, and no line is cut by another
rank's output."""

from __future__ import annotations

import io
import os
import sys
import threading

import torch

from .._core import C
from .entry import entry_point, local_call

__all__ = ["fluxmpi_print", "fluxmpi_println"]

_lock = threading.Lock()  # one call's text at a time, from any thread of this process


def _prefix() -> str:
    if not C.initialized():
        raise RuntimeError("fluxmpi_py is not initialized: call fluxmpi_py.Init() first")
    return f"[{C.rank()} / {C.size()}] "


def _descriptor(file):
    """The descriptor to write ``file``'s text to directly, or None to call file.write.

    Only a stream that really is a file, pipe or terminal of this process (an io object
    over a descriptor) qualifies. A stand-in such as Jupyter's OutStream may report the
    descriptor of the process's terminal, but the notebook shows only what goes through
    its write()."""
    if not isinstance(file, (io.TextIOWrapper, io.BufferedIOBase, io.FileIO)):
        return None
    try:
        return file.fileno()
    except (AttributeError, OSError, ValueError):
        return None  # pytest's captured streams and StringIO have no descriptor


def _write(text: str, file=None) -> None:
    """Write ``text`` to ``file`` (default sys.stdout) in one piece: one os.write to a real
    process stream, so that mpiexec never cuts a line by another rank's output; one
    file.write under a lock otherwise (Jupyter, captured or user-made streams)."""
    file = file if file is not None else sys.stdout
    fd = _descriptor(file)
    with _lock:
        file.flush()
        if fd is None:
            file.write(text)
            file.flush()
            return
        data = text.encode()
        while data:
            n = os.write(fd, data)
            data = data[n:]


@local_call  # ordered=True: _print_ordered, a collective
def fluxmpi_print(*args, sep: str = " ", end: str = "", file=None, ordered: bool = False) -> None:
    """print() with a ``[rank / size] `` prefix, written atomically; no newline by default.

    Not a collective: one rank alone may call it. ``ordered=True`` is a collective (every
    rank must call it): rank 0 gathers every rank's text and writes it in rank order, in one
    write to its ``file`` (separate writes from each rank could reach the terminal in any
    order, since mpiexec forwards each rank's output on its own).

    Args:
        *args: the values to print, as print() takes them.
        sep: written between the values.
        end: written after the last value ("" by default: no newline).
        file: a file object with ``write``; None: ``sys.stdout``.
        ordered: True: a collective, rank 0 writes every rank's text in rank order.

    >>> import fluxmpi_py as fm; fm.Init(); fm.fluxmpi_print("loss", 0.5, end="\\n")
    [0 / 1] loss 0.5
    """
    if ordered and C.size() > 1:
        _print_ordered(args, sep, end, file)
        return
    _write(_prefix() + sep.join(str(a) for a in args) + end, file)


@entry_point("fluxmpi_print(ordered=True)")
def _print_ordered(args, sep, end, file) -> None:
    """The collective form: a bad argument on one rank raises on every rank (entry.py)."""
    _write_ordered(_prefix() + sep.join(str(a) for a in args) + end, file)


def _write_ordered(text: str, file) -> None:
    data = bytearray(text.encode())
    rank, size = C.rank(), C.size()
    lengths = torch.zeros(size, dtype=torch.int64)
    lengths[rank] = len(data)
    C.allreduce_(lengths, "sum")  # the runtime's own call: below the collectives layer
    start = int(lengths[:rank].sum())
    buf = torch.zeros(int(lengths.sum()), dtype=torch.uint8)
    if data:
        buf[start : start + len(data)] = torch.frombuffer(data, dtype=torch.uint8)
    C.allreduce_(buf, "sum")
    if rank == 0:
        _write(buf.numpy().tobytes().decode(errors="replace"), file)


@local_call
def fluxmpi_println(*args, sep: str = " ", file=None, ordered: bool = False) -> None:
    """fluxmpi_print with a trailing newline.

    Args:
        *args: the values to print, as print() takes them.
        sep: written between the values.
        file: a file object with ``write``; None: ``sys.stdout``.
        ordered: True: a collective, rank 0 writes every rank's line in rank order.

    >>> import fluxmpi_py as fm; fm.Init(); fm.fluxmpi_println("hello")
    [0 / 1] hello
    """
    fluxmpi_print(*args, sep=sep, end="\n", file=file, ordered=ordered)
