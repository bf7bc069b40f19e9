"""Start-up and rank helpers: Init, Initialized, local_rank, total_workers, barrier."""

from __future__ import annotations

import atexit
import os
import socket
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .._core import C
from . import elastic as _elastic
from . import excepthooks as _excepthooks
from . import launcher_link as _launcher_link
from . import recorder as _recorder
from . import stall as _stall
from . import stop as _stop
from ._gpu_route import apply_cuda_schedule, bad_nccl_switch, cuda_route, shared_by_identity
from .agreement import raise_together, set_debug_mode
from .entry import local_call
from .gpu_choice import choose_gpu, cuda_schedule_setting, device_before_init
from .groups import group_dispatch
from .preferences import cudampi_enabled
from .printing import fluxmpi_println
from .slurm import job_label, srun_without_pmi
from .stall import DEFAULT

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = [
    "Init",
    "Initialized",
    "local_rank",
    "total_workers",
    "node_local_rank",
    "node_size",
    "barrier",
    "build_info",
]

_lock = threading.Lock()
# The CUDA schedule of this rank's GPU after Init (C.cuda_schedule); None without one.
_CUDA_SCHEDULE: list[str | None] = [None]


def _comm_handle(comm) -> int:
    if comm is None:
        return 0
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise TypeError(
            "Init(comm=...) takes an mpi4py communicator, but mpi4py is not installed"
        ) from e
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"Init(comm=...) takes an mpi4py communicator, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError(
            "Init(comm=MPI.COMM_NULL): call Init only on the ranks inside the communicator"
        )
    return int(MPI._handleof(comm))


def _at_exit():
    if C.initialized():
        C.shutdown()  # also wakes the stack thread, which then returns into Python
        # Let it finish before the interpreter finalizes: a thread that retakes the GIL during
        # finalization is ended by pthread_exit, whose unwind through C++ aborts the process.
        _stall.join_stack_thread(timeout=5.0)


