"""Exception hooks that end the whole job when one rank fails: an uncaught exception on one
rank would otherwise leave the others blocked in their next collective."""
from __future__ import annotations

import sys
import threading

from ._loader import C

_previous_excepthook = sys.excepthook


def _excepthook(exc_type, exc, tb):
    # Show the exception as usual, then abort the whole job so that it ends within seconds.
    try:
        sys.stderr.write(f"[rank {C.rank()} / {C.size()}] uncaught exception, aborting the job:\n")
        (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
        sys.stderr.flush()
    finally:
        C.abort(f"uncaught {exc_type.__name__} on rank {C.rank()}: {exc}", 1)


def _thread_excepthook(args):
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    sys.stderr.write(f"[rank {C.rank()} / {C.size()}] in thread {name}:\n")
    _excepthook(args.exc_type, args.exc_value, args.exc_traceback)


def install() -> None:
    """Abort the job on an uncaught exception in any thread of this rank (Init does this
    when the world has more than one rank)."""
    global _previous_excepthook
    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
