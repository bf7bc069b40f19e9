"""Init, rank helpers, build_info, printing and preferences. Single-process tests run in
fresh subprocesses (a world of one, no mpiexec); Init with mpi4py and on sub-communicators
runs under mpiexec (tests/workers/init_worker.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import forks  # noqa: E402
from mpi_util import run_mpi, worker_params  # noqa: E402


def run_py(code, *args, env=None, timeout=180):
    """Run Python code in a process of its own without mpiexec (forked from the suite's fork
    server, tests/forks.py, unless `env` sets what the imports read); return (rc, output)."""
    p = forks.run(code, args, env_extra=env, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("case", worker_params("runtime_worker.py", [None]))
def test_runtime_world_of_one(case):
    out = case.check_passed()
    if case.name == "case_print":  # what that case printed to the process's stdout
        assert "[0 / 1] hello-stdout\nafter" in out, out[-2000:]


def test_print_goes_through_a_stream_that_is_not_the_process_own():
    # As ipykernel's OutStream in Jupyter: fileno() is the process's terminal, but only what
    # goes through write() reaches the notebook. Each call must arrive whole, in one write,
    # also from several threads at once.
    code = r"""
import io, sys, threading, fluxmpi_py as fm

class NotebookStream(io.TextIOBase):
    def __init__(self):
        self.writes = []
    def fileno(self):
        return sys.__stdout__.fileno()
    def write(self, s):
        self.writes.append(s)
        return len(s)

fm.Init()
nb = NotebookStream()
sys.stdout = nb
fm.fluxmpi_println("to-the-notebook")
fm.fluxmpi_print("a", "b", file=nb, end="!\n")
threads = [threading.Thread(target=lambda k=k: [fm.fluxmpi_println(f"thread{k}-" + "x" * 200)
                                                for _ in range(50)]) for k in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
sys.stdout = sys.__stdout__
assert nb.writes[:2] == ["[0 / 1] to-the-notebook\n", "[0 / 1] a b!\n"], nb.writes[:2]
lines = nb.writes[2:]
assert len(lines) == 200 and all(
    l.startswith("[0 / 1] thread") and l.endswith("-" + "x" * 200 + "\n") for l in lines), lines[:3]
print("NOTEBOOK-STREAM OK")
"""
    rc, out = run_py(code)
    assert rc == 0 and "NOTEBOOK-STREAM OK" in out, out[-4000:]
    assert "to-the-notebook" not in out, out[-2000:]  # nothing went to the real stdout


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
        "print('SET', p)",
        env=env,
    )
    assert rc == 0 and f"SET {tmp_path}" in out, out
    rc, out = run_py(
        "import fluxmpi_py as fm; from fluxmpi_py._core import C\n"
        "assert not fm.cudampi_enabled() and C.cuda_mpi_allowed()  # Init passes it on\n"
        "fm.Init(); assert not C.cuda_mpi_allowed()\n"
        "assert fm.build_info()['cuda_mpi_enabled'] is False\n"
        "fm.disable_cudampi_support(False); print('OFF')",
        env=env,
    )
    assert rc == 0 and "OFF" in out, out
    rc, out = run_py("import fluxmpi_py as fm; assert fm.cudampi_enabled(); print('ON')", env=env)
    assert rc == 0 and "ON" in out, out


@pytest.mark.parametrize(
    "mode,np", [("mpi4py_first", 2), ("fm_first", 2), ("split", 4), ("subset", 3), ("funneled", 2)]
)
def test_init_with_mpi4py(mode, np):
    rc, out = run_mpi("init_worker.py", np, mode, timeout=180)
    assert rc == 0 and all(f"rank {r} ok" in out for r in range(np)), out[-4000:]
