"""The environment of the suite's launches: what a rank under mpiexec, and a world of one
without it, get from the pytest process (tests/mpi_util.py and tests/forks.py read it)."""

import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Set by the suite's services for every later launch: where the fork server listens
# (tests/forks.py), once it is started.
SUITE_ENV: dict = {}


# Open MPI's session directories: mpiexec's ${TMPDIR:-/tmp}/ompi.PID, a daemon's /tmp/prted.PID.
_SESSION_DIR = re.compile(r"(ompi|prted)\.([0-9]+)")


def remove_stale_session_dirs():
    """Remove the session directories of Open MPI processes that are gone (killed: a clean exit
    removes its own). PMIx 5.0.11rc1 (in PyPI's Open MPI 5.0.11) refuses to start a server whose
    rendezvous file is already there, and names it "The PMIx server's listener thread failed to
    start" (exit 213; openpmix#4022, fixed upstream by #4046): a new mpiexec that gets the pid of
    one that the suite SIGKILLed (pids here wrap at 32768) failed so. Only this user's, and only
    where no process has that pid now; each launch's environment calls it (a few ms)."""
    for base in {os.environ.get("TMPDIR") or "/tmp", "/tmp"}:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            m = _SESSION_DIR.fullmatch(name)
            path = os.path.join(base, name)
            try:
                if not m or os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
                    continue
                os.kill(int(m.group(2)), 0)
            except ProcessLookupError:
                shutil.rmtree(path, ignore_errors=True)
            except (OSError, ValueError):
                continue


def mpi_env(extra=None):
    # torch's rendezvous variables, which fm.Init() in this process may have set, are the
    # launch's own business: a test that wants them passes them in `extra`
    drop = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FLUXMPI_TORCH_ENV")
    remove_stale_session_dirs()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",  # Open MPI 4's launcher; 5's (PRRTE):
        PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
        PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(SUITE_ENV)
    if extra:
        env.update(extra)
    return env


def singleton_env(extra=None):
    """mpi_env without the variables mpiexec sets: a plain `python` is a world of one."""
    env = mpi_env(extra)
    for k in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_", "OMPI_MCA_orte"))]:
        del env[k]
    return env
