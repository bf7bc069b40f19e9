"""Launch a worker script under mpiexec with a hard timeout, for the pytest session.

A worker that fails on any rank makes mpiexec exit non-zero (our excepthook aborts the job);
a worker that hangs is killed with its whole process group when the timeout expires. Either
way CI never hangs.

A harness worker (tests/workers/*_worker.py calling ``harness.run_cases``) becomes one pytest
item per ``case_*`` function and world size::

    @pytest.mark.parametrize("case", worker_params("optimizer_worker.py", [1, 2, 3], timeout=300))
    def test_optimizer_multirank(case):
        case.check_passed()

gives ``test_optimizer_multirank[np=2-case_adam_matches_single_process]`` and so on, plus one
``[np=2-clean_exit]`` item per world size. The cases are read from the worker's source at
collection time, so a new ``case_*`` is picked up by itself. The worker is launched once per
world size for the whole session (the first item runs it, the others read its results); each
rank records every case in a results directory (see harness.py), so a failing item shows that
case's message and the failing rank's traceback, and the cases after it say which case
stopped the job. Only the selected cases run (tests/conftest.py tells which: ``-k`` works).
"""

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import forks
import pytest
from launch_env import ROOT, mpi_env, singleton_env  # noqa: F401  (the tests' names)

WORKERS = os.path.join(ROOT, "tests", "workers")
RESULTS_ENV = "HARNESS_RESULTS"  # the names harness.py reads
CASES_ENV = "HARNESS_CASES"
TAIL = 3000  # characters of output shown when no case explains a failure


def worker_path(script):
    return script if os.path.isabs(script) else os.path.join(WORKERS, script)


def find_mpiexec():
    """The mpiexec of the MPI the extension runs on: this environment's (Open MPI from PyPI,
    `make`'s default, in .venv/bin), else the site's on PATH. Not PATH's first: a shell that
    did not activate the venv finds Debian's 4.1 in /usr/bin, which cannot start 5.0's ranks."""
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which(
        "mpiexec"
    )
    if mpiexec is None:
        pytest.fail("mpiexec not found: run `make test`, which installs Open MPI")
    return mpiexec


def _command(path, np, args, fresh=False):
    """The command line that runs `path` on `np` ranks. Under mpiexec the ranks are forked from
    a process that imported torch and fluxmpi_py once (tests/fork_server.py), unless `fresh`:
    a test of what happens while Python starts (import order) needs fresh interpreters."""
    if np is None:
        return [sys.executable, path, *map(str, args)]
    python = forks.python(fresh)
    return [find_mpiexec(), "-n", str(np), "--oversubscribe", *python, path, *map(str, args)]


def _launch(path, np, args, timeout, env, cwd=ROOT):
    """Run the worker in `cwd`; return (exit code, stdout+stderr, timed out). A job still
    running after `timeout` seconds is killed with its whole session."""
    command = _command(path, np, args)  # first: it starts the fork server mpi_env names
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=singleton_env(env) if np is None else mpi_env(env),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, False
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, _ = proc.communicate()
        return proc.returncode, out, True


