"""Run a function on N MPI ranks from a notebook or a script: ``launch(fn, *args, np=N)``.

How the function travels to the ranks (the choice is automatic):

1. With ``cloudpickle`` installed (it comes with scikit-learn, through joblib), the function
   and its arguments are pickled with it: importable functions by reference, functions
   defined in a notebook or in a script's ``__main__`` by value, with the notebook globals
   they use. This is the normal path.
2. Without cloudpickle, an importable function (defined in a module on ``sys.path``) is
   pickled by reference. A function from ``__main__`` (a notebook cell) cannot be imported
   by the ranks, so its source text (``inspect.getsource``) is sent and executed there; it
   must then do its own imports and may only use its arguments, not other notebook globals.

The ranks run under ``mpiexec`` (with ``--oversubscribe`` for Open MPI) with the parent's
``sys.path`` and working directory; each rank calls ``Init()`` before ``fn``. Their output is
streamed as it comes. ``launch`` returns rank 0's return value, or raises :class:`LaunchError`
carrying the traceback of the rank that failed first. A timeout, an error or Ctrl-C (a Jupyter
interrupt) kills every process of the job, so no rank outlives the call.

A rank that raises prints nothing: it records its exception for the caller and waits to be
ended. The caller, which watches for such records while it streams the output, ends the whole
job at once and raises LaunchError, so the failure is shown once, in the error (with the
notebook cell's name and line, launch_traceback.py), and no abort message of the MPI library
follows it.
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import selectors
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections import deque
from typing import Any, Callable

from .._util.files import write_atomic
from .entry import local_call
from .launch_job import _child_env, _kill_group, _mpiexec
from .launch_traceback import rewrite, where
from .world import Init, local_rank

try:  # optional: by-value pickling of notebook functions
    import cloudpickle as _cloudpickle
except ImportError:  # pragma: no cover - depends on the environment
    _cloudpickle = None

__all__ = ["launch", "LaunchError"]

_CHILD_CODE = (
    "import sys; from fluxmpi_py.runtime.launch import _child_main; _child_main(sys.argv[1])"
)
_TAIL_LINES = 60
# How long a failed rank waits for launch() to end the job (it does so within a second);
# past this the rank exits by itself, in case the caller is gone.
_FAILED_RANK_WAIT_S = 60.0
# How long launch() keeps copying the ranks' output once a rank has failed.
_FAILURE_GRACE_S = 0.3


class LaunchError(RuntimeError):
    """A rank of :func:`launch` failed. ``rank`` is the failing rank (or None when the job
    died without a Python exception), ``remote_traceback`` its traceback text and
    ``exc_type`` the name of the exception it raised.

    Args:
        message: the error's text: the rank, its exception and its traceback.
        rank: the failing rank; None when the job died without a Python exception.
        exc_type: the name of the exception the rank raised (``"ValueError"``).
        remote_traceback: the rank's traceback, as text.

    >>> import fluxmpi_py as fm
    >>> issubclass(fm.LaunchError, RuntimeError)
    True
    """

    def __init__(
        self,
        message: str,
        rank: int | None = None,
        exc_type: str | None = None,
        remote_traceback: str = "",
    ):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback


def _dumps(obj) -> bytes:
    if _cloudpickle is not None:
        return _cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _encode_callable(fn: Callable) -> dict:
    """How fn travels: see the module docstring."""
    if _cloudpickle is not None:
        return {"kind": "pickle", "data": _cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)}
    if getattr(fn, "__module__", None) != "__main__":
        try:
            return {"kind": "pickle", "data": pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)}
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise TypeError(
                f"launch: cannot pickle {fn!r} ({e}); pass a module-level function, "
                f"or install cloudpickle"
            ) from e
    name = getattr(fn, "__name__", "")
    if not inspect.isfunction(fn) or name == "<lambda>":
        raise TypeError(
            f"launch: {fn!r} is defined in __main__ and cloudpickle is not installed, "
            f"so it must be a named function (def) whose source can be sent to the ranks"
        )
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise TypeError(
            f"launch: the source of {name} is not available ({e}); define it in a "
            f"module, or install cloudpickle"
        ) from e
    return {"kind": "source", "source": source, "name": name}


def _decode_callable(spec: dict) -> Callable:
    if spec["kind"] == "pickle":
        return pickle.loads(spec["data"])
    namespace: dict[str, Any] = {"__name__": "__fluxmpi_launch__"}
    exec(compile(spec["source"], f"<launch: source of {spec['name']}>", "exec"), namespace)
    return namespace[spec["name"]]


def _stream(
    proc: subprocess.Popen, deadline: float | None, tail: deque, failed: Callable[[], bool]
) -> str:
    """Copy the ranks' stdout/stderr to ours as it arrives (from this thread, so that Jupyter
    shows it under the running cell), until the job ends ("done"), the deadline passes
    ("timeout") or ``failed()`` says a rank has failed ("failed": checked every 0.1 s; the
    output keeps being copied for _FAILURE_GRACE_S more, for what mpiexec still forwards of
    what the ranks wrote before, and for the other ranks that raise together to record)."""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None  # started with PIPEs
    sinks = {proc.stdout.fileno(): sys.stdout, proc.stderr.fileno(): sys.stderr}
    partial = {fd: b"" for fd in sinks}
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    checked, stop_at = time.monotonic(), None
    try:
        while sel.get_map():
            now = time.monotonic()
            if stop_at is not None and now >= stop_at:
                return "failed"
            wait = 0.1 if deadline is None else min(0.1, deadline - now)
            if wait <= 0:
                return "failed" if stop_at is not None else "timeout"
            ready = sel.select(timeout=wait)
            if stop_at is None and (not ready or time.monotonic() - checked >= 0.1):
                checked = time.monotonic()  # also while a chatty rank keeps the pipes busy
                if failed():
                    stop_at = checked + _FAILURE_GRACE_S
            for key, _ in ready:
                fd = key.fd
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(fd)
                    chunk, partial[fd] = partial[fd], b""
                    if not chunk:
                        continue
                else:
                    chunk, partial[fd] = partial[fd] + chunk, b""
                    cut = chunk.rfind(b"\n") + 1
                    if cut == 0 and len(chunk) < 65536:
                        partial[fd] = chunk  # wait for the end of the line
                        continue
                    if cut:
                        chunk, partial[fd] = chunk[:cut], chunk[cut:]
                text = chunk.decode(errors="replace")
                tail.extend(text.splitlines())
                sinks[fd].write(text)
                sinks[fd].flush()
        return "failed" if stop_at is not None else "done"
    finally:
        sel.close()


def _any_failure(workdir: str) -> bool:
    return any(name.startswith("error.") for name in os.listdir(workdir))


def _first_failure(workdir: str, np: int) -> dict | None:
    found = []
    for r in range(np):
        try:
            with open(os.path.join(workdir, f"error.{r}.json")) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            continue
    # The first to fail is the cause; the others usually fail because of it.
    return min(found, key=lambda e: (e["time"], e["rank"])) if found else None


@local_call  # it starts a job of its own; the caller is one process
def launch(fn: Callable, *args, np: int = 2, timeout: float | None = None, **kwargs) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``np`` MPI ranks and return rank 0's result.

    Each rank calls ``Init()`` first, so ``fn`` sees a world of ``np``. The ranks' output is
    streamed live to this process's stdout/stderr. If any rank raises, :class:`LaunchError`
    (a RuntimeError) is raised here with that rank's number and traceback. ``timeout`` (seconds,
    None for no limit) bounds the whole run: when it passes, every rank is killed and
    ``TimeoutError`` is raised. Needs ``mpiexec`` (Open MPI or MPICH) on PATH. See the module
    docstring for how ``fn`` travels (cloudpickle, pickle by reference, or its source).

    Args:
        fn: the function each rank runs (a function of a notebook cell will do).
        *args: passed to ``fn``.
        np: the number of ranks.
        timeout: seconds for the whole run, after which every rank is killed; None: no limit.
        **kwargs: passed to ``fn``.

    Returns:
        What ``fn`` returned on rank 0.

    Raises:
        LaunchError: a rank raised; its rank, exception and traceback are in the error.
        TimeoutError: ``timeout`` passed.

    >>> import fluxmpi_py as fm
    >>> def world(scale):
    ...     import torch, fluxmpi_py as fm
    ...     return fm.allreduce_(torch.ones(1) * scale, op="sum").item(), fm.total_workers()
    >>> fm.launch(world, 3.0, np=2, timeout=120)  # doctest: +SKIP
    (6.0, 2)
    """
    if not callable(fn):
        raise TypeError(f"launch: fn must be callable, got {type(fn).__name__}")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError(f"launch: np must be an int >= 1 (the number of ranks), got {np!r}")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(
            f"launch: timeout must be a positive number of seconds or None, got {timeout!r}"
        )
    mpiexec = _mpiexec()
    name = getattr(fn, "__qualname__", repr(fn))
    payload = {"fn": _encode_callable(fn), "args": _dumps((args, kwargs))}
    files = where(fn)  # the cells and files of what travels, to name a rank's frames

    workdir = tempfile.mkdtemp(prefix="fluxmpi_launch_")
    try:
        with open(os.path.join(workdir, "call.pkl"), "wb") as f:
            pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
        cmd = [*mpiexec, "-n", str(np), sys.executable, "-u", "-c", _CHILD_CODE, workdir]
        deadline = None if timeout is None else time.monotonic() + timeout
        tail: deque = deque(maxlen=_TAIL_LINES)
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_child_env(np, None),
            start_new_session=True,
        )
        try:
            outcome = _stream(proc, deadline, tail, lambda: _any_failure(workdir))
            finished = outcome != "timeout"
            if outcome == "done":
                wait = None if deadline is None else max(0.1, deadline - time.monotonic())
                try:
                    proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    finished = False
        finally:
            _kill_group(proc)  # on success too: nothing of the job may survive the call
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if not finished:
            raise TimeoutError(
                f"launch: {name} on {np} ranks did not finish within {timeout} s; "
                f"all ranks were killed"
            )
        failure = _first_failure(workdir, np)
        if failure is not None:
            remote = rewrite(failure["traceback"], files)
            raise LaunchError(
                f"launch: rank {failure['rank']} of {np} raised {failure['type']}: "
                f"{failure['message']}\n\n{remote.rstrip()}",
                rank=failure["rank"],
                exc_type=failure["type"],
                remote_traceback=remote,
            )
        result_path = os.path.join(workdir, "result.pkl")
        if proc.returncode != 0 or not os.path.exists(result_path):
            raise LaunchError(
                f"launch: {name} on {np} ranks: mpiexec exited {proc.returncode} "
                f"without a Python exception; last output:\n" + "\n".join(tail)
            )
        with open(result_path, "rb") as f:
            return pickle.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _child_main(workdir: str) -> None:
    """Entry point of each rank (see _CHILD_CODE)."""
    Init()
    rank = local_rank()
    try:
        with open(os.path.join(workdir, "call.pkl"), "rb") as f:
            payload = pickle.load(f)
        fn = _decode_callable(payload["fn"])
        args, kwargs = pickle.loads(payload["args"])
        result = fn(*args, **kwargs)
        if rank == 0:
            write_atomic(os.path.join(workdir, "result.pkl"), _dumps(result))
    except BaseException as e:
        if isinstance(e, SystemExit) and e.code in (None, 0):
            raise
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # from fn on
        record = {
            "rank": rank,
            "time": time.time(),
            "type": type(e).__name__,
            "message": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, tb)),
        }
        write_atomic(os.path.join(workdir, f"error.{rank}.json"), json.dumps(record).encode())
        # Nothing printed, no abort: launch() sees the record and ends every rank of the job
        # at once, so that the traceback is shown once and no MPI abort message follows it.
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(_FAILED_RANK_WAIT_S)
        os._exit(1)
