"""A job whose rank fails or leaves early must end, with a message, instead of hanging; a job
that ends normally must exit 0 promptly; a failing case of a harness worker is reported under
its own name. Workers: tests/workers/failure_worker.py and failing_worker.py. The only time
limit here is the hard kill timeout of each launch (run_mpi fails the test if it fires): times
are printed, not asserted."""

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_cases_on, run_mpi  # noqa: E402

TIMEOUT = 120  # only a hung job comes near this
_LAUNCHES = {}  # (worker, mode, np) -> (exit code, output): tests that read one job share it


def run_once(worker, mode, np):
    """Launch `worker` with `mode` on `np` ranks once for this module; (exit code, output)."""
    key = (worker, mode, np)
    if key not in _LAUNCHES:
        t0 = time.monotonic()
        rc, out = run_mpi(worker, np, mode, timeout=TIMEOUT, expect_ok=False)
        print(f"{worker} {mode} on {np} ranks: exit code {rc} after {time.monotonic() - t0:.1f}s")
        _LAUNCHES[key] = rc, out
    return _LAUNCHES[key]


def launch(mode, np=2):
    return run_once("failure_worker.py", mode, np)


@pytest.mark.parametrize("mode", ["raise", "raise_c10d"])
def test_uncaught_exception_ends_job_with_its_message(mode):
    rc, out = launch(mode)
    assert rc != 0, out[-3000:]
    assert "RuntimeError: deliberate failure on rank 1" in out, out[-3000:]
    assert "[rank 1 / 2] uncaught RuntimeError, aborting the job" in out, out[-3000:]
    assert "the collective returned" not in out
    # the traceback starts at the worker's frame, as a fresh interpreter's does (the ranks may
    # be forked from the suite's fork server: tests/fork_server.py)
    assert "fork_server.py" not in out and "<frozen runpy>" not in out, out[-3000:]


def test_uncaught_exception_in_a_thread_ends_job():
    rc, out = launch("thread_raise")
    assert rc != 0, out[-3000:]
    assert "[rank 1 / 2] uncaught ZeroDivisionError in thread" in out, out[-3000:]


@pytest.mark.parametrize(
    "mode,np", [("exit", 2), ("return", 2), ("exit_early", 2), ("exit_async", 2), ("exit", 4)]
)
def test_rank_leaving_early_ends_job_naming_it(mode, np):
    rc, out = launch(mode, np)
    leaver = np - 1
    assert rc != 0, out[-3000:]
    assert f"rank {leaver} has exited" in out and "can never join" in out, out[-3000:]
    assert "the collective returned" not in out


@pytest.mark.parametrize("mode,np", [("clean", 2), ("root_leaves", 4), ("slow_peer", 2)])
def test_normal_end_exits_zero(mode, np):
    rc, out = launch(mode, np)
    assert rc == 0, out[-3000:]
    assert all(f"rank {r} done" in out for r in range(np)), out[-3000:]
    assert "aborting" not in out and "MPI_ABORT" not in out, out[-3000:]


def test_failing_assertion_on_one_rank_fails_the_launch():
    # run_cases_on: the whole worker as one check, failing with the failed case's report
    with pytest.raises(pytest.fail.Exception) as info:
        run_cases_on("failing_worker.py", 2, timeout=TIMEOUT)
    msg = str(info.value)
    assert (
        "case_fails_on_rank_1 failed on rank 1 of 2: AssertionError: deliberate assertion "
        "failure on rank 1" in msg
    ), msg[-3000:]


def pytest_session(tmp_path, test_file):
    """A pytest session of its own over `test_file` in `tmp_path`, with a JUnit report there
    (report.xml) and the summary lines in full."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
         "--junitxml", str(tmp_path / "report.xml"), test_file],
        cwd=tmp_path, capture_output=True, text=True, timeout=2 * TIMEOUT,
        env=dict(os.environ, COLUMNS="300"),
    )  # fmt: skip


FAILING_WORKER_TEST = """
import sys
sys.path.insert(0, {tests!r})
import pytest
from mpi_util import worker_params

@pytest.mark.parametrize("case", worker_params("failing_worker.py", [2], timeout={timeout}))
def test_failing_worker(case):
    case.check_passed()
