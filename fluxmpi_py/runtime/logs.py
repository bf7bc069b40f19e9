"""Logging with the rank in every record, through Python's ``logging``.

``get_logger(name)`` gives a ready logger whose lines start with ``[rank / size]``, like
``fluxmpi_println``; ``get_logger(name, ranks=0)`` logs on rank 0 only. To keep your own
logging setup, add :class:`RankFilter` to a handler instead: every record then has
``%(rank)s`` and ``%(world_size)s`` for the format string. Both work before ``Init()``
(the rank then comes from the launcher's environment, or is 0).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable

from .._core import C
from .entry import local_call

__all__ = ["get_logger", "RankFilter", "RANK_FORMAT"]

RANK_FORMAT = "[%(rank)s / %(world_size)s] %(asctime)s %(levelname)s %(name)s: %(message)s"
"""get_logger's default line format: ``[rank / size] time LEVEL name: message``."""

# What launchers set for each rank (Open MPI, MPICH/Hydra, PMIx, Slurm), before Init runs.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_HANDLER_NAME = "fluxmpi_py"  # the name of the handler get_logger adds


def _rank_and_size():
    if C.initialized():
        return C.rank(), C.size()
    rank = next((int(os.environ[v]) for v in _RANK_VARS if os.environ.get(v, "").isdigit()), 0)
    size = next((int(os.environ[v]) for v in _SIZE_VARS if os.environ.get(v, "").isdigit()), 1)
    return rank, size


@local_call
class RankFilter(logging.Filter):
    """Adds ``rank`` and ``world_size`` to each record; with ``ranks``, keeps only the records
    of those ranks (an int or an iterable of ints). Attach it to a handler.

    Args:
        ranks: the rank (or ranks) whose records are kept; None: every rank's.

    >>> import logging, sys, fluxmpi_py as fm
    >>> h = logging.StreamHandler(sys.stdout)
    >>> h.addFilter(fm.RankFilter()); h.setFormatter(logging.Formatter("[%(rank)s] %(message)s"))
    >>> log = logging.getLogger("doc.rankfilter"); log.addHandler(h); log.propagate = False
    >>> log.warning("hello")
    [0] hello
    """

    def __init__(self, ranks: int | Iterable[int] | None = None):
        super().__init__()
        if ranks is None:
            self.ranks = None
        elif isinstance(ranks, int):
            self.ranks = frozenset([ranks])
        else:
            self.ranks = frozenset(int(r) for r in ranks)

    @local_call
    def filter(self, record: logging.LogRecord) -> bool:
        rank, size = _rank_and_size()
        record.rank, record.world_size = rank, size
        return self.ranks is None or rank in self.ranks


@local_call
def get_logger(
    name: str = "fluxmpi_py",
    level: int | str = logging.INFO,
    *,
    ranks: int | Iterable[int] | None = None,
    fmt: str = RANK_FORMAT,
    stream=None,
) -> logging.Logger:
    """A logger whose records carry the rank, printed as ``[rank / size] time LEVEL name: msg``.

    ``ranks=0`` (or a list) keeps the records of those ranks only; by default every rank logs.
    The logger gets one handler (to ``stream``, default stderr) and does not propagate to the
    root logger, so lines are not printed twice. Calling again with the same name reconfigures
    that handler instead of adding another.

    Args:
        name: the logger's name, as ``logging.getLogger`` takes it.
        level: the lowest level logged (``logging.INFO``, ``"DEBUG"``, ...).
        ranks: the rank (or ranks) whose records are kept; None: every rank's.
        fmt: the line's format; ``%(rank)s`` and ``%(world_size)s`` are the rank's.
        stream: where the lines go; None: ``sys.stderr``.

    Returns:
        The configured ``logging.Logger``.

    >>> import sys, fluxmpi_py as fm
    >>> log = fm.get_logger("doc.demo", ranks=0, fmt="[%(rank)s / %(world_size)s] %(message)s",
    ...                     stream=sys.stdout)
    >>> log.info("epoch 1: loss 0.25")
    [0 / 1] epoch 1: loss 0.25
    """
    logger = logging.getLogger(name)
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.set_name(_HANDLER_NAME)  # ours, found again above
        logger.addHandler(handler)
    elif stream is not None and isinstance(handler, logging.StreamHandler):
        handler.setStream(stream)
    for f in list(handler.filters):
        if isinstance(f, RankFilter):
            handler.removeFilter(f)
    handler.addFilter(RankFilter(ranks))
    handler.setFormatter(logging.Formatter(fmt))
    logger.setLevel(level)
    logger.propagate = False
    return logger
