"""Finding where to resume: the newest complete checkpoint in a directory.

A job relaunched after a failure (``python -m fluxmpi_py.run --max-restarts K``) starts its
script again from the top; ``latest_checkpoint(dir)`` tells it which file to load, the same
answer on every rank. Complete means what ``save_checkpoint`` guarantees: the file was
renamed into place whole (a temporary ``.<name>.tmp<pid>.<host>`` never is) and its digest
trailer matches its bytes.
"""

from __future__ import annotations

import fnmatch
import os
import pickle
import re
import stat
import warnings

from .._util.files import check_digest, is_temporary
from ..runtime.agreement import bcast_bytes, raise_together
from ..runtime.entry import entry_point
from ..runtime.world import Initialized, local_rank, total_workers

__all__ = ["latest_checkpoint"]


def _natural(name: str) -> tuple:
    """A sort key that compares the numbers in a name as numbers (ckpt-9 before ckpt-10)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name))


def _candidates(directory: str, pattern: str) -> list[str]:
    """The files of ``directory`` whose names match ``pattern``, newest first (by modification
    time, then by name with numbers compared as numbers); temporary files left out."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []  # no directory yet: nothing saved yet
    found = []
    for name in names:
        if not fnmatch.fnmatchcase(name, pattern) or is_temporary(name):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:  # removed meanwhile
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((st.st_mtime_ns, _natural(name), path))
    return [path for _, _, path in sorted(found, reverse=True)]


def _newest_complete(directory: str, pattern: str) -> str | None:
    """The first of the candidates whose digest trailer verifies, warning about each skipped."""
    for path in _candidates(directory, pattern):
        try:
            algorithm = check_digest(path)
        except ValueError as e:  # its text names the path and what does not match
            warnings.warn(f"latest_checkpoint: skipped {e}; trying an older one", stacklevel=4)
            continue
        except OSError:  # removed or unreadable meanwhile
            continue
        if algorithm is None:
            warnings.warn(
                f"latest_checkpoint: skipped {path!r}: it has no digest trailer, so it cannot "
                "be told complete (save_checkpoint writes one); trying an older one",
                stacklevel=4,
            )
            continue
        return path
    return None


def _check_args(directory, pattern) -> str:
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(
            f"latest_checkpoint: directory must be a str or os.PathLike, got "
            f"{type(directory).__name__} on rank {local_rank() if Initialized() else 0}"
        )
    if not isinstance(pattern, str) or not pattern or "/" in pattern or os.sep in pattern:
        raise ValueError(
            f"latest_checkpoint: pattern must be a file-name pattern such as 'ckpt-*.pt' "
            f"(no directory part), got {pattern!r}"
        )
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"latest_checkpoint: {directory!r} is not a directory")
    return directory


@entry_point("latest_checkpoint()")
def latest_checkpoint(directory, pattern: str = "*.pt") -> str | None:
    """The path of the newest complete checkpoint in ``directory`` whose file name matches
    ``pattern`` (fnmatch, e.g. ``"ckpt-*.pt"``), or None when there is none; a collective
    once ``Init`` has run, with the same answer on every rank (rank 0 looks, the others are
    told).

    Newest is by modification time, then by name with numbers compared as numbers. Complete:
    temporary files of a save in progress or killed (``.<name>.tmp<pid>.<host>``) are never
    taken, and a file whose digest trailer does not match its bytes, or that has none (not
    written by ``save_checkpoint``), is skipped with a warning naming it, for the next older
    one. A directory that does not exist holds none. Checking a digest reads the file once.

    Args:
        directory: where to look; one that does not exist holds none.
        pattern: the file names to consider (fnmatch).

    Returns:
        The newest complete checkpoint's path, or None.

    >>> import torch, tempfile, os, fluxmpi_py as fm; fm.Init()
    >>> d = tempfile.mkdtemp(); print(fm.latest_checkpoint(d))
    None
    >>> model = torch.nn.Linear(2, 1)
    >>> for step in (9, 10):
    ...     _ = fm.save_checkpoint(os.path.join(d, f"ckpt-{step}.pt"), model=model, step=step)
    >>> os.path.basename(fm.latest_checkpoint(d))
    'ckpt-10.pt'
    """
    collective = Initialized() and total_workers() > 1
    error, found = None, None
    try:
        directory = _check_args(directory, pattern)
        if not collective or local_rank() == 0:
            found = _newest_complete(directory, pattern)
    except Exception as e:  # folded into the agreement below, so every rank raises it
        error = e
    if not collective:
        if error is not None:
            raise error
        return found
    raise_together(error, f"latest_checkpoint({directory!r})")
    return pickle.loads(bcast_bytes(pickle.dumps(found) if local_rank() == 0 else b"", 0))
