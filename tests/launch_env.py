"""The environment of the suite's launches: what a rank under mpiexec, and a world of one
without it, get from the pytest process (tests/mpi_util.py and tests/forks.py read it)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Set by the suite's services for every later launch: where the fork server listens
# (tests/forks.py), once it is started.
SUITE_ENV: dict = {}


def mpi_env(extra=None):
    # torch's rendezvous variables, which fm.Init() in this process may have set, are the
    # launch's own business: a test that wants them passes them in `extra`
    drop = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FLUXMPI_TORCH_ENV")
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
