"""The suite's warm ranks (tests/fork_server.py, tests/forks.py): a rank forked from the server sees what a rank
in a fresh interpreter sees, its job ends as that job would, and nothing outlives the job.
Each check runs the probe both ways in one test and compares (tests/workers/warm_probe.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import forks  # noqa: E402
from mpi_util import ROOT, _command, mpi_env, worker_path  # noqa: E402

PROBE = worker_path("warm_probe.py")

pytestmark = pytest.mark.skipif(not forks.enabled(), reason="FLUXMPI_TEST_WARM=0")


def probe(tmp_path, mode, np=2, fresh=False, env=None, timeout=120):
    out = tmp_path / ("fresh" if fresh else "warm")
    out.mkdir()
    cmd = _command(PROBE, np, [mode, "x y"], fresh=fresh)
    p = subprocess.run(
        cmd,
        env=mpi_env(dict(env or {}, WARM_PROBE_VAR="seen", WARM_PROBE_DIR=str(out))),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    return p, read(out, np)


def read(out, np):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(np)]


def same_but_pid(warm, fresh):
    strip = [{k: v for k, v in r.items() if k not in ("pid", "warm")} for r in warm]
    return strip == [{k: v for k, v in r.items() if k not in ("pid", "warm")} for r in fresh]


def test_a_warm_rank_sees_what_a_fresh_one_sees(tmp_path):
    pw, warm = probe(tmp_path, "print")
    pf, fresh = probe(tmp_path, "print", fresh=True)
    assert pw.returncode == pf.returncode == 0, pw.stderr + pf.stderr
    assert [r["warm"] for r in warm] == [True, True], warm  # else the suite pays full start-up
    assert [r["warm"] for r in fresh] == [False, False], fresh
    assert same_but_pid(warm, fresh), (warm, fresh)
    assert warm[0]["argv"] == [PROBE, "print", "x y"] and warm[0]["main"] == "__main__"


# (an uncaught exception's ending: test_failures, whose ranks are warm)
@pytest.mark.parametrize("mode", ["exit:3", f"signal:{int(signal.SIGKILL)}"])
def test_a_warm_job_ends_as_a_fresh_one(tmp_path, mode):
    pw, warm = probe(tmp_path, mode)
    pf, fresh = probe(tmp_path, mode, fresh=True)
    assert pw.returncode == pf.returncode != 0, (pw.returncode, pf.returncode)
    assert [r["warm"] for r in warm] == [True, True], warm
    if mode.startswith("signal"):
        assert "signal 9" in pw.stderr + pw.stdout, pw.stderr


def test_a_variable_read_at_start_gets_a_fresh_interpreter(tmp_path):
    p, seen = probe(tmp_path, "print", env={"FLUXMPI_DEBUG": "detail"})
    assert p.returncode == 0, p.stderr
    assert [r["warm"] for r in seen] == [False, False], seen


def test_killing_the_launch_kills_the_warm_ranks(tmp_path):
    cmd = _command(PROBE, 2, ["sleep"])
    env = mpi_env({"WARM_PROBE_DIR": str(tmp_path)})
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("rank?.json"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the probe did not start"
        time.sleep(0.05)
    seen = read(tmp_path, 2)
    assert all(r["warm"] for r in seen), seen
    pids = [r["pid"] for r in seen]
    os.killpg(proc.pid, signal.SIGKILL)  # what a test's timeout does
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), f"warm ranks {pids} outlived their job"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
