"""Exception hooks that end the whole job when one rank fails: an uncaught exception on one
rank would otherwise leave the others blocked in their next collective.

One story per failure: each rank writes its report in one piece, prefixed ``[rank R / N]``.
An error that every rank raised together (marked ``raised_on_every_rank`` by the ranks'
agreement) is told once: rank 0 writes the traceback and every other rank one line; rank 0
aborts the job once those lines are out, so Open MPI's abort notice comes after the report,
not inside it. A rank that raised alone writes its traceback and aborts the job at once.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import time

from .._core import C
from .agreement import raised_on_every_rank
from .printing import _write

# Rank 0 waits at most this long for the other ranks' lines before aborting.
_MEET_TIMEOUT_S = 5.0
# The other ranks wait this long for rank 0's abort; after it (rank 0 caught the error, say)
# each reports its own traceback and aborts, so that nothing can hang.
_ABORT_WAIT_S = 20.0

_previous_excepthook = sys.excepthook


def _traceback_text(exc_type, exc, tb) -> str:
    # What the previous hook (Python's, IPython's, a user's) prints, captured whole so that
    # it goes out in one write.
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        _previous_excepthook(exc_type, exc, tb)
    return buf.getvalue()


def _stderr():
    """Where the report goes. torch.distributed's init_process_group wraps the excepthook so
    that it writes into a StringIO, which it prints after the hook returns; this one aborts
    the job first, so its report goes to the process's own stderr instead."""
    if isinstance(sys.stderr, io.StringIO) and sys.__stderr__ is not None:
        return sys.__stderr__
    return sys.stderr


def _report_and_abort(exc_type, exc, tb, where: str = "") -> None:
    try:
        err = _stderr()
        rank, size = C.rank(), C.size()
        prefix = f"[rank {rank} / {size}]"
        name = exc_type.__name__
        if raised_on_every_rank(exc) and rank > 0:
            first = (str(exc).splitlines() or [""])[0]
            _write(f"{prefix} same {name} as rank 0{where}: {first}\n", err)
            C.meet_before_abort(_MEET_TIMEOUT_S)
            time.sleep(_ABORT_WAIT_S)  # rank 0 ends the job meanwhile
            _write(
                f"{prefix} rank 0 did not end the job within {_ABORT_WAIT_S:.0f} s; this "
                f"rank's {name}{where}, aborting the job:\n" + _traceback_text(exc_type, exc, tb),
                err,
            )
        elif raised_on_every_rank(exc):
            _write(
                f"{prefix} {name} raised on every rank{where} (the others write one line "
                f"each), aborting the job:\n" + _traceback_text(exc_type, exc, tb),
                err,
            )
            C.meet_before_abort(_MEET_TIMEOUT_S)
        else:
            _write(
                f"{prefix} uncaught {name}{where}, aborting the job:\n"
                + _traceback_text(exc_type, exc, tb),
                err,
            )
    finally:
        C.abort("", 1)


def _excepthook(exc_type, exc, tb):
    _report_and_abort(exc_type, exc, tb)


def _thread_excepthook(args):
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    _report_and_abort(args.exc_type, args.exc_value, args.exc_traceback, f" in thread {name}")


def install() -> None:
    """Abort the job on an uncaught exception in any thread of this rank (Init does this
    when the world has more than one rank)."""
    global _previous_excepthook
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
