"""Run a worker's ``case_*`` functions in order on every rank, mpi4py-style.

Each case is a collective: all ranks run it. A failed assertion on any rank is an uncaught
exception, which fluxmpi_py's excepthook turns into an abort of the whole job, so the launch
fails at once instead of hanging. Rank 0 prints ``HARNESS: all N cases passed`` at the end.
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402


def raises(exc_type, fn, *needles):
    """Call fn; it must raise exc_type with every needle in its message. Returns the message."""
    try:
        fn()
    except exc_type as e:
        msg = str(e)
        for s in needles:
            assert s in msg, f"message lacks {s!r}: {msg}"
        return msg
    except Exception as e:  # the wrong type: show it
        raise AssertionError(f"expected {exc_type.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {exc_type.__name__}, nothing raised")


def run_cases(namespace):
    torch.set_num_threads(1)
    fm.Init()
    cases = [(k, v) for k, v in namespace.items() if k.startswith("case_") and callable(v)]
    wanted = sys.argv[1:]
    if wanted:
        cases = [(k, v) for k, v in cases if any(w in k for w in wanted)]
    for name, fn in cases:
        t0 = time.perf_counter()
        fn()
        fm.barrier()
        if fm.local_rank() == 0:
            print(f"ok {name} ({time.perf_counter() - t0:.2f}s)", flush=True)
    if fm.local_rank() == 0:
        print(f"HARNESS: all {len(cases)} cases passed on {fm.total_workers()} ranks", flush=True)
