"""A rank that stalls is named in a stall report and, after the timeout, ends the job with
that report; a rank killed by a signal, an interrupted mpiexec and a DataLoader worker that
raises end the job promptly. Worker: tests/workers/stall_worker.py. Each launch runs under a
hard timeout (mpi_util); what is asserted is the outcome and the message."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import _command, mpi_env, run_mpi, worker_path  # noqa: E402

from fluxmpi_py import flight  # noqa: E402

END_WITHIN = 60  # seconds: a job with a dead or stalled rank must be over by then


def launch(mode, np=2, env=None, expect_ok=False):
    t0 = time.monotonic()
    rc, out = run_mpi("stall_worker.py", np, mode, timeout=END_WITHIN, env=env, expect_ok=expect_ok)
    print(f"{mode} on {np} ranks: exit code {rc} after {time.monotonic() - t0:.1f}s")
    print(out[-3000:])
    return rc, out


def test_stall_report_names_the_sleeping_rank_and_its_stack(tmp_path):
    # The staller sleeps 7 s with stall_warning=2: the report must come while it sleeps.
    # Each rank writes its timeline at exit too, its last 16 calls.
    env = {"FLUXMPI_TIMELINE": str(tmp_path / "trace.json"), "FLUXMPI_FLIGHT_SIZE": "16"}
    rc, out = launch("sleep", np=3, env=env, expect_ok=True)
    assert rc == 0, out[-3000:]
    reports = re.findall(r"\[rank (\d) / 3\] fluxmpi_py: stall: ", out)
    # printed by the lowest waiting rank only, again at a doubled wait (2 s, 4 s)
    assert reports and set(reports) == {"0"}, out[-4000:]
    # the bucket in flight and its first parameters, and the user's line that waits for it
    assert "(allreduce, gradient bucket 1 of 1: outer.bias, outer.weight, inner.bias" in out
    assert re.search(r"issued at \S*stall_worker\.py:\d+ in main", out), out[-4000:]
    assert "not entered it: rank 2\n" in out and "waiting in it: ranks 0, 1\n" in out, out[-4000:]
    assert re.search(r"rank 2: in user code for \d+\.\d s, since it completed collective", out)
    assert "in backward\n" in out and "in stalled_in_user_code" in out, out[-4000:]
    assert "time.sleep(seconds)" in out and "rank 2 done" in out, out[-4000:]
    check_timelines(tmp_path, 3, slots=16)


def check_timelines(directory, np, slots):
    """Each rank's Chrome trace: its last `slots` collectives, numbered in a row, each a
    complete event on the rank's process; at most a few hundred bytes per call."""
    for rank in range(np):
        path = directory / f"trace.{rank}.json"
        assert path.exists(), sorted(os.listdir(directory))
        assert path.stat().st_size < slots * 400, path.stat().st_size
        events = json.loads(path.read_text())["traceEvents"]
        calls = [e for e in events if e["ph"] == "X"]
        assert len(calls) == slots, events  # the job made more calls than it keeps
        assert all(e["pid"] == rank and e["dur"] >= 0 for e in calls), calls
        world = [e["args"]["number"] for e in calls if e["tid"] == 0]
        assert world == list(range(world[0], world[0] + len(world))), world
        assert "allreduce" in {e["name"] for e in calls}, calls
        assert any("DistributedOptimizer" in e["args"]["call"] for e in calls), calls


def test_timeout_ends_the_job_with_the_report_on_every_rank(tmp_path, capsys):
    env = {
        "FLUXMPI_STALL_WARNING": "2",
        "FLUXMPI_TIMEOUT": "5",
        "FLUXMPI_FLIGHT_DIR": str(tmp_path / "flight"),
    }
    rc, out = launch("timeout", env=env)
    assert rc != 0, out[-3000:]
    assert "[rank 0 / 2] fluxmpi_py: timeout: collective call #" in out, out[-4000:]
    # the sleeping rank prints it too, as its error, before the job ends
    assert "[rank 1 / 2] fluxmpi_py: timeout (reported by rank 0): collective call #" in out
    assert "not entered it: rank 1" in out and "in stalled_in_user_code" in out, out[-4000:]
    assert "the timeout is 5.0 s" in out and "aborting the job" in out, out[-4000:]
    assert "rank 1 done" not in out
    # Each rank wrote its flight recorder before the job ended: rank 0 inside the call that
    # rank 1 never entered, and the reader names that call and rank 1.
    dumps = [
        json.loads((tmp_path / "flight" / f"fluxmpi_flight.{r}.json").read_text()) for r in (0, 1)
    ]
    assert [d["reason"] for d in dumps] == ["timeout", "timeout"], dumps
    waiting, last_of_1 = dumps[0]["records"][-1], dumps[1]["records"][-1]
    assert waiting["end_us"] is None and waiting["kind"] == "allreduce", waiting
    assert last_of_1["end_us"] is not None and last_of_1["number"] == waiting["number"] - 1
    capsys.readouterr()
    assert flight.main([str(tmp_path / "flight")]) == 0
    text = capsys.readouterr().out
    print(text)
    n = waiting["number"]
    assert f"world: the ranks parted at call #{n}:" in text, text
    assert f"rank 0: inside #{n} allreduce" in text, text
    assert f"rank 1: never entered #{n}; its last call on the group: #{n - 1} " in text, text


