"""The mpiexec job of launch(): the command (``_mpiexec``), the ranks' environment
(``_child_env``: the caller's, less what an outer MPI launcher left in it) and ending every
process of the job (``_kill_group``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from .._util.mpiexec import default_mpiexec

__all__: list[str] = []

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