def kill_session(sid):
    """SIGKILL every process of session `sid` (a job started with start_new_session=True).
    mpiexec puts each rank in a process group of its own, so killing the job's group would
    leave a rank that hangs before MPI_Init running, holding the output pipe open."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:  # mpiexec's group is gone; its ranks may not be
        pass
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:  # after ")": state, ppid, pgrp, session
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass


def run_mpi(script, np, *args, timeout=180, env=None, expect_ok=True, cwd=ROOT):
    """Run ``tests/workers/<script>`` (or a path) on ``np`` ranks (None: without mpiexec), in
    ``cwd``; return (rc, stdout+stderr)."""
    path = worker_path(script)
    rc, out, timed_out = _launch(path, np, args, timeout, env, cwd)
    name = os.path.basename(path)
    if timed_out:
        pytest.fail(f"{name} on {np} ranks did not finish in {timeout}s:\n{out[-4000:]}")
    if expect_ok and rc != 0:
        pytest.fail(f"{name} on {np} ranks exited {rc}:\n{out[-6000:]}")
    return rc, out


# --- harness workers: one pytest item per case ---------------------------------------------------


ANY_SIZE = "any"


def worker_cases(script, np=ANY_SIZE):
    """The names of a worker's top-level ``case_*`` functions, in the order the harness runs
    them (definition order), read from its source without running it. With ``np``, only those
    that run at that world size (``None``, no mpiexec: 1): a case decorated ``@only_at(2, 3)``
    (harness.py) runs at 2 and 3 ranks only."""
    path = worker_path(script)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names = [
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.name.startswith("case_")
        and (np == ANY_SIZE or (np or 1) in _only_at(n, (np or 1,)))
    ]
    return list(dict.fromkeys(names))  # a redefinition keeps its first place, as in globals()


def _only_at(fn, default):
    """The world sizes of a case's ``@only_at(...)`` decorator (literal integers), else
    ``default``."""
    for d in fn.decorator_list:
        if (
            isinstance(d, ast.Call)
            and getattr(d.func, "id", getattr(d.func, "attr", "")) == "only_at"
        ):
            return tuple(a.value for a in d.args)
    return default


CLEAN_EXIT = "clean_exit"


class WorkerCase:
    """One case of a harness worker at one world size (``np=None``: plain ``python``, a world
    of one without mpiexec). ``name`` is a case name or CLEAN_EXIT."""

    def __init__(self, script, np, name, timeout, bundle=True):
        self.script, self.np, self.name, self.timeout = script, np, name, timeout
        self.bundle = bundle

    def __repr__(self):
        return f"{self.script}[np={self.np}]::{self.name}"

    def check_passed(self, env=None):
        """Launch the worker (once per session for this script, world size and env) and fail
        with this case's own report unless it passed on every rank. Returns the job's output.
        A worker that needs no environment of its own runs in its world size's bundle: one
        launch for all such workers of the session (tests/workers/bundle.py)."""
        if self.bundle and env is not None:
            pytest.fail(f"{self.script} takes an environment of its own: give it bundle=False")
        if self.bundle and self.np in _BUNDLES:
            launch = launch_bundle(self.np).view(self.script)
        else:
            launch = launch_worker(
                self.script,
                self.np,
                timeout=self.timeout,
                env=env,
                cases=_SELECTED.get((self.script, self.np)),
            )
        if self.name == CLEAN_EXIT:
            launch.check_exit()
        else:
            launch.check_case(self.name)
        return launch.output


def worker_params(scripts, world_sizes, timeout=180, bundle=True):
    """pytest parameters: every case of each worker of `scripts` (one name, or a list: a
    feature's workers, split to keep each file small) at every world size (None: without
    mpiexec), then a clean-exit check per worker and world size, with ids like ``np=2-case_x``
    (the clean exit of a list's first worker ``np=2-clean_exit``, of the others
    ``np=2-clean_exit-WORKER``). `bundle=False`: the workers get launches of their own (ones
    that change process-wide state for good)."""
    scripts = [scripts] if isinstance(scripts, str) else list(scripts)
    names = [n for script in scripts for n in worker_cases(script)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # their ids would clash
        raise ValueError(f"{', '.join(twice)}: defined in more than one of {scripts}")
    params = []
    for np in world_sizes:
        prefix = "" if np is None else f"np={np}-"
        for i, script in enumerate(scripts):
            for name in worker_cases(script, np) + [CLEAN_EXIT]:
                case = WorkerCase(script, np, name, timeout, bundle)
                stem = os.path.splitext(os.path.basename(script))[0]
                suffix = f"-{stem}" if i and name == CLEAN_EXIT else ""
                params.append(pytest.param(case, id=prefix + name + suffix))
    return params


# (script, np) -> the case names the session selected, when not all of them (see conftest.py)
_SELECTED = {}
# np -> [(script, selected case names or None for all, timeout)]: the workers that share one
# launch at that world size, in the session's order
_BUNDLES = {}


def select_cases(worker_cases_selected):
    """Record which cases of each worker and world size the session will run, and which
    workers share a launch (the bundles)."""
    worker_cases_selected = list(worker_cases_selected)
    chosen = {}
    for c in worker_cases_selected:
        if c.name != CLEAN_EXIT:
            chosen.setdefault((c.script, c.np), set()).add(c.name)
    _SELECTED.clear()
    for key, names in chosen.items():
        every = worker_cases(key[0], key[1])
        if set(every) - names:
            _SELECTED[key] = tuple(n for n in every if n in names)
    _BUNDLES.clear()
    for c in worker_cases_selected:
        if c.bundle:
            plan = _BUNDLES.setdefault(c.np, [])
            if c.script not in [p[0] for p in plan]:
                plan.append((c.script, _SELECTED.get((c.script, c.np)), c.timeout))


_LAUNCHES = {}


def launch_worker(script, np, timeout=180, env=None, cases=None):
    """Run a harness worker once for the session (per script, world size, env and case
    selection) and return its Launch. ``cases``: the names to run, default all."""
    key = (script, np, timeout, tuple(sorted((env or {}).items())), cases)
    if key not in _LAUNCHES:
        with tempfile.TemporaryDirectory(prefix="harness-results-") as results:
            extra = dict(env or {}, **{RESULTS_ENV: results})
            if cases:
                extra[CASES_ENV] = ",".join(cases)
            t0 = time.monotonic()
            rc, out, timed_out = _launch(worker_path(script), np, (), timeout, extra)
            seconds = time.monotonic() - t0
            records = _read_records(results)
        _LAUNCHES[key] = Launch(script, np, timeout, rc, out, timed_out, seconds, records)
    return _LAUNCHES[key]


BUNDLE_ENV = "HARNESS_BUNDLE"  # tests/workers/bundle.py reads the plan there


def launch_bundle(np):
    """Run every bundled worker of the session at world size `np` in one launch (once per
    session); return its Bundle. The timeout is the sum of the workers' own."""
    key = ("bundle", np)
    if key not in _LAUNCHES:
        plan = _BUNDLES[np]
        spec = ";".join(f"{script}:{','.join(cases or ())}" for script, cases, _ in plan)
        timeout = sum(t for _, _, t in plan)
        with tempfile.TemporaryDirectory(prefix="harness-results-") as results:
            extra = {RESULTS_ENV: results, BUNDLE_ENV: spec}
            t0 = time.monotonic()
            rc, out, timed_out = _launch(worker_path("bundle.py"), np, (), timeout, extra)
            seconds = time.monotonic() - t0
            records = _read_records(results)
        _LAUNCHES[key] = Bundle(np, timeout, rc, out, timed_out, seconds, records)
    return _LAUNCHES[key]


