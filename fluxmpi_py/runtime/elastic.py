"""The shrink mode: a lost rank costs a step, not the job (``Init(on_failure="shrink")``).

By default a rank that dies ends the job (``on_failure="abort"``). In the shrink mode, with an
MPI that has ULFM (Open MPI 5, launched by ``python -m fluxmpi_py.run --elastic`` or
``mpiexec --with-ft ulfm``), a collective that a lost rank can never finish raises
:class:`RanksLostError` on every survivor instead; :func:`recover` then shrinks the world to
the survivors (revoke, shrink, confirmed by an agreement) and returns what it did. The world's
ranks, size, node ranks and the stall watch follow; a group made before raises when used. A cut network
looks like death to both sides: only a strict majority of the world before the loss, or
exactly half holding its rank 0, goes on; every rank of the other side ends itself, saying why.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

from .._core import C
from .entry import local_call

__all__ = ["RanksLostError", "recover", "recoveries", "on_failure", "add_recovery_hook"]

#: The environment variable that sets ``Init``'s ``on_failure`` when the argument is not given.
ON_FAILURE_ENV = "FLUXMPI_ON_FAILURE"
MODES = ("abort", "shrink")

RanksLostError = C.RanksLostError
RanksLostError.__doc__ = """A call met a lost rank (the shrink mode only), on every survivor: call
:func:`recover`, then redo the step (:func:`fluxmpi_py.elastic_step` does both).

>>> issubclass(RanksLostError, RuntimeError)
True
"""
RanksLostError.__module__ = "fluxmpi_py"

_HOOKS: list[Callable[[dict], None]] = []
_LOG: list[dict] = []


def setting(value: str | None) -> str:
    """``on_failure`` as given, else ``FLUXMPI_ON_FAILURE``, else ``"abort"``; ValueError
    naming the value when it is neither mode.

    >>> setting("shrink"), setting(None) in MODES
    ('shrink', True)
    """
    source = "Init(on_failure=...)"
    if value is None:
        value, source = os.environ.get(ON_FAILURE_ENV, "abort") or "abort", ON_FAILURE_ENV
    if value not in MODES:
        raise ValueError(f"{source} must be 'abort' or 'shrink', got {value!r}")
    return value


def apply(mode: str) -> Exception | None:
    """Turn the mode on after ``C.init``; returns the error to raise on every rank (the same
    on each: which MPI, how it was launched), or None.

    >>> apply("abort") is None
    True
    """
    if mode != "shrink":
        C.set_shrink_mode(False)
        return None
    why = C.shrink_mode_unavailable() if C.size() > 1 else ""
    if why:
        return RuntimeError(why)
    if C.size() > 1:
        C.set_shrink_mode(True)
    return None


@local_call
def on_failure() -> str:
    """What a lost rank does to this job: ``"abort"`` (the default) or ``"shrink"``.

    >>> import fluxmpi_py as fm; fm.Init(); fm.on_failure() in ("abort", "shrink")
    True
    """
    return "shrink" if C.shrink_mode() else "abort"


@local_call
def add_recovery_hook(hook: Callable[[dict], None]) -> None:
    """Call ``hook(info)`` on every survivor after each :func:`recover`, with its result:
    what was built on the old world (a sampler's share of the data, a plan) is rebuilt there.

    Args:
        hook: called with the dict that :func:`recover` returns (``lost``, ``rank``, ``size``,
            ...), in the order the hooks were added.

    >>> add_recovery_hook(lambda info: None)
    """
    _HOOKS.append(hook)


# No argument to check, and entered only after RanksLostError, which every survivor gets from
# the same failed call: the shrink's own agreement (MPIX_Comm_agree) is its meeting.
@local_call
def recover() -> dict[str, Any]:
    """After :class:`RanksLostError`, on every survivor: shrink the world to the ranks still
    alive and go on there. Returns ``{"lost": [old ranks], "old_rank", "old_size", "rank",
    "size", "attempts", "seconds"}`` and logs it on every survivor (stderr, one line). A
    collective of the survivors; needs ``Init(on_failure="shrink")``. Where the survivors are
    neither a strict majority of the world before the loss nor exactly half with its rank 0
    (the other side of a cut network may be alive and go on), each of them says so on stderr
    and ends (exit status 1) instead of returning.

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.on_failure() == "shrink" or fm.total_workers() >= 1
    True
    """
    t0 = time.monotonic()
    info = dict(C.shrink_world())
    if info.pop("refused"):
        _end_this_side(info)
    info["recovery"] = C.recoveries()
    for hook in _HOOKS:
        hook(info)
    info["seconds_with_hooks"] = time.monotonic() - t0
    _LOG.append(info)
    lost = ", ".join(map(str, info["lost"])) or "none"
    sys.stderr.write(
        f"[rank {info['rank']} / {info['size']}] fluxmpi_py: lost rank(s) {lost} of "
        f"{info['old_size']}; the {info['size']} survivors went on (this rank was "
        f"{info['old_rank']}) after {info['seconds']:.3f} s, {info['attempts']} shrink(s)\n"
    )
    sys.stderr.flush()
    return info


#: The exit status of a rank on a side of a split world that may not go on.
SPLIT_STATUS = 1


def _end_this_side(info: dict) -> None:
    """A side of a cut network that is neither a majority of the world before the loss nor
    its half with rank 0 (``C.quorum_refusal``): say why on this rank and end it, without
    MPI_Abort (which, were the network back, could reach the side that goes on)."""
    why = C.quorum_refusal(info["old_size"], info["lost"])
    sys.stdout.flush()
    sys.stderr.write(f"[rank {info['old_rank']} / {info['old_size']}] {why}\n")
    sys.stderr.flush()
    os._exit(SPLIT_STATUS)


@local_call
def recoveries() -> list[dict]:
    """Every recovery this process lived through, oldest first (what :func:`recover` returned).

    >>> isinstance(recoveries(), list)
    True
    """
    return list(_LOG)
