"""An agreed stop: preemption and time limits become a stop at a step boundary on every rank.

A scheduler warns a job before it ends it: Slurm sends SIGUSR1 ahead of the time limit
(``#SBATCH --signal=USR1@60``, or ``scancel --signal=USR1``) and SIGTERM at preemption;
``mpiexec`` and ``python -m fluxmpi_py.run`` pass SIGUSR1 on to the ranks. The signal reaches
some ranks, maybe one. :func:`Init` installs a handler for SIGUSR1 and SIGTERM that marks a stop
on the rank it reached (one atomic store), and the next agreement on the world (the check that
runs before every collective, and so in every ``DistributedOptimizer.step()``) carries the
mark to every rank at once: no collective is added to a step. :func:`stop_requested` then
reads True on every rank at the same step, so the ranks checkpoint together and exit with
:data:`REQUEUE_STATUS`; the job script requeues the job, and the next run resumes from
:func:`latest_checkpoint`.

Until the program first calls :func:`stop_requested`, the signals keep their old action (a
script that never asks ends on SIGTERM as before), and a second SIGTERM after a marked stop
ends the process as it would have.
"""

from __future__ import annotations

import signal

from .._core import C
from .entry import local_call

__all__ = ["stop_requested", "request_stop", "REQUEUE_STATUS"]

#: The exit status of a rank that stopped to be requeued (EX_TEMPFAIL of sysexits.h: "try
#: again later"). The batch script requeues on it (``scontrol requeue $SLURM_JOB_ID``), and
#: ``python -m fluxmpi_py.run --max-restarts`` does not relaunch it.
REQUEUE_STATUS = 75

#: The signals that mark a stop once armed.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def install_handlers() -> None:
    """Install the stop signals' handlers (Init, on every rank; they stay inert until armed)."""
    C.install_stop_signals([int(s) for s in STOP_SIGNALS])


@local_call  # reads a flag that the world's agreements set
def stop_requested() -> bool:
    """True once the ranks have agreed to stop: SIGUSR1 or SIGTERM (or :func:`request_stop`)
    reached some rank, and an agreement on the world has carried it to all since. Reads a flag,
    no collective: call it at a step boundary (after ``opt.step()``, no non-blocking collective
    in flight), where it gives the same answer on every rank (in a world of one: whether a
    stop was marked). The first call arms the
    handlers: before it, the signals keep their old action.

    The loop, resumable and preemptible::

        for step in range(start, steps):
            ...
            opt.step()
            if fm.stop_requested():
                fm.save_checkpoint(f"{ckpt}/step-{step + 1}.pt", model=model, optimizer=opt,
                                   step=step + 1, rng=True)
                sys.exit(fm.REQUEUE_STATUS)

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.stop_requested()
    False
    """
    if not C.stop_signals_armed():
        C.arm_stop_signals(True)
    if C.initialized() and C.size() == 1:  # a world of one agrees with itself at once
        return bool(C.stop_requested_here() or C.stop_agreed())
    return bool(C.stop_agreed())


@local_call  # marks this rank; the next agreement on the world carries it
def request_stop() -> None:
    """Mark a stop on this rank, as the signal does: the ranks agree on it at the next
    collective on the world, and :func:`stop_requested` reads True on every rank from the
    step boundary after it. For a condition only one rank sees (a file that appeared, a
    deadline of its own).

    >>> import fluxmpi_py as fm; fm.Init()
    >>> fm.request_stop(); fm.barrier(); fm.stop_requested()
    True
    >>> from fluxmpi_py._core import C; C.clear_stop()
    """
    C.request_stop()
