"""The shrink mode: with ULFM (Open MPI 5 from PyPI, `make`'s MPI, launched with
`--with-ft ulfm`), a rank killed by SIGKILL costs the survivors one call, not the job: they
see RanksLostError, recover() shrinks the world to them, and they go on with the right sums,
once and after a second loss. Without ULFM the mode raises on every rank, saying how to get
one; by default a lost rank ends the job (tests/test_stalls.py). A rank that hangs (SIGSTOP)
is declared failed by Open MPI's detector and ended by its neighbours. Workers:
tests/workers/elastic_worker.py, hung_rank_worker.py. Their ranks are forked from the suite's
fork server (tests/fork_server.py: torch imported once, not by each of the 13 launches' 4 ranks,
which cost this file 100 of its 180 CPU seconds): mpiexec sees a killed rank's client end by the
same signal, and a stopped rank is the forked process that the survivors end."""

import os
import re
import signal
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import _command, mpi_env, worker_path  # noqa: E402

from fluxmpi_py import _core  # noqa: E402
from fluxmpi_py.run import ELASTIC_MPIEXEC_ARGS  # noqa: E402

FT = ["--with-ft", "ulfm", "--mca", "coll", "^han,cuda"]
END_WITHIN = 120


def ulfm_here():
    return "with ULFM" if _core.C.mpi_library_version().startswith("Open MPI v5") else ""


def launch(np, args, ft=True, worker="elastic_worker.py"):
    cmd = _command(worker_path(worker), np, args)
    if ft:
        cmd[1:1] = FT
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=END_WITHIN)
    out = p.stdout + p.stderr
    print(out[-4000:])
    return p.returncode, out


needs_ulfm = pytest.mark.skipif(
    not ulfm_here(), reason="the MPI of this build has no ULFM (make builds against Open MPI 5)"
)


@needs_ulfm
def test_a_killed_rank_costs_the_survivors_one_call():
    rc, out = launch(4, ["collectives", "3"])
    assert rc == 0, out[-4000:]
    for r in range(3):
        line = f"rank {r} of 3: sums [4, 4, 4, 3, 3, 3, 3, 3] lost [[3]]"
        assert line in out, out[-4000:]
    # logged on every survivor: the lost rank, the sizes, the time
    logs = re.findall(r"\[rank (\d) / 3\] fluxmpi_py: lost rank\(s\) 3 of 4; the 3 survivors", out)
    assert sorted(logs) == ["0", "1", "2"], out[-4000:]


@needs_ulfm
def test_two_losses_one_after_the_other():
    rc, out = launch(4, ["collectives", "1,2"])
    assert rc == 0, out[-4000:]
    # the second loss is named in the numbering of the world of 3 it left: old rank 2 was 1
    for r in (0, 3):
        line = f"rank {r} of 2: sums [4, 4, 4, 3, 3, 2, 2, 2] lost [[1], [1]]"
        assert line in out, out[-4000:]


@needs_ulfm
def test_the_launcher_runs_it_and_names_the_lost_rank():
    # python -m fluxmpi_py.run --elastic: Open MPI's ULFM switches and FLUXMPI_ON_FAILURE for
    # the ranks (the worker's Init asks for the mode all the same); status 0, the lost rank named.
    # --grace 60: mpiexec's own ending is read here, not the launcher's (see test_resume).
    cmd = _command(worker_path("elastic_worker.py"), 4, ["collectives", "3", "3"])
    cmd = [sys.executable, "-m", "fluxmpi_py.run", "--elastic", "--grace", "60", *cmd[1:]]
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=END_WITHIN)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert out.count("of 3: sums [4, 4, 4, 3, 3, 3, 3, 3] lost [[3]]") == 3, out[-4000:]
    assert re.search(r"fluxmpi_py.run: lost while the job went on: rank 3 \(pid \d+ on", out), out


@needs_ulfm
def test_without_ulfm_in_the_launch_every_rank_raises():
    rc, out = launch(2, ["no_ulfm"], ft=False)
    assert rc == 0, out[-4000:]
    assert out.count("RuntimeError: fluxmpi_py: this job was started without ULFM") == 2, out
    assert "python -m fluxmpi_py.run --elastic" in out, out[-4000:]


@needs_ulfm
def test_a_group_made_before_the_loss_raises_on_every_rank():
    rc, out = launch(4, ["group"])
    assert rc == 0, out[-4000:]
    said = "stale: fluxmpi_py: the group of ranks [0, 1] was made before ranks were lost"
    assert out.count(said) == 3, out[-4000:]
    assert out.count("fluxmpi_py.new_group(ranks) in the new world's numbering") == 3, out
    assert out.count("the new group sums 2") == 2, out[-4000:]


@needs_ulfm
def test_ddp_on_the_fluxmpi_backend_is_refused_in_the_mode():
    rc, out = launch(2, ["ddp"])
    assert rc == 0, out[-4000:]
    assert out.count('does not support Init(on_failure="shrink") yet') == 2, out[-4000:]


def test_a_bad_value_raises_on_every_rank():
    rc, out = launch(2, ["bad_value"], ft=False)
    assert rc == 0, out[-4000:]
    assert out.count("must be 'abort' or 'shrink', got 'sometimes'") == 2, out[-4000:]