def test_report_counts_calls_on_the_stalled_calls_group():
    # Rank 0 calls on a group of both ranks, rank 1 on the world: rank 1 has made as many
    # calls as rank 0, but none on the group. The report counts calls per group, so it says
    # that rank 1 has not entered the group's call, and shows rank 1's world call and line.
    env = {"FLUXMPI_STALL_WARNING": "2", "FLUXMPI_TIMEOUT": "5"}
    rc, out = launch("other_group", env=env)
    assert rc != 0, out[-3000:]
    mine = out[out.index("[rank 0 / 2] fluxmpi_py: stall:") :]
    mine = mine[: mine.index("next report at")]
    assert "collective call #1 (allreduce on group [0, 1], of allreduce_())" in mine, out[-4000:]
    assert "not entered it: rank 1\n" in mine and "done with it" not in mine, out[-4000:]
    assert re.search(r"rank 1: inside collective call #\d+ \(allreduce, of allreduce_", mine), mine
    assert "fm.allreduce_(torch.ones(3))" in mine, out[-4000:]


def test_report_on_a_group_call_names_its_members_only():
    # 3 ranks: rank 0 waits on group [0, 1]; rank 1 sleeps in user code after its last world
    # call; rank 2, not a member, is in a world call. Rank 0's report names rank 1 as not
    # having entered the call and leaves rank 2 out; rank 2's own report (a world call)
    # names ranks 0 and 1.
    env = {"FLUXMPI_STALL_WARNING": "2", "FLUXMPI_TIMEOUT": "5"}
    rc, out = launch("outside_group", np=3, env=env)
    assert rc != 0, out[-3000:]
    mine = out[out.index("[rank 0 / 3] fluxmpi_py: stall:") :]
    mine = mine[: mine.index("next report at")]
    assert "(allreduce on group [0, 1], of allreduce_())" in mine, out[-4000:]
    assert "not entered it: rank 1\n" in mine and "waiting in it: rank 0\n" in mine, mine
    assert "rank 2" not in mine and "done with it" not in mine, mine
    assert "rank 1: in user code" in mine and "time.sleep(30)" in mine, mine
    theirs = out[out.index("[rank 2 / 3] fluxmpi_py: stall:") :]
    theirs = theirs[: theirs.index("next report at")]
    assert "not entered it: ranks 0, 1\n" in theirs and "waiting in it: rank 2\n" in theirs


@pytest.mark.parametrize("mode,signame", [("sigkill", "Killed"), ("sigterm", "Terminated")])
def test_rank_killed_by_a_signal_ends_the_job(mode, signame, tmp_path):
    rc, out = launch(mode, env={"FLUXMPI_FLIGHT_DIR": str(tmp_path)})
    assert rc != 0, out[-3000:]
    assert re.search(
        # one line from Open MPI 4.1's mpiexec, wrapped after "exited on" by 5.0's (PRRTE)
        rf"process rank 1 with PID \d+ on node \S+ exited on\s+signal \d+ \({signame}\)",
        out,
    ), out[-3000:]
    # SIGTERM, not SIGKILL, leaves the rank a moment to write its flight recorder
    dump = tmp_path / "fluxmpi_flight.1.json"
    assert dump.exists() == (mode == "sigterm"), os.listdir(tmp_path)
    if mode == "sigterm":
        assert json.loads(dump.read_text())["reason"] == "SIGTERM"


def test_sigint_to_mpiexec_ends_the_job():
    # The ranks train until interrupted; SIGINT to mpiexec, once a rank has trained a step,
    # must end the job, with no rank finishing its loop ("done").
    proc = subprocess.Popen(
        _command(worker_path("stall_worker.py"), 2, ["train"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=mpi_env(),
        start_new_session=True,
    )
    lines: queue.Queue = queue.Queue()

    def read():  # every line, then None at the end of the output
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 3 * END_WITHIN  # start-up under load
        while not any("training" in x for x in seen):
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert line is not None, "the job ended before training:\n" + "".join(seen)[-3000:]
            seen.append(line)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=END_WITHIN)
        print(
            f"mpiexec ended {time.monotonic() - t0:.1f}s after SIGINT, exit code {proc.returncode}"
        )
    except queue.Empty:
        pytest.fail("no rank trained within the start-up time:\n" + "".join(seen)[-3000:])
    except subprocess.TimeoutExpired:
        pytest.fail(f"the job did not end within {END_WITHIN}s of SIGINT:\n{''.join(seen)[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
    while not lines.empty():
        seen.append(lines.get() or "")
    out = "".join(seen)
    assert proc.returncode != 0, out[-3000:]
    assert " done: " not in out, out[-3000:]


def test_dataloader_worker_raising_on_one_rank_ends_the_job():
    rc, out = launch("loader")
    assert rc != 0, out[-3000:]
    assert "OSError: deliberate failure in a DataLoader worker reading item" in out, out[-3000:]
    assert "[rank 1 / 2] uncaught OSError, aborting the job" in out, out[-3000:]


def test_settings_come_from_init_then_the_environment(monkeypatch):
    from fluxmpi_py.runtime import stall as _stall

    monkeypatch.setenv("FLUXMPI_STALL_WARNING", "7.5")
    monkeypatch.setenv("FLUXMPI_TIMEOUT", "none")
    assert _stall.settings() == (7.5, 0.0)
    assert _stall.settings(stall_warning=None, timeout=30) == (0.0, 30.0)
    monkeypatch.delenv("FLUXMPI_STALL_WARNING")
    monkeypatch.delenv("FLUXMPI_TIMEOUT")
    assert _stall.settings() == (60.0, 1800.0)
    monkeypatch.setenv("FLUXMPI_TIMEOUT", "ten minutes")
    with pytest.raises(ValueError, match=r"FLUXMPI_TIMEOUT: timeout must be a number of seconds"):
        _stall.settings()
    with pytest.raises(ValueError, match=r"Init\(stall_warning=...\): stall_warning must be >= 0"):
        _stall.settings(stall_warning=-1)
