"""Runtime helpers in a world of one, started without mpiexec (run by tests/test_runtime.py)."""

import io
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_world_of_one():
    assert fm.Initialized()
    assert (fm.local_rank(), fm.total_workers(), fm.node_local_rank()) == (0, 1)[:2] + (0,)
    fm.Init()
    fm.Init(verbose=True, gpu_devices=[0])  # idempotent: arguments of later calls do nothing
    assert fm.total_workers() == 1
    fm.barrier()
    t = torch.arange(5.0)
    assert fm.allreduce_(t, op="average").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def case_build_info():
    info = fm.build_info()
    assert set(info) == {
        "torch",
        "compiled_torch",
        "mpi_library",
        "mpi_standard",
        "cuda",
        "compiled_with_cuda",
        "nccl",
        "cuda_mpi_enabled",
        "cuda_aware_mpi",
        "cuda_collectives",
        "cuda_schedule",
        "thread_multiple",
        "mpi_wait",
    }
    assert info["torch"] == torch.__version__
    assert torch.__version__.startswith(info["compiled_torch"])
    assert "MPI" in info["mpi_library"], info["mpi_library"]
    assert re.fullmatch(r"\d+\.\d+", info["mpi_standard"]), info["mpi_standard"]
    assert isinstance(info["compiled_with_cuda"], bool)
    assert info["cuda"] == torch.version.cuda
    assert info["compiled_with_cuda"] or info["nccl"] is None
    # where CUDA collectives run: NCCL unless ranks share a GPU (or FLUXMPI_CUDA_OVER_MPI=1)
    want = ("nccl", "mpi") if info["compiled_with_cuda"] else (None,)
    assert info["cuda_collectives"] in want, info["cuda_collectives"]
    # a GPU's wait schedule once Init chose one (FLUXMPI_CUDA_SCHEDULE; "auto" by default)
    on_gpu = info["compiled_with_cuda"] and torch.cuda.is_available()
    assert info["cuda_schedule"] in (("auto", "spin", "yield", "blocking") if on_gpu else (None,))
    assert isinstance(info["thread_multiple"], bool)
    assert info["mpi_wait"].startswith("yield ("), info["mpi_wait"]  # Open MPI, imported first


def case_print():
    f = io.StringIO()
    fm.fluxmpi_print("x", 1, 2.5, sep=",", file=f)
    fm.fluxmpi_println("y", file=f, ordered=True)
    assert f.getvalue() == "[0 / 1] x,1,2.5[0 / 1] y\n", repr(f.getvalue())
    fm.fluxmpi_println("hello-stdout")  # written to fd 1 in one write
    print("after", flush=True)


def case_init_argument_errors():
    for bad in (42, "world"):
        try:
            fm.Init(comm=bad)
        except TypeError as e:
            assert "mpi4py communicator" in str(e), str(e)
        else:
            raise AssertionError(f"Init(comm={bad!r}) did not raise")


if __name__ == "__main__":
    run_cases(globals())