"""


def test_failing_case_is_reported_under_its_own_name(tmp_path):
    # A pytest session of its own over failing_worker.py's cases at 2 ranks: each case is an
    # item; the failing one shows its message and rank 1's traceback, not the job's output.
    (tmp_path / "test_failing.py").write_text(
        FAILING_WORKER_TEST.format(tests=os.path.dirname(__file__), timeout=TIMEOUT)
    )
    t0 = time.monotonic()
    p = pytest_session(tmp_path, "test_failing.py")
    print(
        f"pytest over failing_worker.py: exit code {p.returncode} after "
        f"{time.monotonic() - t0:.1f}s"
    )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-4000:]  # 1: some tests failed
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "report.xml").iter("testcase")}
    name = "test_failing_worker[np=2-{}]".format
    assert set(cases) == {
        name(c)
        for c in ("case_passes", "case_fails_on_rank_1", "case_after_the_failure", "clean_exit")
    }, out
    assert cases[name("case_passes")].find("failure") is None, out[-4000:]
    failure = cases[name("case_fails_on_rank_1")].find("failure")
    text = failure.get("message") + "\n" + (failure.text or "")
    for needle in (
        "failing_worker.py on 2 ranks: case_fails_on_rank_1 failed on rank 1 of 2: "
        "AssertionError: deliberate assertion failure on rank 1",
        "traceback on rank 1 (",
        'failing_worker.py", line',
        "in case_fails_on_rank_1",
    ):
        assert needle in text, text
    # only that case's report: not rank 0's progress lines nor the abort that followed
    assert "ok case_passes" not in text and "MPI_ABORT" not in text, text
    after = cases[name("case_after_the_failure")].find("failure")
    assert "not run: case_fails_on_rank_1 failed on rank 1" in after.get("message"), out
    assert cases[name("clean_exit")].find("skipped") is not None, out
    # pytest's summary line: the case's name and its message
    assert (
        f"FAILED test_failing.py::{name('case_fails_on_rank_1')} - Failed: failing_worker.py "
        "on 2 ranks: case_fails_on_rank_1 failed on rank 1 of 2: AssertionError: deliberate "
        "assertion failure on rank 1" in out
    ), out[-4000:]


# ---- one readable story per failure (tests/workers/error_report_worker.py) -----------------


def report(mode, np=2):
    rc, out = run_once("error_report_worker.py", mode, np)
    print(out)
    return rc, out


def traceback_block(out, exc):
    """The report's lines, from its first traceback (a chained cause comes first) to the line
    of the exception raised last."""
    lines = out.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")
    )
    end = max(i for i, line in enumerate(lines) if line.startswith(f"{exc}: "))
    return lines[start : end + 1]


def count_tracebacks(out):
    # A chained exception's cause is part of the same traceback.
    return (
        out.count("Traceback (most recent call last)")
        - out.count("The above exception was the direct cause of the following exception")
        - out.count("During handling of the above exception, another exception occurred")
    )


@pytest.mark.parametrize(
    "mode,exc,first",
    [
        ("same_error", "RuntimeError", "allreduce_(): ranks disagree on numel"),
        ("same_error_python", "FileNotFoundError", "no-such-checkpoint.pt"),
    ],
)
@pytest.mark.parametrize("np", [2, 3])
def test_error_on_every_rank_is_reported_once(mode, exc, first, np):
    rc, out = report(mode, np)
    assert rc != 0, out[-3000:]
    # One traceback, from rank 0, under its header; one line from each other rank.
    assert count_tracebacks(out) == 1, out[-4000:]
    assert f"[rank 0 / {np}] {exc} raised on every rank" in out, out[-3000:]
    block = traceback_block(out, exc)
    assert block[-1].startswith(f"{exc}: ") and first in block[-1], block
    for r in range(1, np):
        mine = [line for line in out.splitlines() if line.startswith(f"[rank {r} / {np}]")]
        assert len(mine) == 1 and mine[0].startswith(f"[rank {r} / {np}] same {exc} as rank 0: "), (
            mine
        )
        assert first in mine[0], mine
    # Open MPI's abort notice and other ranks' output stay out of the traceback.
    text = "\n".join(block)
    assert not any(s in text for s in ("MPI_ABORT", "ORTE", "PMIX", "----", "[rank ")), text
    # One prefix style throughout.
    assert "[fluxmpi_py rank" not in out, out[-3000:]


def test_error_on_every_rank_caught_on_rank_0_still_ends_the_job():
    # Rank 1 waits for rank 0's abort, which never comes: after a bounded wait it reports
    # its own traceback and ends the job.
    rc, out = report("rank0_catches")
    assert rc != 0, out[-3000:]
    assert "[rank 1 / 2] same RuntimeError as rank 0: " in out, out[-3000:]
    assert "[rank 1 / 2] rank 0 did not end the job within" in out, out[-3000:]
    assert count_tracebacks(out) == 1, out[-3000:]


def test_error_on_one_rank_still_reports_its_traceback():
    rc, out = launch("raise")
    assert rc != 0 and count_tracebacks(out) == 1, out[-3000:]
    assert "[rank 1 / 2] uncaught RuntimeError, aborting the job:" in out, out[-3000:]


def caught_lines(out, np, mode):
    lines = {}
    for r in range(np):
        start = f"[{r} / {np}] {mode}: rank {r} caught "
        found = [line for line in out.splitlines() if line.startswith(start)]
        assert len(found) == 1, (r, out[-3000:])
        lines[r] = found[0]
    return lines


MISMATCHES = {
    "ctor_vs_allreduce": "ranks are in different calls: rank 0 is in DistributedOptimizer() (",
    "step_op_mismatch": "DistributedOptimizer.step(): ranks disagree on op: rank 0 has average",
    "step_vs_allreduce": "ranks are in different calls: rank 0 is in DistributedOptimizer.step() (",
    "sync_vs_allreduce": "ranks are in different calls: rank 0 is in synchronize_() (",
}


@pytest.mark.parametrize("mode,expected", MISMATCHES.items())
def test_mismatch_names_the_users_call(mode, expected):
    # each mismatch is caught on every rank and the job goes on: one launch runs them all,
    # one after another, and each test reads its own mode's lines
    rc, out = report(",".join(MISMATCHES))
    assert rc == 0 and all(f"rank {r} done" in out for r in range(2)), out[-3000:]
    for line in caught_lines(out, 2, mode).values():
        assert "(every rank: True)" in line and expected in line, line
        assert "gradient allreduce" not in line and "fluxmpi_py.allreduce_" not in line, line


def test_watchdog_names_the_users_call():
    rc, out = report("sync_peer_exits")
    assert rc != 0, out[-3000:]
    assert "[rank 0 / 2] rank 1 has exited" in out, out[-3000:]
    assert "while this rank waits in synchronize_() (its allreduce, collective call" in out, out[
        -3000:
    ]
    assert "[fluxmpi_py rank" not in out, out[-3000:]


BUNDLE_TEST = """
import os, sys
sys.path.insert(0, {tests!r})
import pytest
from mpi_util import worker_params

