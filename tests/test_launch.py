"""fluxmpi_py.launch: run a function on N ranks from one process (a notebook, a script).

These tests call launch() from the pytest process itself (which never calls Init), each
launch bounded by a timeout.
"""

import linecache
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fluxmpi_py as fm  # noqa: E402

# fluxmpi_py.runtime.launch: fm.launch is also the name of the function the package re-exports.
launch_mod = sys.modules["fluxmpi_py.runtime.launch"]

os.environ.setdefault("OMP_NUM_THREADS", "1")


def world_info(scale, offset=0.0):
    import torch

    import fluxmpi_py as fm

    print(f"hello from rank {fm.local_rank()}", flush=True)
    total = fm.allreduce_(torch.ones(1) * scale * (fm.local_rank() + 1), op="sum").item()
    return {"rank": fm.local_rank(), "size": fm.total_workers(), "total": total + offset}


def fail_on(bad_rank):
    import torch

    import fluxmpi_py as fm

    if fm.local_rank() == bad_rank:
        raise ValueError(f"bad value on rank {bad_rank}")
    fm.allreduce_(torch.ones(1))  # the healthy ranks wait here; the failure must end them
    return "unreachable"


def hang(pid_dir):
    import fluxmpi_py as fm

    with open(os.path.join(pid_dir, f"pid.{fm.local_rank()}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def from_source(x):
    import fluxmpi_py as fm

    return x * 10 + fm.total_workers()


def _marked(mark):
    """The live processes (not zombies) whose environment holds `mark`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark.encode() in f.read().split(b"\0") and not _gone(int(pid)):
                    found.append(int(pid))
        except OSError:  # ended meanwhile, or not ours to read
            continue
    return found


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_returns_rank0_result_and_streams_output(capsys):
    out = fm.launch(world_info, 2.0, np=2, timeout=120, offset=0.5)
    # sum over ranks of 2 * (rank + 1) = 2 * (1 + 2) = 6
    assert out == {"rank": 0, "size": 2, "total": 6.5}
    printed = capsys.readouterr().out
    assert "hello from rank 0" in printed and "hello from rank 1" in printed


def test_world_of_one():
    assert fm.launch(world_info, 1.0, np=1, timeout=120) == {"rank": 0, "size": 1, "total": 1.0}


def test_exception_on_one_rank_is_raised_with_its_traceback():
    with pytest.raises(fm.LaunchError) as info:
        fm.launch(fail_on, 1, np=2, timeout=120)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "bad value on rank 1" in str(err)
    assert "in fail_on" in err.remote_traceback and "raise ValueError" in err.remote_traceback


def test_timeout_kills_every_rank(tmp_path, monkeypatch):
    # Every process of the job (mpiexec, its daemons, the ranks) inherits the mark, so none may
    # outlive the timeout, whether it reached hang() (it wrote pid.<rank>) or was still
    # importing on a busy machine when the 10 s ran out.
    mark = f"FLUXMPI_TEST_LAUNCH={os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv(*mark.split("=", 1))
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 10"):
        fm.launch(hang, str(tmp_path), np=2, timeout=10)
    assert time.monotonic() - t0 < 60
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    started = sorted(p.name for p in tmp_path.glob("pid.*"))
    assert not _marked(mark), f"{_marked(mark)} outlived launch() (ranks that started: {started})"


def test_function_from_main_travels_by_value():
    if launch_mod._cloudpickle is None:
        pytest.skip("cloudpickle is not installed")
    # What a notebook cell defines: a function of __main__ that uses a global of __main__.
    namespace = {"__name__": "__main__", "FACTOR": 7}
    exec(
        "def cell_fn(x):\n    import fluxmpi_py as fm\n    return FACTOR * x + fm.local_rank()\n",
        namespace,
    )
    assert namespace["cell_fn"].__module__ == "__main__"
    assert fm.launch(namespace["cell_fn"], 3, np=2, timeout=120) == 21


# A notebook cell, as IPython compiles it: a file name of its own, not on disk, whose lines
# only linecache holds (the rank cannot read them).
CELL = """
def train(scale):
    import fluxmpi_py as fm
    print(f"step on rank {fm.local_rank()}", flush=True)
    if fm.local_rank() == 1:
        raise ValueError(f"bad scale {scale} on rank 1")
    fm.barrier()  # rank 0 waits here for rank 1, which never comes
    return scale
"""
# What Open MPI prints when a rank aborts or a job ends with a failed rank (it differs from run
# to run): none of it may follow the failure.
MPI_NOISE = ("MPI_ABORT", "ORTE_ERROR_LOG", "Out of resource", "Data unpack", "Primary job",
             "prterun", "mpiexec", "-------")  # fmt: skip


def test_a_failure_in_a_cell_is_shown_once_with_the_cells_line(capfd):
    if launch_mod._cloudpickle is None:
        pytest.skip("cloudpickle is not installed")
    filename = f"/tmp/ipykernel_{os.getpid()}/cell_7.py"
    linecache.cache[filename] = (len(CELL), None, CELL.splitlines(True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(CELL, filename, "exec"), namespace)
    try:
        with pytest.raises(fm.LaunchError) as info:
            fm.launch(namespace["train"], 3, np=2, timeout=120)
    finally:
        linecache.cache.pop(filename, None)
    err = str(info.value)
    line = CELL.split("\n").index('        raise ValueError(f"bad scale {scale} on rank 1")') + 1
    assert err.startswith("launch: rank 1 of 2 raised ValueError: bad scale 3 on rank 1"), err
    # the cell's file and line, with its source, where the rank saw "<dynamic-code>"
    assert f'File "{filename}", line {line}, in train\n    raise ValueError(' in err, err
    assert "<dynamic-code>" not in err and "_child_main" not in err, err
    assert err.count("Traceback") == 1, err
    streamed = "".join(capfd.readouterr())
    assert "step on rank 0" in streamed and "step on rank 1" in streamed, streamed
    # shown once: the ranks printed no traceback, and nothing of Open MPI's followed
    assert "Traceback" not in streamed and "ValueError" not in streamed, streamed
    assert not [n for n in MPI_NOISE if n in streamed], streamed


def test_source_fallback_without_cloudpickle(monkeypatch):
    monkeypatch.setattr(launch_mod, "_cloudpickle", None)
    monkeypatch.setattr(from_source, "__module__", "__main__")
    assert launch_mod._encode_callable(from_source)["kind"] == "source"
    assert fm.launch(from_source, 4, np=2, timeout=120) == 42
    with pytest.raises(TypeError, match="named function"):
        launch_mod._encode_callable(
            type("L", (), {"__call__": lambda s: 0, "__module__": "__main__"})()
        )


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        (dict(np=0), ValueError),
        (dict(np=1.5), ValueError),
        (dict(np=2, timeout=-1), ValueError),
    ],
)
def test_bad_arguments(kwargs, exc):
    with pytest.raises(exc):
        fm.launch(world_info, 1.0, **kwargs)
    with pytest.raises(TypeError, match="callable"):
        fm.launch(42, np=2)


def test_launcher_variables_are_not_inherited(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("PMIX_RANK", "3")
    monkeypatch.setenv("OMPI_MCA_btl", "self,vader,tcp")
    env = launch_mod._child_env(2, None)
    assert "OMPI_COMM_WORLD_RANK" not in env and "PMIX_RANK" not in env
    assert env["OMPI_MCA_btl"] == "self,vader,tcp"  # the user's own MCA settings stay
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
