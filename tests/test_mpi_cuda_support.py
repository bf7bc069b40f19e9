"""The run-time question to MPI, whether it takes CUDA device pointers (csrc/backend/
mpi_cuda_support.*), as build_info reports it."""

from __future__ import annotations

import fluxmpi_py as fm


def test_cuda_aware_mpi_is_asked_at_run_time():
    fm.Init()
    info = fm.build_info()
    assert info["cuda_aware_mpi"] in ("yes", "no", "unknown")
    if info["mpi_library"].startswith("Open MPI"):
        # Open MPI (from 2.0) answers MPIX_Query_cuda_support once initialized.
        assert info["cuda_aware_mpi"] in ("yes", "no")