class Bundle:
    """One launch of several workers (tests/workers/bundle.py); `view(script)` is the Launch
    of one of them, read from the records that name it."""

    def __init__(self, np, timeout, rc, output, timed_out, seconds, records):
        self.np, self.timeout, self.rc, self.output = np, timeout, rc, output
        self.timed_out, self.seconds, self.records = timed_out, seconds, records

    def view(self, script):
        mine = [r for r in self.records if r.get("script") == script]
        others = [r for r in self.records if r.get("script") != script]
        launch = Launch(
            script, self.np, self.timeout, self.rc, self.output, self.timed_out, self.seconds, mine
        )
        launch.bundle_others = others
        return launch


def _read_records(directory):
    records = []
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:  # a line cut short by a kill
                    pass
    cases_log = os.environ.get("FLUXMPI_TEST_CASES")
    if cases_log:  # every case's seconds on each rank, one JSON line each (where time goes)
        with open(cases_log, "a", encoding="utf-8") as f:
            for r in records:
                if r.get("seconds") is not None:
                    f.write(json.dumps(r) + "\n")
    return records


def _ranks(rs):
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


class Launch:
    """One run of a harness worker: its exit, output and every rank's case records."""

    def __init__(self, script, np, timeout, rc, output, timed_out, seconds, records):
        self.script, self.np, self.timeout = script, np, timeout
        self.rc, self.output, self.timed_out, self.seconds = rc, output, timed_out, seconds
        self.records = records
        self.bundle_others = None  # in a bundle: the other workers' records
        self.world = 1 if np is None else np
        self.where = f"{script} on {self.world} rank{'s' if self.world > 1 else ''}" + (
            " (without mpiexec)" if np is None else ""
        )

    # -- what the records say
    def _with(self, status, case=None):
        return [
            r for r in self.records if r["status"] == status and (case is None or r["case"] == case)
        ]

    def _ending(self):
        """How the job ended, in words."""
        if self.timed_out:
            return f"the job was killed after the {self.timeout}s timeout"
        return f"the job exited with code {self.rc} after {self.seconds:.1f}s"

    def _tail(self):
        return f"\n--- last {TAIL} characters of the output ---\n{self.output[-TAIL:]}"

    def _fail(self, text):
        pytest.fail(f"{self.where}: {text}", pytrace=False)

    def _skip_for_another_worker(self):
        """In a bundle, this worker never began: fail unless another worker's failure or hang
        ended the job first, which that worker's items report."""
        other = _first_problem(self.bundle_others)
        if other is None:
            return
        pytest.fail(
            f"{self.where}: not run: the bundled launch ended in {other} first",
            pytrace=False,
        )

    def _check_world(self):
        begun = self._with("begin")
        if self.bundle_others is not None and not begun:
            self._skip_for_another_worker()
        if not begun:
            self._fail(f"no rank started the cases; {self._ending()}{self._tail()}")
        seen = sorted((r["rank"], r["world"]) for r in begun)
        if seen != [(r, self.world) for r in range(self.world)]:
            got = ", ".join(f"rank {r} of {w}" for r, w in seen)
            self._fail(
                f"expected ranks 0..{self.world - 1} of a world of {self.world}, "
                f"got {got}{self._tail()}"
            )

    def _first_failure(self):
        failed = sorted(self._with("failed"), key=lambda r: r["time"])
        return failed[0] if failed else None

    def _interrupted(self):
        """(case, ranks) of the case some ranks started and never finished, or None."""
        done = {(r["rank"], r["case"]) for r in self.records if r["status"] in ("passed", "failed")}
        open_ = [r for r in self._with("started") if (r["rank"], r["case"]) not in done]
        if not open_:
            return None
        case = open_[0]["case"]
        return case, [r["rank"] for r in open_ if r["case"] == case]

    def _failure_report(self, case):
        failed = sorted(self._with("failed", case), key=lambda r: r["time"])
        first = failed[0]
        same = [r["rank"] for r in failed if r["message"] == first["message"]]
        # The message on the first line: pytest's summary line shows only that one.
        lines = [
            f"{case} failed on {_ranks(same)} of {self.world}: {first['message']}",
            "",
            f"traceback on rank {first['rank']} ({first['seconds']:.2f}s into the case):",
            first["traceback"].rstrip(),
        ]
        for r in failed:
            if r["message"] != first["message"]:
                lines.append(f"\nalso failed on rank {r['rank']}: {r['message']}")
        return "\n".join(lines)

    # -- the checks of one pytest item
    def check_case(self, case):
        """Fail with this case's own report unless it passed on every rank."""
        self._check_world()
        if self._with("failed", case):
            self._fail(self._failure_report(case))
        passed = {r["rank"] for r in self._with("passed", case)}
        if passed == set(range(self.world)):
            return
        begun = self._with("begin")
        if self.bundle_others is not None and not begun:
            self._skip_for_another_worker()
        if all(case not in r["cases"] for r in begun):
            self._fail(f"the harness did not run {case} (cases it ran: {begun[0]['cases']})")
        first = self._first_failure()
        if first is not None:
            self._fail(f"not run: {first['case']} failed on rank {first['rank']}")
        stuck = self._interrupted()
        if stuck and stuck[0] == case:
            self._fail(
                f"{case} did not finish on {_ranks(stuck[1])}: {self._ending()}{self._tail()}"
            )
        if stuck:
            self._fail(
                f"not run: {stuck[0]} did not finish on {_ranks(stuck[1])} ({self._ending()})"
            )
        missing = sorted(set(range(self.world)) - passed)
        self._fail(f"{case} has no result from {_ranks(missing)}: {self._ending()}{self._tail()}")

    def check_exit(self):
        """After the cases: every rank reached the end and the job exited 0 in time. Skipped
        when a case's failure ended the job (that case's item reports it)."""
        self._check_world()
        first = self._first_failure()
        if first is not None:
            pytest.skip(
                f"the job ended with the failure of {first['case']} on rank "
                f"{first['rank']}, reported by that case"
            )
        stuck = self._interrupted()
        if stuck:
            pytest.skip(f"the job ended during {stuck[0]}, reported by that case")
        ran = self._with("begin")[0]["cases"]
        unknown = [c for c in ran if c not in worker_cases(self.script)]
        if unknown:
            self._fail(
                f"the harness ran {', '.join(unknown)}, which pytest does not collect: "
                "define each case_* with `def` at the top level of the worker"
            )
        ended = {r["rank"] for r in self._with("end")}
        if self.bundle_others is not None and ended == set(range(self.world)):
            other = _first_problem(self.bundle_others)
            if other is not None:
                pytest.skip(f"this worker ended cleanly; the bundled launch ended in {other}")
        if ended != set(range(self.world)) or self.timed_out or self.rc != 0:
            missing = sorted(set(range(self.world)) - ended)
            not_end = f"; {_ranks(missing)} did not reach the end of the cases" if missing else ""
            self._fail(f"every case passed, but {self._ending()}{not_end}{self._tail()}")

    def problems(self):
        """The report of every failed case and of a job that did not end cleanly (empty when
        all is well); cases not run because of an earlier failure are left out."""
        begun = self._with("begin")
        names = begun[0]["cases"] if begun else []
        found = []
        for check, args in [(self.check_case, (c,)) for c in names] + [(self.check_exit, ())]:
            try:
                check(*args)
            except pytest.fail.Exception as e:
                if ": not run: " not in str(e):
                    found.append(str(e))
            except pytest.skip.Exception:
                pass
        return found


def _first_problem(records):
    """`script::case` of the first failed or unfinished case in the records, or None."""
    failed = sorted((r for r in records if r["status"] == "failed"), key=lambda r: r["time"])
    if failed:
        return f"{failed[0]['script']}::{failed[0]['case']} (failed on rank {failed[0]['rank']})"
    done = {(r["rank"], r["script"], r["case"]) for r in records if r["status"] == "passed"}
    open_ = [r for r in records if r["status"] == "started"]
    for r in open_:
        if (r["rank"], r["script"], r["case"]) not in done:
            return f"{r['script']}::{r['case']} (unfinished on rank {r['rank']})"
    return None


def run_cases_on(script, np, timeout=180, env=None):
    """Run a harness worker on `np` ranks as one check: fail listing every failed case (prefer
    worker_params, which makes each case its own pytest item). Returns the output."""
    launch = launch_worker(script, np, timeout=timeout, env=env)
    found = launch.problems()
    if found:
        pytest.fail("\n\n".join(found), pytrace=False)
    return launch.output
