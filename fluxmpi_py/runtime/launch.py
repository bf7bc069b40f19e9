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
"""

from __future__ import annotations

import inspect
import json
import os
import pickle
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections import deque
from typing import Any, Callable

from .._util.files import write_atomic
from .._util.mpiexec import default_mpiexec
from .world import Init, local_rank

try:  # optional: by-value pickling of notebook functions
    import cloudpickle as _cloudpickle
except ImportError:  # pragma: no cover - depends on the environment
    _cloudpickle = None

__all__ = ["launch", "LaunchError"]

# Variables that an MPI launcher (or a singleton MPI_Init) puts into a rank's environment.
# A nested mpiexec that inherits them believes it is part of the outer job, so they go.
_LAUNCHER_PREFIXES = (
    "PMIX_",
    "PMI_",
    "OMPI_COMM_WORLD_",
    "OMPI_MCA_orte_",
    "OMPI_MCA_ess",
    "OMPI_MCA_pmix",
    "HYDRA_",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
)
_LAUNCHER_NAMES = (
    "OMPI_APP_CTX_NUM_PROCS",
    "OMPI_COMMAND",
    "OMPI_FILE_LOCATION",
    "OMPI_FIRST_RANKS",
    "OMPI_NUM_APP_CTX",
    "OMPI_UNIVERSE_SIZE",
    "OMPI_ARGV",
    "OMPI_MCA_initial_wdir",
    "OMPI_MCA_mpi_oversubscribe",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
)

_CHILD_CODE = (
    "import sys; from fluxmpi_py.runtime.launch import _child_main; _child_main(sys.argv[1])"
)
_TAIL_LINES = 60


class LaunchError(RuntimeError):
    """A rank of :func:`launch` failed. ``rank`` is the failing rank (or None when the job
    died without a Python exception), ``remote_traceback`` its traceback text and
    ``exc_type`` the name of the exception it raised.

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


def _child_env(np: int, extra: dict | None) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES
    }
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",  # Open MPI 4; 5 (PRRTE) reads the next one
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
        PYTHONUNBUFFERED="1",
    )
    # Share the cores instead of every rank starting one thread per core.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // np)))
    # The ranks must import what the parent imports (fluxmpi_py, the module of fn).
    paths = [p or os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # A notebook's inline plotting backend means nothing to a headless rank.
    if env.get("MPLBACKEND", "").startswith("module://"):
        del env["MPLBACKEND"]
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


def _session_members(sid: int):
    """Pids in session ``sid`` (Linux /proc; empty elsewhere). Open MPI puts each rank in a
    process group of its own, so killing mpiexec's group alone can leave ranks behind; they
    all stay in the session that start_new_session gave mpiexec."""
    pids = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to mpiexec (it forwards it to the ranks), then SIGKILL to whatever is left of
    the job's session, ranks included."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=3.0)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    for _ in range(50):
        members = [p for p in _session_members(proc.pid) if p != os.getpid()]
        if proc.poll() is None:
            members.append(proc.pid)
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass


def _stream(proc: subprocess.Popen, deadline: float | None, tail: deque) -> bool:
    """Copy the ranks' stdout/stderr to ours as it arrives (from this thread, so that Jupyter
    shows it under the running cell). Returns False if the deadline passed first."""
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None  # started with PIPEs
    sinks = {proc.stdout.fileno(): sys.stdout, proc.stderr.fileno(): sys.stderr}
    partial = {fd: b"" for fd in sinks}
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            for key, _ in sel.select(timeout=wait):
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
        return True
    finally:
        sel.close()


_MPIEXEC = None


def _mpiexec() -> list:
    """mpiexec, with --oversubscribe when it is Open MPI's (MPICH's has no such flag and no
    such limit): more ranks than cores is the normal case on a laptop or a notebook server."""
    global _MPIEXEC
    if _MPIEXEC is None:
        path = next(
            (p for p in (default_mpiexec("mpiexec"), default_mpiexec("mpirun")) if os.sep in p),
            None,
        )
        if path is None:
            raise RuntimeError(
                "launch: mpiexec is not on PATH; install Open MPI "
                "(apt-get install openmpi-bin) or MPICH"
            )
        try:
            version = subprocess.run(
                [path, "--version"],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            version = ""
        openmpi = "Open MPI" in version or "OpenRTE" in version or "PRRTE" in version
        _MPIEXEC = [path, "--oversubscribe"] if openmpi else [path]
    return _MPIEXEC


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


def launch(fn: Callable, *args, np: int = 2, timeout: float | None = None, **kwargs) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``np`` MPI ranks and return rank 0's result.

    Each rank calls ``Init()`` first, so ``fn`` sees a world of ``np``. The ranks' output is
    streamed live to this process's stdout/stderr. If any rank raises, :class:`LaunchError`
    (a RuntimeError) is raised here with that rank's number and traceback. ``timeout`` (seconds,
    None for no limit) bounds the whole run: when it passes, every rank is killed and
    ``TimeoutError`` is raised. Needs ``mpiexec`` (Open MPI or MPICH) on PATH. See the module
    docstring for how ``fn`` travels (cloudpickle, pickle by reference, or its source).

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
            finished = _stream(proc, deadline, tail)
            if finished:
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
            raise LaunchError(
                f"launch: rank {failure['rank']} of {np} raised {failure['type']}: {failure['message']}\n"
                f"\nTraceback on rank {failure['rank']}:\n{failure['traceback']}",
                rank=failure["rank"],
                exc_type=failure["type"],
                remote_traceback=failure["traceback"],
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
        record = {
            "rank": rank,
            "time": time.time(),
            "type": type(e).__name__,
            "message": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
        }
        write_atomic(os.path.join(workdir, f"error.{rank}.json"), json.dumps(record).encode())
        raise  # on several ranks, Init's excepthook aborts the job so no rank waits forever
