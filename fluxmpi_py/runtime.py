"""Start-up and rank helpers: Init, Initialized, local_rank, total_workers, printing."""
from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from typing import Optional, Sequence

import torch

from ._loader import C

__all__ = [
    "Init",
    "Initialized",
    "local_rank",
    "total_workers",
    "node_local_rank",
    "barrier",
    "build_info",
    "fluxmpi_print",
    "fluxmpi_println",
    "disable_cudampi_support",
    "cudampi_enabled",
]

_lock = threading.Lock()
_device: Optional[torch.device] = None


def _prefs_path() -> str:
    base = os.environ.get("FLUXMPI_PY_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "fluxmpi_py"
    )
    return os.path.join(base, "preferences.json")


def _read_prefs() -> dict:
    try:
        with open(_prefs_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# Read once per process: like FluxMPI, a changed preference takes effect at the next start.
_CUDAMPI_ENABLED = not _read_prefs().get("disable_cudampi", False)


def disable_cudampi_support(disable: bool = True) -> str:
    """Persist whether CUDA tensors may be handed to MPI directly (CUDA-aware MPI).

    Takes effect at the next start of Python, as in FluxMPI. Returns the preferences file.
    Tensors on CUDA normally travel through NCCL; this matters only where NCCL is absent.

    >>> import fluxmpi_py as fm, os, tempfile
    >>> os.environ["FLUXMPI_PY_CONFIG_DIR"] = tempfile.mkdtemp()
    >>> path = fm.disable_cudampi_support(True)
    >>> import json; json.load(open(path))["disable_cudampi"]
    True
    """
    path = _prefs_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    prefs = _read_prefs()
    prefs["disable_cudampi"] = bool(disable)
    tmp = path + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(prefs, f)
    os.replace(tmp, path)
    return path


def cudampi_enabled() -> bool:
    """Whether CUDA-aware MPI use is enabled for this process (see disable_cudampi_support).

    >>> import fluxmpi_py as fm; isinstance(fm.cudampi_enabled(), bool)
    True
    """
    return _CUDAMPI_ENABLED


def _comm_handle(comm) -> int:
    if comm is None:
        return 0
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise TypeError("Init(comm=...) takes an mpi4py communicator, but mpi4py is not installed") from e
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"Init(comm=...) takes an mpi4py communicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("Init(comm=MPI.COMM_NULL): call Init only on the ranks inside the communicator")
    return int(MPI._handleof(comm))


_previous_excepthook = sys.excepthook


def _excepthook(exc_type, exc, tb):
    # An uncaught exception on one rank would leave the others blocked in their next
    # collective. Show it as usual, then abort the whole job so that it ends within seconds.
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


def _at_exit():
    if C.initialized():
        C.shutdown()


def Init(gpu_devices: Optional[Sequence[int]] = None, verbose: bool = False, comm=None) -> None:
    """Start fluxmpi_py: MPI (asking for MPI_THREAD_MULTIPLE), or a world of one.

    Idempotent. Without mpiexec (a plain ``python`` or Jupyter) the world has one rank.
    ``comm`` takes an mpi4py communicator to run on a subset of ranks. When CUDA is available
    each rank takes GPU ``gpu_devices[node_local_rank()]``, or ``node_local_rank() % count``.

    >>> import fluxmpi_py as fm
    >>> fm.Init()
    >>> fm.Initialized(), fm.local_rank() < fm.total_workers()
    (True, True)
    """
    global _device, _previous_excepthook
    with _lock:
        first = not C.initialized()
        C.init(_comm_handle(comm))
        if not first:
            return
        atexit.register(_at_exit)
        if C.size() > 1:
            _previous_excepthook = sys.excepthook
            sys.excepthook = _excepthook
            threading.excepthook = _thread_excepthook
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            if gpu_devices is not None:
                if len(gpu_devices) <= C.node_rank():
                    raise ValueError(
                        f"Init(gpu_devices={list(gpu_devices)}): rank {C.rank()} is node-local rank "
                        f"{C.node_rank()} and needs at least {C.node_rank() + 1} entries"
                    )
                dev = int(gpu_devices[C.node_rank()])
            else:
                dev = C.node_rank() % n
            torch.cuda.set_device(dev)
            _device = torch.device("cuda", dev)
        else:
            _device = torch.device("cpu")
        if verbose:
            fluxmpi_println(f"using {_device} (node-local rank {C.node_rank()} of {C.node_size()})")


def Initialized() -> bool:
    """True once Init() has run in this process.

    >>> import fluxmpi_py as fm; fm.Init(); fm.Initialized()
    True
    """
    return bool(C.initialized())


def local_rank() -> int:
    """This process's rank in the job's communicator, 0 <= rank < total_workers().

    >>> import fluxmpi_py as fm; fm.Init(); fm.local_rank()
    0
    """
    return C.rank()


def total_workers() -> int:
    """Number of ranks in the job's communicator.

    >>> import fluxmpi_py as fm; fm.Init(); fm.total_workers()
    1
    """
    return C.size()


def node_local_rank() -> int:
    """This process's rank among the ranks on the same node (used to pick a GPU).

    >>> import fluxmpi_py as fm; fm.Init(); fm.node_local_rank()
    0
    """
    return C.node_rank()


def barrier() -> None:
    """Block until every rank has called barrier(). A collective.

    >>> import fluxmpi_py as fm; fm.Init(); fm.barrier()
    """
    C.barrier()


def build_info() -> dict:
    """Versions this process runs with: torch, MPI vendor and standard, CUDA and NCCL.

    >>> import fluxmpi_py as fm; sorted(fm.build_info())[:3]
    ['compiled_torch', 'compiled_with_cuda', 'cuda']
    """
    return {
        "torch": torch.__version__,
        "compiled_torch": C.compiled_torch_version,
        "mpi_library": C.mpi_library_version(),
        "mpi_standard": C.mpi_standard_version(),
        "cuda": torch.version.cuda,
        "compiled_with_cuda": bool(C.compiled_with_cuda()),
        "nccl": C.nccl_version() or None,
        "cuda_mpi_enabled": cudampi_enabled(),
        "thread_multiple": bool(C.initialized() and C.thread_level() >= 3),
    }


def _prefix() -> str:
    if not C.initialized():
        raise RuntimeError("fluxmpi_py is not initialized: call fluxmpi_py.Init() first")
    return f"[{C.rank()} / {C.size()}] "


def _write(text: str, file) -> None:
    # One write per call, so lines from different ranks never interleave mid-line.
    file = file or sys.stdout
    file.flush()
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None  # Jupyter and captured streams have no descriptor
    if fd is None:
        file.write(text)
        file.flush()
        return
    data = text.encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]


