"""What Slurm's environment says about this process: the job and step that ``srun`` started it
in, and the classic mistake, ``srun -n N`` without PMIx, caught before MPI starts.

``srun --mpi=pmix -n N python train.py`` gives each task PMIx's variables (``PMIX_RANK``), and
MPI_Init joins them into one world. Without a PMI plugin (``--mpi=none``, a cluster whose
``MpiDefault`` is none) each task starts MPI alone: Open MPI aborts with advice to rebuild Slurm,
and an MPI that falls back to a singleton gives N worlds of one that each train alone. A step
of several tasks with no PMI in the environment is that mistake.
"""

from __future__ import annotations

from collections.abc import Mapping

# Variables that some process manager's PMI sets in a task: PMIx, PMI-1/2, Open MPI's mpiexec.
_PMI_VARS = ("PMIX_RANK", "PMI_RANK", "PMI_FD", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_ID")


def _step_tasks(environ: Mapping[str, str]) -> int:
    for key in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"):
        try:
            return int(environ[key])
        except (KeyError, ValueError):
            continue
    return 0


def job_label(environ: Mapping[str, str]) -> str:
    """``"Slurm job 42, step 0"`` for a task that srun started (``"Slurm job 42"`` in a batch
    script), or ``""`` outside Slurm.

    >>> job_label({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"})
    'Slurm job 42, step 0'
    >>> job_label({})
    ''
    """
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return ""
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    return f"Slurm job {job}" + (f", step {step}" if step else "")


def srun_without_pmi(environ: Mapping[str, str]) -> str | None:
    """The error for a task of a Slurm step of several tasks that has no PMI to join them
    (``srun -n N`` without ``--mpi=pmix``), or None when the launch is sound.

    >>> srun_without_pmi({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1",
    ...                   "SLURM_JOB_ID": "7"})[:60]
    'fluxmpi_py.Init(): task 1 of the 2 tasks of Slurm job 7, ste'
    >>> srun_without_pmi({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "PMIX_RANK": "1"})
    """
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    tasks = _step_tasks(environ)
    if step is None or tasks < 2 or any(k in environ for k in _PMI_VARS):
        return None
    task = environ.get("SLURM_PROCID", "?")
    return (
        f"fluxmpi_py.Init(): task {task} of the {tasks} tasks of {job_label(environ)} has no "
        "PMI in its environment: srun started the tasks without an MPI plugin (--mpi=none, "
        "or the cluster's MpiDefault), so each would start MPI alone, as a world of one or "
        f"not at all. Launch with `srun --mpi=pmix -n {tasks} ...` (`srun --mpi=list` lists "
        "the plugins; an administrator can set MpiDefault=pmix in slurm.conf, or export "
        "SLURM_MPI_TYPE=pmix in the job script)"
    )
