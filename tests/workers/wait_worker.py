"""How Open MPI waits after Init, by import order. Usage: wait_worker.py ORDER.

    fluxmpi_py_first   import fluxmpi_py, then start MPI in Init
    mpi4py_first       from mpi4py import MPI (starts MPI) before importing fluxmpi_py
Prints, per rank, Open MPI's own yield flag before and after Init and build_info's mpi_wait.
"""

import ctypes
import os
import sys

if sys.argv[1] == "mpi4py_first":
    from mpi4py import MPI  # noqa: F401


def yields():
    """Open MPI's flag, read from its library: does the progress loop yield when idle?"""
    return ctypes.c_bool.in_dll(ctypes.CDLL(None), "opal_progress_yield_when_idle").value


before = yields() if sys.argv[1] == "mpi4py_first" else None
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

fm.Init()
fm.barrier()
print(
    f"rank {fm.local_rank()}: before={before} after={yields()} wait={fm.build_info()['mpi_wait']}"
)