def train(tmp_path, name, victims, *more):
    path = tmp_path / f"{name}.pt"
    rc, out = launch(4, [str(path), victims, *more], worker="elastic_train_worker.py")
    assert rc == 0, out[-4000:]
    return torch.load(path), out


def assert_same_bits(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_bits(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_bits(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@needs_ulfm
def test_training_keeps_the_same_bits_across_lost_ranks(tmp_path):
    # deterministic=True, 4 ranks; rank 3 SIGKILLed at step 20 of 40, then (another run)
    # rank 1 at step 20 and rank 3 at step 30: the survivors finish, and every parameter,
    # buffer and optimizer state equals the uninterrupted 4-rank run's, bit for bit.
    whole, _ = train(tmp_path, "whole", "none")
    once, out = train(tmp_path, "once", "3@20")
    assert out.count("finished on a world of 3") == 3, out[-4000:]
    assert_same_bits(whole, once)
    twice, out = train(tmp_path, "twice", "1@20,3@30")
    assert out.count("finished on a world of 2") == 2, out[-4000:]
    assert_same_bits(whole, twice)


UNEVEN = ("global=32", "steps=12")  # 16 micro-batches a step: 6, 5 and 5 on 3 ranks


@needs_ulfm
def test_survivors_that_share_unevenly_keep_the_same_bits(tmp_path):
    # 16 micro-batches a step, 4 on each of 4 ranks; rank 3 SIGKILLed at step 6 of 12: the 3
    # survivors take 6, 5 and 5 (the first one more) and end bit for bit as the run that
    # lost nothing
    whole, _ = train(tmp_path, "whole", "none", *UNEVEN)
    once, out = train(tmp_path, "once", "3@6", *UNEVEN)
    for r, k in enumerate((6, 5, 5)):
        assert f"rank {r} finished on a world of 3, {k} micro-batches a step" in out, out[-4000:]
    assert_same_bits(whole, once)


@needs_ulfm
def test_survivors_that_share_unevenly_without_deterministic_agree_within_tolerance(tmp_path):
    # as above with deterministic=False: each rank divides its losses by its own count, and
    # the optimizer weighs the ranks by their share, so every micro-batch weighs alike
    whole, _ = train(tmp_path, "whole", "none", "default", *UNEVEN)
    once, out = train(tmp_path, "once", "3@6", "default", *UNEVEN)
    assert out.count("finished on a world of 3, ") == 3, out[-4000:]
    assert_close(without_running_statistics(whole), without_running_statistics(once))


def without_running_statistics(run):
    """BatchNorm's running statistics left out: without deterministic=True each rank folds its
    own micro-batches and the ranks average them, which depends on the world size with or
    without a loss (module=model, buffers="average")."""
    model = {k: v for k, v in run["model"].items() if "running" not in k and "num_batches" not in k}
    return {**run, "model": model}


def assert_close(a, b, where=""):
    if isinstance(a, dict):
        for k in a:
            assert_close(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor) and a.is_floating_point():
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where


@needs_ulfm
def test_without_deterministic_the_same_global_batch_within_tolerance(tmp_path):
    # deterministic=False: the survivors share the same global batch, so the run agrees with
    # the uninterrupted one within floating-point tolerance (not bit for bit); 20 steps, rank 3
    # SIGKILLed at step 10
    whole, _ = train(tmp_path, "whole", "none", "default", "steps=20")
    once, out = train(tmp_path, "once", "3@10", "default", "steps=20")
    assert out.count("finished on a world of 3") == 3, out[-4000:]
    assert_close(without_running_statistics(whole), without_running_statistics(once))


@needs_ulfm
def test_a_hung_rank_is_excluded_and_ended():
    # rank 3 of 4 stops itself (SIGSTOP) before call 3: it cannot end itself. Under the
    # launcher's switches (ELASTIC_MPIEXEC_ARGS: Open MPI's failure detector) its silence
    # declares it failed; the survivors recover, go on with the right sums, and end the stopped
    # process (it is on their host), so that mpiexec ends, status 0
    cmd = _command(worker_path("hung_rank_worker.py"), 4, [])
    cmd[1:1] = ELASTIC_MPIEXEC_ARGS
    proc = subprocess.Popen(
        cmd,
        env=mpi_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=END_WITHIN)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job did not end within {END_WITHIN}s:\n{out[-4000:]}")
    finally:
        stopped = re.search(r"pid (\d+) stops at", out or "")
        if stopped and proc.returncode != 0:  # never leave a stopped process behind
            try:
                os.kill(int(stopped.group(1)), signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(out[-4000:])
    assert proc.returncode == 0, out[-4000:]
    for r in range(3):
        assert f"rank {r} of 3: sums [4, 4, 4, 3, 3, 3, 3, 3]" in out, out[-4000:]
    stop = float(re.search(r"stops at ([\d.]+)", out).group(1))
    first = max(float(t) for t in re.findall(r"first call after the loss at ([\d.]+)", out))
    print(f"SIGSTOP to the survivors' first finished call: {first - stop:.2f} s")
