"""Init, rank helpers, build_info, printing and preferences. Single-process tests run in
fresh subprocesses (a world of one, no mpiexec); Init with mpi4py and on sub-communicators
runs under mpiexec (tests/workers/init_worker.py)."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, mpi_env, run_mpi, worker_params  # noqa: E402


def run_py(code_or_path, *args, env=None, timeout=180):
    """Run Python in a fresh process without mpiexec; return (rc, stdout + stderr)."""
    e = mpi_env(env)
    for k in [k for k in e if k.startswith(("OMPI_COMM_WORLD", "PMIX_"))]:
        del e[k]
    cmd = [sys.executable, code_or_path, *args] if code_or_path.endswith(".py") else \
        [sys.executable, "-c", code_or_path, *args]
    p = subprocess.run(cmd, env=e, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("case", worker_params("runtime_worker.py", [None]))
def test_runtime_world_of_one(case):
    out = case.run()
    if case.name == "case_print":  # what that case printed to the process's stdout
        assert "[0 / 1] hello-stdout\nafter" in out, out[-2000:]


def test_calls_before_init_say_to_call_init():
    code = r"""
import torch, fluxmpi_py as fm
assert not fm.Initialized()
calls = {
    "local_rank": fm.local_rank, "total_workers": fm.total_workers,
    "node_local_rank": fm.node_local_rank, "barrier": fm.barrier,
    "allreduce_": lambda: fm.allreduce_(torch.ones(2)),
    "bcast_": lambda: fm.bcast_(torch.ones(2)),
    "reduce_": lambda: fm.reduce_(torch.ones(2)),
    "Iallreduce": lambda: fm.Iallreduce(torch.ones(2)),
    "Ibcast": lambda: fm.Ibcast(torch.ones(2)),
    "fluxmpi_print": lambda: fm.fluxmpi_print("x"),
    "fluxmpi_println": lambda: fm.fluxmpi_println("x", ordered=True),
}
for name, fn in calls.items():
    try:
        fn()
    except RuntimeError as e:
        assert "call fluxmpi_py.Init() first" in str(e), (name, str(e))
    else:
        raise AssertionError(name + " did not raise before Init")
assert "mpi_library" in fm.build_info()  # no MPI call that needs Init
print("BEFORE-INIT OK", flush=True)
fm.Init(verbose=True)
"""
    rc, out = run_py(code)
    assert rc == 0 and "BEFORE-INIT OK" in out, out[-4000:]
    assert "[0 / 1] using cpu (node-local rank 0 of 1)" in out, out[-2000:]


def test_disable_cudampi_support_is_persisted(tmp_path):
    env = {"FLUXMPI_PY_CONFIG_DIR": str(tmp_path)}
    rc, out = run_py(
        "import fluxmpi_py as fm, json; p = fm.disable_cudampi_support(); "
        "assert json.load(open(p)) == {'disable_cudampi': True}; "
        "assert fm.cudampi_enabled()  # takes effect at the next start\n"
        "print('SET', p)", env=env)
    assert rc == 0 and f"SET {tmp_path}" in out, out
    rc, out = run_py(
        "import fluxmpi_py as fm; assert not fm.cudampi_enabled(); "
        "assert fm.build_info()['cuda_mpi_enabled'] is False; "
        "fm.disable_cudampi_support(False); print('OFF')", env=env)
    assert rc == 0 and "OFF" in out, out
    rc, out = run_py("import fluxmpi_py as fm; assert fm.cudampi_enabled(); print('ON')", env=env)
    assert rc == 0 and "ON" in out, out


@pytest.mark.parametrize("mode,np", [("mpi4py_first", 2), ("fm_first", 2), ("split", 4),
                                     ("subset", 3), ("funneled", 2)])
def test_init_with_mpi4py(mode, np):
    rc, out = run_mpi("init_worker.py", np, mode, timeout=180)
    assert rc == 0 and all(f"rank {r} ok" in out for r in range(np)), out[-4000:]
