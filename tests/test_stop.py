"""An agreed stop without Slurm: SIGUSR1 that reaches one rank under mpiexec, or SIGUSR1 to
``python -m fluxmpi_py.run``, stops every rank after the same step; they checkpoint and exit
with fm.REQUEUE_STATUS, the launcher does not relaunch them, and the run started again resumes
bit-identical to one never stopped (tests/workers/stop_train.py: the natural loop, a DataLoader
without generator= and dropout). The stop rides on the optimizer's agreement: no collective is
added to a step."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import forks  # noqa: E402
import stop_runs  # noqa: E402
from mpi_util import (  # noqa: E402
    ROOT,
    find_mpiexec,
    kill_session,
    mpi_env,
    run_mpi,
    worker_params,
)
from stop_runs import STEPS, TIMEOUT, TRAIN, digests, progress  # noqa: E402


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """stop_train.py's digests after STEPS uninterrupted steps under mpiexec."""
    return stop_runs.uninterrupted(tmp_path_factory.mktemp("full"))


# Stopped mid-epoch (16 steps an epoch), and after an epoch's last step: the resumed loop
# iterates that epoch's empty rest, whose DataLoader draws a base seed a run never stopped does
# not (tests/test_data.py::test_resume_draws_as_uninterrupted); where a signal from outside
# lands is the machine's load's choice, and a stop after step 16 once failed test_slurm's.
@pytest.mark.parametrize("signal_at", [9, 15], ids=["mid-epoch", "epoch-end"])
def test_signal_to_one_rank_stops_every_rank_and_resumes_exactly(
    tmp_path, uninterrupted, signal_at
):
    rc, out = run_mpi(
        TRAIN, 2, tmp_path, STEPS, "--signal-at", signal_at, timeout=TIMEOUT, expect_ok=False
    )
    assert rc == 75, out[-3000:]  # fm.REQUEUE_STATUS
    # the last rank alone got SIGUSR1 after step signal_at; the next step's agreement told rank 0
    step = signal_at + 1
    assert sorted(re.findall(r"rank (\d): stopped after step (\d+)", out)) == [
        ("0", str(step)),
        ("1", str(step)),
    ], out[-3000:]
    assert sorted(os.listdir(tmp_path)) == [f"ckpt-{step:04d}.pt", "progress"]
    _, out = run_mpi(TRAIN, 2, tmp_path, STEPS, timeout=TIMEOUT)
    assert out.count(f"resumed from ckpt-{step:04d}.pt at step {step}") == 2, out[-3000:]
    assert digests(out) == uninterrupted, out[-3000:]


def test_usr1_to_the_launcher_stops_and_is_not_relaunched(tmp_path, uninterrupted):
    cmd = [sys.executable, "-m", "fluxmpi_py.run", "--mpiexec", find_mpiexec()]
    cmd += ["-n", "2", "--oversubscribe", "--max-restarts", "2", *forks.python(), TRAIN]
    cmd += [str(tmp_path), str(STEPS), "--delay", "0.1", "--hold"]
    env = mpi_env()
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while progress(tmp_path) < 5:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGUSR1)
        out, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            kill_session(proc.pid)
            proc.wait()
    assert proc.returncode == 75, out[-3000:]
    stopped = re.findall(r"rank (\d): stopped after step (\d+)", out)
    assert len(stopped) == 2 and stopped[0][1] == stopped[1][1], out[-3000:]
    assert "the ranks stopped to be requeued (exit status 75); not relaunched" in out, out
    _, out = run_mpi(TRAIN, 2, tmp_path, STEPS, timeout=TIMEOUT)
    assert out.count(f"resumed from ckpt-{int(stopped[0][1]):04d}.pt") == 2, out[-3000:]
    assert digests(out) == uninterrupted, out[-3000:]


@pytest.mark.parametrize("case", worker_params("stop_worker.py", [None, 2, 3], bundle=False))
def test_stop_agreement(case):
    case.check_passed()


SIGNALS = """
import os, signal, sys, time
import fluxmpi_py as fm
fm.Init()
mode = sys.argv[1]
if mode == "unarmed":
    os.kill(os.getpid(), signal.SIGTERM)  # nobody asked: the old action, the process ends
    time.sleep(5)
fm.stop_requested()  # arms the handlers
os.kill(os.getpid(), signal.SIGTERM)  # preemption: a stop, the process goes on
assert fm.stop_requested()
print("stopped, still running", flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # a second SIGTERM: the old action again
time.sleep(5)
print("not reached", flush=True)
"""


@pytest.mark.parametrize("mode", ["unarmed", "armed"])
def test_sigterm_is_a_stop_only_once_asked(mode, forked):
    out = forked.run(SIGNALS, [mode], timeout=120)
    assert out.returncode == -signal.SIGTERM, (out.returncode, out.stdout, out.stderr)
    assert ("stopped, still running" in out.stdout) == (mode == "armed"), out.stdout
    assert "not reached" not in out.stdout


def test_dataloader_workers_without_a_generator_warn_on_resume(tmp_path):
    """With DataLoader workers the extra base-seed draw of a resumed run cannot be undone in
    the main process: the workers see it and warn, naming generator=; with a generator of its
    own the loader resumes exactly and nothing warns."""
    steps, found = 12, {}
    for name in ("own", "global"):
        flags = ["--workers", 2] + (["--generator"] if name == "own" else [])
        d = tmp_path / name
        d.mkdir()
        rc, out = run_mpi(TRAIN, 2, d, steps, "--signal-at", 3, *flags, expect_ok=False)
        assert rc == 75, out[-3000:]
        _, found[name] = run_mpi(TRAIN, 2, d, steps, *flags, timeout=TIMEOUT)
    warning = "Give the DataLoader a generator of its own"
    assert found["global"].count(warning) == 2, found["global"][-3000:]  # once per rank
    assert warning not in found["own"], found["own"][-3000:]
    full = tmp_path / "full"
    full.mkdir()
    _, out = run_mpi(TRAIN, 2, full, steps, "--workers", 2, "--generator", timeout=TIMEOUT)
    ends = [re.findall(r"rank (\d+): digest (\w+) rng (\w+)", o) for o in (out, found["own"])]
    assert sorted(ends[0]) == sorted(ends[1]), (out[-2000:], found["own"][-2000:])


WORKERS_SIGNALLED = """
import os, signal, torch, fluxmpi_py as fm
fm.Init()
data = fm.DistributedDataContainer(torch.utils.data.TensorDataset(torch.randn(64, 2)))
loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
for epoch in range(2):
    it = iter(loader)
    for i, (x,) in enumerate(it):
        if i == 2:  # Slurm signals every process of the step: the workers too
            for w in it._workers:
                os.kill(w.pid, signal.SIGUSR1)
            if epoch == 1:
                os.kill(os.getpid(), signal.SIGUSR1)
    fm.stop_requested()  # arms the handlers after epoch 0
print("done", fm.stop_requested(), flush=True)
"""


def test_usr1_to_dataloader_workers_does_not_end_them(forked):
    out = forked.run(WORKERS_SIGNALLED, timeout=120)
    assert out.returncode == 0 and "done True" in out.stdout, (out.stdout, out.stderr[-2000:])