def fluxmpi_print(*args, sep: str = " ", end: str = "", file=None, ordered: bool = False) -> None:
    """print() with a ``[rank / size] `` prefix, written atomically; no newline by default.

    Not a collective: one rank alone may call it. ``ordered=True`` is a collective (every
    rank must call it): rank 0 gathers every rank's text and writes it in rank order, in one
    write to its ``file`` (separate writes from each rank could reach the terminal in any
    order, since mpiexec forwards each rank's output on its own).

    >>> import fluxmpi_py as fm; fm.Init(); fm.fluxmpi_print("loss", 0.5, end="\\n")
    [0 / 1] loss 0.5
    """
    text = _prefix() + sep.join(str(a) for a in args) + end
    if not ordered or C.size() == 1:
        _write(text, file)
        return
    from .collectives import allreduce_

    data = bytearray(text.encode())
    rank, size = C.rank(), C.size()
    lengths = torch.zeros(size, dtype=torch.int64)
    lengths[rank] = len(data)
    allreduce_(lengths)
    start = int(lengths[:rank].sum())
    buf = torch.zeros(int(lengths.sum()), dtype=torch.uint8)
    if data:
        buf[start : start + len(data)] = torch.frombuffer(data, dtype=torch.uint8)
    allreduce_(buf)
    if rank == 0:
        _write(buf.numpy().tobytes().decode(errors="replace"), file)


def fluxmpi_println(*args, sep: str = " ", file=None, ordered: bool = False) -> None:
    """fluxmpi_print with a trailing newline.

    >>> import fluxmpi_py as fm; fm.Init(); fm.fluxmpi_println("hello")
    [0 / 1] hello
    """
    fluxmpi_print(*args, sep=sep, end="\n", file=file, ordered=ordered)


def _device_for_rank() -> torch.device:
    return _device or torch.device("cpu")