@local_call  # its first call agrees on its own (raise_together); a later one is local
def Init(
    gpu_devices: Sequence[int] | None = None,
    verbose: bool = False,
    comm: MPI.Comm | None = None,
    stall_warning: float | None = DEFAULT,
    timeout: float | None = DEFAULT,
    debug: str | None = None,
    flight_dir: str | os.PathLike | None = DEFAULT,
    on_failure: str | None = None,
) -> None:
    """Start fluxmpi_py: MPI (asking for MPI_THREAD_MULTIPLE), or a world of one.

    Call it on every rank before the other calls. Without mpiexec (``python``, Jupyter) the
    world has one rank. It also sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` from MPI where no launcher of torch's did, so that
    ``torch.distributed.init_process_group("fluxmpi")`` needs nothing else. A second call
    applies ``stall_warning``, ``timeout``, ``debug`` and ``flight_dir`` where given, and warns
    about ``gpu_devices``, ``comm`` and ``verbose=True``, which only the first call applies.
    Under Slurm, ``srun --mpi=pmix -n N python train.py`` makes the step's tasks the ranks (the
    stall reports name the job and step); a step of several tasks without PMI (``srun -n N``
    alone) raises RuntimeError on every task before MPI starts, naming ``srun --mpi=pmix``.
    SIGUSR1 and SIGTERM become an agreed stop at a step boundary once the program asks
    `stop_requested`; before that they keep their old action.

    Args:
        gpu_devices: the GPU of each node-local rank (``gpu_devices[node_local_rank()]``);
            None: ``node_local_rank() % torch.cuda.device_count()``. Ignored without CUDA.
        verbose: each rank prints the device it took.
        comm: an mpi4py communicator, to run on its ranks only; None: the whole job.
        stall_warning: seconds a collective waits before a report names the ranks that have
            not entered it; None or 0: never. DEFAULT: ``FLUXMPI_STALL_WARNING``, else 60.
        timeout: seconds a collective waits before the job is aborted with that report;
            None or 0: never. DEFAULT: ``FLUXMPI_TIMEOUT``, else 1800.
        debug: ``"detail"`` adds each collective's call site to the ranks' agreement, so
            that swapped calls raise naming both lines; ``"off"``: not. None:
            ``FLUXMPI_DEBUG``, else ``"off"``.
        flight_dir: where each rank writes its last 256 collectives on the stall timeout,
            an abort or SIGTERM/SIGINT (read them with ``python -m fluxmpi_py.flight DIR``);
            None: nowhere. DEFAULT: ``FLUXMPI_FLIGHT_DIR``, else nowhere.
        on_failure: what a lost rank does: ``"abort"`` ends the job; ``"shrink"`` lets the
            survivors go on (`recover`), and needs an MPI with ULFM launched with it on
            (``python -m fluxmpi_py.run --elastic``): without one it raises on every rank,
            saying how to get one. None: ``FLUXMPI_ON_FAILURE``, else ``"abort"``.

    Raises:
        ValueError: on every rank, for a bad ``debug``, ``stall_warning``, ``timeout`` or
            NCCL setting on any rank.
        TypeError: ``comm`` is not an mpi4py communicator, or ``flight_dir`` not a path.

    Examples:
        >>> import fluxmpi_py as fm
        >>> fm.Init()
        >>> fm.Initialized(), fm.local_rank() < fm.total_workers()
        (True, True)
    """
    warning_s, timeout_s = _stall.settings(stall_warning, timeout)
    problem: Exception | None = set_debug_mode(debug)
    flight = None
    try:
        flight = _recorder.settings(flight_dir)
    except (TypeError, ValueError) as e:
        problem = problem or e
    mode = "abort"
    try:
        mode = _elastic.setting(on_failure)
    except ValueError as e:
        problem = problem or e
    with _lock:
        first = not C.initialized()
        early = None
        if first:
            # srun -n N without PMIx: every task sees the same environment, so each raises
            # here, before MPI_Init would abort or make N worlds of one.
            mistake = srun_without_pmi(os.environ)
            if mistake is not None:
                raise RuntimeError(mistake)
            # The launcher's local rank picks the GPU before MPI_Init, so that a CUDA-aware
            # MPI starts on it; MPI's node-local rank confirms the choice below.
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            early = device_before_init(os.environ, count, gpu_devices)
            if early is not None:
                torch.cuda.set_device(early)
        C.init(_comm_handle(comm))
        if first or stall_warning is not DEFAULT or timeout is not DEFAULT:
            if not first:  # a second call changes what it names, and keeps the other
                in_force = C.stall_settings()
                warning_s = in_force[0] if stall_warning is DEFAULT else warning_s
                timeout_s = in_force[1] if timeout is DEFAULT else timeout_s
            C.set_stall_settings(warning_s, timeout_s)
        if flight is not None and (first or flight_dir is not DEFAULT):
            try:
                _recorder.apply(flight[0], flight[1])
            except OSError as e:
                problem = problem or OSError(f"Init(flight_dir=...): {e}")
        if not first:
            if problem is not None:
                raise problem
            _warn_not_applied(gpu_devices, verbose, comm)
            return
        atexit.register(_at_exit)
        label = job_label(os.environ)
        C.set_job_label(label)  # the stall reports name the Slurm job and step
        _stop.install_handlers()  # SIGUSR1/SIGTERM: an agreed stop once stop_requested() asks
        if flight is not None and flight[2]:
            atexit.register(_recorder.write_timeline, flight[2])
        # Under python -m fluxmpi_py.run: its line to this rank (it sees the rank exit, and with
        # what status: --elastic reports the survivors'; in the shrink mode it hears which
        # ranks the survivors excluded, and tells them)
        fd = _launcher_link.connect(C.rank(), C.size())
        if fd is not None:
            C.report_exit_status_to(fd)
            C.watch_launcher_line(fd, f"[rank {C.rank()} / {C.size()}] ")
        # disable_cudampi_support(): the collectives NCCL lacks stage CUDA tensors through host
        # memory instead of handing device pointers to a CUDA-aware MPI.
        C.set_cuda_mpi_allowed(cudampi_enabled())
        if C.size() > 1:
            _stall.start_stack_thread()
            _excepthooks.install()
        problem = problem or bad_nccl_switch(C.rank())
        problem = problem or _elastic.apply(mode)  # the same verdict on every rank
        schedule = ""
        try:
            schedule = cuda_schedule_setting(os.environ, C.rank())
        except ValueError as e:
            problem = problem or e
        raise_together(problem, "Init()")  # a bad debug= on one rank raises on all
        _set_rendezvous_env()
        choice = choose_gpu(C.node_rank(), C.node_size(), count, gpu_devices)
        if choice.device is not None:
            if choice.device != early:
                torch.cuda.set_device(choice.device)
            device = torch.device("cuda", choice.device)
            if C.compiled_with_cuda():
                _CUDA_SCHEDULE[0] = apply_cuda_schedule(schedule, C.rank())
        else:
            device = torch.device("cpu")
        # NCCL on a stream of its own, and NCCL calls that return once queued instead of
        # waiting on the host (csrc/backend/select.h), as measured best on an H100
        # (docs/measurements.md); FLUXMPI_NCCL_COMM_STREAM=0 and FLUXMPI_NCCL_HOST_WAIT=1 undo them.
        C.set_nccl_comm_stream(os.environ.get("FLUXMPI_NCCL_COMM_STREAM", "1") == "1")
        C.set_nccl_host_wait(os.environ.get("FLUXMPI_NCCL_HOST_WAIT", "0") == "1")
        # NCCL allows one rank per GPU. Where ranks of a node share one, CUDA collectives go
        # over MPI instead (staged through pinned host memory), unless NCCL is told to share
        # (NCCL_HOSTID / NCCL_MULTI_RANK_GPU_ENABLE; see scripts/gpu_check.sh) or
        # FLUXMPI_CUDA_OVER_MPI=0 asks for NCCL anyway, and FLUXMPI_CUDA_OVER_MPI=1 sends them
        # over MPI always.
        if C.size() > 1:
            choice = shared_by_identity(choice)
        over_mpi, why, nccl_groups = cuda_route(choice)
        C.set_cuda_over_mpi(over_mpi)
        C.set_cuda_refusal(why)
        # group= on CUDA over an NCCL communicator of the group's members, not MPI (every check
        # of scripts/gpu_ranks_check.py passed so on an H200, 2026-11-28); FLUXMPI_NCCL_GROUPS=0
        # on any rank stages every group's CUDA tensors through host memory over its MPI
        # communicator instead, on every rank (a route the ranks must agree on).
        C.set_nccl_groups(nccl_groups)
        quiet = os.environ.get("FLUXMPI_CUDA_OVER_MPI") == "1"
        if over_mpi and choice.shared and not quiet and C.node_rank() == 0:
            warnings.warn(
                f"fluxmpi_py: {choice.sharing_message()}; NCCL allows one rank per GPU, so "
                "CUDA collectives go over MPI, staged through host memory (correct, slower "
                "than NCCL). Run one rank per GPU, or choose distinct GPUs with "
                "Init(gpu_devices=[...]); FLUXMPI_CUDA_OVER_MPI=1 silences this",
                stacklevel=2,
            )
        if verbose:
            where = f", {label}" if label else ""
            fluxmpi_println(
                f"using {device} (node-local rank {C.node_rank()} of {C.node_size()}{where})"
            )


