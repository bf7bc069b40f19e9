"""Run a worker's ``case_*`` functions in order on every rank, mpi4py-style.

Each case is a collective: all ranks run it. A failed assertion on any rank is an uncaught
exception, which fluxmpi_py's excepthook turns into an abort of the whole job, so the launch
fails at once instead of hanging. Rank 0 prints ``HARNESS: all N cases passed`` at the end.

When the environment names a results directory (``HARNESS_RESULTS``), each rank also appends
one JSON object per line to ``rank<R>-<pid>.jsonl`` there: a ``begin`` record (rank, world
size, the cases it will run), ``started`` before each case, ``passed`` or ``failed`` (with
the message and the traceback) after it, and ``end``. A failure is written, and flushed to the
file, before the job is aborted, so the launcher (tests/mpi_util.py) can report each case
under its own name. ``HARNESS_CASES`` (comma-separated names) runs only those cases.
"""

import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

RESULTS_ENV = "HARNESS_RESULTS"
CASES_ENV = "HARNESS_CASES"


def only_at(*world_sizes):
    """A case that runs only at these world sizes (a world of one without mpiexec counts as 1):
    for a costly case whose point one size already makes (torch.compile's hooks, say).
    tests/mpi_util.py reads the decorator from the source and makes no test of the others."""

    def mark(fn):
        fn.world_sizes = tuple(world_sizes)
        return fn

    return mark


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


class _Results:
    """This rank's JSON-lines record of the run; does nothing without HARNESS_RESULTS. Every
    record names its worker script (`script`), so that one launch can run several workers."""

    def __init__(self, directory):
        self.rank, self.world = fm.local_rank(), fm.total_workers()
        self.script = None
        self.file = None
        if directory:
            path = os.path.join(directory, f"rank{self.rank}-{os.getpid()}.jsonl")
            self.file = open(path, "a", encoding="utf-8")

    def write(self, status, case=None, **fields):
        if self.file is None:
            return
        record = dict(
            rank=self.rank,
            world=self.world,
            pid=os.getpid(),
            time=time.time(),
            script=self.script,
            status=status,
            case=case,
            **fields,
        )
        # Flushed at once: an abort may follow within milliseconds.
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def _selected(cases):
    """The cases to run: HARNESS_CASES (exact names), else command-line substrings, else all."""
    names = [n for n in os.environ.get(CASES_ENV, "").split(",") if n]
    if names:
        known = {k for k, _ in cases}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"harness: no case named {', '.join(unknown)}")
        return [(k, v) for k, v in cases if k in names]
    wanted = sys.argv[1:]
    if wanted:
        return [(k, v) for k, v in cases if any(w in k for w in wanted)]
    return cases


def labelled(label):
    """An assert_close `msg` that puts `label` (which parameter, which mode) before torch's own
    message; made by a call, so a label from a loop is bound when the check is written."""
    return lambda m: f"{label}: {m}"


def _cases_of(namespace):
    return [(k, v) for k, v in namespace.items() if k.startswith("case_") and callable(v)]


def run_cases(namespace):
    """Run a worker's cases (a worker's `if __name__ == "__main__": run_cases(globals())`)."""
    script = os.path.basename(sys.argv[0])
    run_scripts([(script, _selected(_cases_of(namespace)))])


def run_scripts(scripts):
    """Run, in order, each (script name, [(case name, function)]) of the list in one job:
    tests/workers/bundle.py runs several workers this way, paying for one launch."""
    torch.set_num_threads(1)
    fm.Init()
    results = _Results(os.environ.get(RESULTS_ENV))
    total, world = 0, fm.total_workers()
    for script, cases in scripts:
        cases = [(k, v) for k, v in cases if world in getattr(v, "world_sizes", (world,))]
        results.script = script
        results.write("begin", cases=[k for k, _ in cases])
        for name, fn in cases:
            results.write("started", name)
            t0 = time.perf_counter()
            try:
                fn()
                fm.barrier()  # every rank finished the case
            except BaseException as e:
                # The traceback from the case down (this frame left out), then abort as before.
                tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
                results.write(
                    "failed",
                    name,
                    message=f"{type(e).__name__}: {e}",
                    traceback=tb,
                    seconds=time.perf_counter() - t0,
                )
                raise
            results.write("passed", name, seconds=time.perf_counter() - t0)
            if fm.local_rank() == 0:
                print(f"ok {name} ({time.perf_counter() - t0:.2f}s)", flush=True)
        results.write("end")
        total += len(cases)
    if fm.local_rank() == 0:
        print(f"HARNESS: all {total} cases passed on {fm.total_workers()} ranks", flush=True)
