"""tests/workers/stop_train.py's runs, shared by test_stop.py and test_slurm.py: the digests it
prints, and those of a run that was never stopped (the reference every resumed run must equal,
bit for bit)."""

import os
import re

from mpi_util import run_mpi, worker_path

TRAIN = worker_path("stop_train.py")
STEPS = 40
TIMEOUT = 240


def progress(directory):
    """The steps rank 0 has written to DIR/progress so far (0 before the first). Read once: the
    worker rewrites it after every step (open "w" empties it, the number lands at close), so a
    second read may find it empty where the first found a number."""
    try:
        with open(os.path.join(directory, "progress")) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def digests(out):
    """{rank: (model and optimizer digest, generator digest)} at step STEPS, from the output."""
    found = re.findall(r"rank (\d+): digest (\w+) rng (\w+) at step (\d+)", out)
    return {int(r): (d, g) for r, d, g, s in found if int(s) == STEPS}


def uninterrupted(directory):
    """The digests of STEPS uninterrupted steps at 2 ranks under mpiexec (checkpoints into
    ``directory``); both ranks must hold the same model and optimizer."""
    _, out = run_mpi(TRAIN, 2, str(directory), STEPS, timeout=TIMEOUT)
    found = digests(out)
    assert set(found) == {0, 1} and found[0][0] == found[1][0], out[-3000:]
    return found