def _warn_not_applied(gpu_devices, verbose: bool, comm) -> None:
    """A second Init: say which of the arguments asked for only the first call applies."""
    ignored = [
        f"{name}={value!r}"
        for name, value, asked in (
            ("gpu_devices", gpu_devices, gpu_devices is not None),
            ("verbose", verbose, bool(verbose)),
            ("comm", comm, comm is not None),
        )
        if asked
    ]
    if ignored:
        warnings.warn(
            f"Init({', '.join(ignored)}): fluxmpi_py is already started, and only the first "
            "Init applies these (a second call applies stall_warning, timeout, debug and "
            "flight_dir); pass them to the first Init",
            stacklevel=3,
        )


def _launched_by_mpi() -> bool:
    """Whether an MPI launcher (Open MPI's mpiexec, MPICH's or Slurm's PMI) started this
    process, from the environment it sets."""
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


_ADDRESS_BYTES = 256  # rank 0's host name travels as this many int64s (one byte each)


def _rank0_host() -> str:
    """Where the other ranks reach rank 0: 127.0.0.1 when every rank shares its node."""
    return "127.0.0.1" if C.node_size() == C.size() else socket.gethostname()


def _from_rank0(host: str, port: int) -> tuple[str, int]:
    """Rank 0's (host, port) on every rank; the others' arguments are ignored. Collective (one
    small allreduce on the world)."""
    name = host.encode()[:_ADDRESS_BYTES] if C.rank() == 0 else b""
    packed = torch.zeros(1 + _ADDRESS_BYTES, dtype=torch.int64)
    packed[0] = port if C.rank() == 0 else 0
    packed[1 : 1 + len(name)] = torch.tensor(list(name), dtype=torch.int64)
    C.allreduce_(packed, "max")  # the other ranks add zeros
    return bytes(int(b) for b in packed[1:] if b != 0).decode(), int(packed[0])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


_TORCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Names the values Init set: a process that inherits them (started by one that ran Init) sets
# its own instead of taking them for a launcher's.
_OURS = "FLUXMPI_TORCH_ENV"


def _torch_env() -> str:
    return ",".join(os.environ.get(k, "") for k in _TORCH_VARS)


def _set_rendezvous_env() -> None:
    """Let torch's env:// rendezvous run on MPI's ranks: set RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT where no launcher of torch's (torchrun sets RANK) has. Under mpiexec a
    MASTER_ADDR or MASTER_PORT left in the environment without RANK (a cluster's job script) is
    replaced; without an MPI launcher (a world of one) a MASTER_ADDR that is set is kept, with
    the rest. Collective: every rank takes part, whatever its environment."""
    host, port = _from_rank0(_rank0_host(), _free_port() if C.rank() == 0 else 0)
    inherited = os.environ.get(_OURS) == _torch_env()
    launcher = "RANK" in os.environ or (not _launched_by_mpi() and "MASTER_ADDR" in os.environ)
    if launcher and not inherited:
        return
    os.environ.update(
        RANK=str(C.rank()), WORLD_SIZE=str(C.size()), MASTER_ADDR=host, MASTER_PORT=str(port)
    )
    os.environ[_OURS] = _torch_env()


def rendezvous_store(timeout=None) -> dist.Store:
    """A store for torch.distributed's bookkeeping (and for gloo groups beside ours), made on
    every rank together: rank 0 serves a TCPStore on a free port and tells the others where.
    ``timeout``: a timedelta, or None for torch's default."""
    Init()
    size = C.size()
    kwargs = {} if timeout is None else {"timeout": timeout}
    store, host, port = None, _rank0_host(), 0
    if C.rank() == 0:  # port 0: the system picks a free one, taken at once
        store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, **kwargs)
        port = store.port
    host, port = _from_rank0(host, port)
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=False, **kwargs)
    return store


@local_call
def Initialized() -> bool:
    """True once Init() has run in this process.

    >>> import fluxmpi_py as fm; fm.Init(); fm.Initialized()
    True
    """
    return bool(C.initialized())


@local_call
def local_rank() -> int:
    """This process's rank in the job's communicator, 0 <= rank < total_workers().

    >>> import fluxmpi_py as fm; fm.Init(); fm.local_rank()
    0
    """
    return C.rank()


@local_call
def total_workers() -> int:
    """Number of ranks in the job's communicator.

    >>> import fluxmpi_py as fm; fm.Init(); fm.total_workers()
    1
    """
    return C.size()


@local_call
def node_local_rank() -> int:
    """This process's rank among the ranks on the same node (used to pick a GPU).

    >>> import fluxmpi_py as fm; fm.Init(); fm.node_local_rank()
    0
    """
    return C.node_rank()


@local_call
def node_size() -> int:
    """Number of ranks on this process's node (``node_local_rank()`` is below it).

    >>> import fluxmpi_py as fm; fm.Init(); 0 <= fm.node_local_rank() < fm.node_size() <= fm.total_workers()
    True
    """
    return C.node_size()


@group_dispatch("barrier()")
def barrier(*, group=None) -> None:
    """Block until every rank (every member of ``group``) has called barrier(). A collective.

    >>> import fluxmpi_py as fm; fm.Init(); fm.barrier()
    """
    C.barrier()  # on the group: group_dispatch entered it


@local_call
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
        # Whether the MPI library takes CUDA pointers ("yes"/"no"; "unknown" before Init).
        "cuda_aware_mpi": C.mpi_cuda_support(),
        # where CUDA tensors' collectives run: "nccl", or "mpi" (ranks sharing a GPU, or
        # FLUXMPI_CUDA_OVER_MPI=1); None without CUDA in the build
        "cuda_collectives": (
            ("mpi" if C.cuda_over_mpi() else "nccl") if C.compiled_with_cuda() else None
        ),
        # how a thread waiting for this rank's GPU uses its CPU (FLUXMPI_CUDA_SCHEDULE; "auto"
        # is CUDA's default); None before Init or without a GPU
        "cuda_schedule": _CUDA_SCHEDULE[0],
        "thread_multiple": bool(C.initialized() and C.thread_level() >= 3),
        "mpi_wait": C.wait_policy() or None,
    }
