"""Open MPI yields the core while a rank waits, whatever the import order: Init switches it on
at run time when mpi4py started MPI first, and keeps busy-polling when the user asked for it
(OMPI_MCA_mpi_yield_when_idle=0). Read from Open MPI's own flag. A wait that lasts (a rank
late by a second) sleeps instead, in each order and under polling: the waiting thread naps,
giving up its core hundreds of times, where a yielding or polling wait never sleeps (and takes
a full core when the machine is idle). Worker:
wait_worker.py."""

import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, _command, mpi_env, singleton_env, worker_path  # noqa: E402


def launch(order, yield_env=None, backoff=None):
    env = mpi_env()
    env.pop("OMPI_MCA_mpi_yield_when_idle", None)  # as a shell without fluxmpi_py imported
    env.pop("FLUXMPI_WAIT_BACKOFF", None)
    if yield_env is not None:
        env["OMPI_MCA_mpi_yield_when_idle"] = yield_env
    if backoff is not None:
        env["FLUXMPI_WAIT_BACKOFF"] = backoff
    cmd = _command(worker_path("wait_worker.py"), 2, [order], fresh=True)  # the import order
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    print(out[-3000:])
    assert p.returncode == 0, out[-3000:]
    check_long_waits_sleep(out)
    return out


def check_long_waits_sleep(out):
    """Each rank waited about a second for the other (wait_worker.py); past the backoff's
    threshold its waiting thread naps: dozens to hundreds of voluntary context switches, where a
    yielding or polling wait makes none (1 with FLUXMPI_WAIT_BACKOFF=off, 769-799 with the
    default on an idle machine). Counted, not timed: on a busy machine (a second test worker, a
    build) a nap lasts longer and the CPU shares move, but a wait that never sleeps still makes
    no voluntary switch."""
    waits = re.findall(r"rank \d: waited ([\d.]+) s in ([^,]+), .*naps (\d+)", out)
    assert {w[1] for w in waits} == {"an allreduce", "a DistributedOptimizer step"}, out[-3000:]
    for wall, what, naps in waits:
        assert float(wall) > 0.8, f"the wait in {what} ended after {wall} s, before the late rank"
        assert int(naps) >= MIN_NAPS, f"{what}: {naps} naps in a {wall} s wait, not a sleep"


MIN_NAPS = 20  # 1 ms naps (2 ms in the polling test) over the 0.9 s past the threshold


@pytest.mark.parametrize(
    "order,before,wait",
    [
        ("fluxmpi_py_first", "None", "yield (set when MPI started); past 100 ms, sleep"),
        ("mpi4py_first", "False", "yield (set by fluxmpi_py.Init); past 100 ms, sleep"),
    ],
)
def test_open_mpi_yields_whatever_the_import_order(order, before, wait):
    out = launch(order)
    for r in range(2):
        assert f"rank {r}: before={before} after=True wait={wait}" in out, out[-3000:]


def test_polling_stays_when_the_user_asks_for_it():
    # and the backoff still ends a long wait's polling, here after 50 ms with naps up to 2 ms
    out = launch("mpi4py_first", yield_env="0", backoff="50:2")
    for r in range(2):
        line = (
            f"rank {r}: before=False after=False wait=poll (OMPI_MCA_mpi_yield_when_idle=0); "
            "past 50 ms, sleep (naps up to 2 ms)"
        )
        assert line in out, out[-3000:]


def test_backoff_setting_is_checked_and_off_turns_it_off():
    # A world of one: Init names the malformed value; fixed, a second Init goes on from there.
    code = (
        "import os, fluxmpi_py as fm\n"
        "try:\n    fm.Init()\nexcept ValueError as e:\n    print('ValueError:', e)\n"
        "os.environ['FLUXMPI_WAIT_BACKOFF'] = 'off'\n"
        "fm.Init()\nprint('wait=' + fm.build_info()['mpi_wait'])\n"
    )
    env = singleton_env({"FLUXMPI_WAIT_BACKOFF": "100:soon"})
    env.pop("OMPI_MCA_mpi_yield_when_idle", None)  # import fluxmpi_py sets it: yield
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert (
        "ValueError: fluxmpi_py: FLUXMPI_WAIT_BACKOFF must be 'off', a wait in ms after which to "
        "sleep (100), or that and the longest nap in ms > 0 (100:1), got '100:soon'"
    ) in out, out[-3000:]
    assert "wait=yield (set when MPI started); no sleep (FLUXMPI_WAIT_BACKOFF=off)" in out, out