@pytest.mark.parametrize("case", worker_params({first!r}, [2], timeout={timeout}))
def test_first(case):
    case.check_passed()

@pytest.mark.parametrize("case", worker_params("failing_worker.py", [2], timeout={timeout}))
def test_failing(case):
    case.check_passed()

@pytest.mark.parametrize("case", worker_params({last!r}, [2], timeout={timeout}))
def test_last(case):
    case.check_passed()
"""

BUNDLE_CONFTEST = """
import sys
sys.path.insert(0, {tests!r})
import mpi_util

def pytest_collection_finish(session):
    mpi_util.select_cases(
        v for item in session.items
        for v in getattr(getattr(item, "callspec", None), "params", {{}}).values()
        if isinstance(v, mpi_util.WorkerCase)
    )
"""

SMALL_WORKER = """
import os, sys
sys.path.insert(0, {workers!r})
from harness import run_cases
import fluxmpi_py as fm

def case_{name}_sums():
    assert fm.total_workers() == 2

if __name__ == "__main__":
    run_cases(globals())
"""


def test_bundled_workers_report_each_case_under_its_own_worker(tmp_path):
    # Three workers share one 2-rank launch (tests/workers/bundle.py). The first passes; the
    # second fails on rank 1; the third never runs, and its items say which case ended the job.
    tests = os.path.dirname(os.path.abspath(__file__))
    workers = os.path.join(tests, "workers")
    paths = {}
    for name in ("first", "last"):
        paths[name] = str(tmp_path / f"{name}_worker.py")
        with open(paths[name], "w") as f:
            f.write(SMALL_WORKER.format(workers=workers, name=name))
    (tmp_path / "conftest.py").write_text(BUNDLE_CONFTEST.format(tests=tests))
    (tmp_path / "test_bundle.py").write_text(
        BUNDLE_TEST.format(tests=tests, timeout=TIMEOUT, first=paths["first"], last=paths["last"])
    )
    p = pytest_session(tmp_path, "test_bundle.py")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-4000:]
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "report.xml").iter("testcase")}

    def outcome(name):
        c = cases[name]
        for kind in ("failure", "skipped", "error"):
            found = c.find(kind)
            if found is not None:
                return kind, (found.get("message") or "") + "\n" + (found.text or "")
        return "passed", ""

    assert outcome("test_first[np=2-case_first_sums]")[0] == "passed", out[-4000:]
    kind, text = outcome("test_first[np=2-clean_exit]")
    assert kind == "skipped" and "failing_worker.py::case_fails_on_rank_1" in text, text
    kind, text = outcome("test_failing[np=2-case_fails_on_rank_1]")
    assert kind == "failure" and "case_fails_on_rank_1 failed on rank 1 of 2" in text, text
    assert outcome("test_failing[np=2-case_passes]")[0] == "passed", out[-4000:]
    for item in ("test_last[np=2-case_last_sums]", "test_last[np=2-clean_exit]"):
        kind, text = outcome(item)
        assert kind == "failure", (item, kind, text)
        assert "not run: the bundled launch ended in failing_worker.py::case_fails_on_rank_1" in (
            text
        ), text
