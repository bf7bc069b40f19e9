"""Run Horovod's own torch test file against fluxmpi_py.horovod, one test per mpiexec launch.

    python scripts/run_horovod_suite.py HOROVOD [--np 2 3] [--timeout 120] [-k EXPR] [--keep]

HOROVOD is a Horovod checkout, its test/ directory, or the test file itself
(test/parallel/test_torch.py by default). Horovod's code is only read from there, never copied
into this repository. A shim package made in a temporary directory turns
``import horovod.torch as hvd`` into ``fluxmpi_py.horovod`` (with stand-ins for the few other
names Horovod's test/utils/common.py imports), and a pytest plugin of the shim writes each rank's
outcome of its test to a JSON file. Each test runs in its own
``mpiexec -n N python -m pytest FILE::Class::test`` under a timeout, one launch at a time, so a
test that leaves the ranks out of step cannot derail the ones after it.

A test passed when it passed on every rank, failed when it failed on any rank or a rank gave no
outcome (a crash or the timeout), and skipped otherwise. The tests in KNOWN_CLASHES (the suite's
own clash with the installed torch, not fluxmpi_py's) are counted apart. Prints per world size the
counts and each failing test with its first error line; exits 1 when any other test failed.

Environment: PYTHON (the interpreter; default: this one), FLUXMPI_PY_ROOT (the directory holding
the fluxmpi_py package to test; default: this checkout), MPIEXEC (default: mpiexec on PATH).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Tests that fail for reasons of the suite's own, not fluxmpi_py's: name -> (the world sizes
# where, None for all; why). Counted apart, as known clashes.
_MUON = (
    "torch 2.13's torch.optim.Muon takes only 2-D parameters; the suite builds every torch.optim"
)
_HALF3 = (
    "float16 at 3 ranks: the suite wants, with tolerance 0, the float32 value 3 * a, which no "
    "float16 sum can hold (Horovod's float16 sum rounds the same way)"
)
KNOWN_CLASHES: dict[str, tuple[tuple[int, ...] | None, str]] = {
    "test_broadcast_state": (None, _MUON + " optimizer over a model with biases"),
    "test_broadcast_state_options": (None, _MUON + " optimizer over a model with biases"),
    "test_force_allreduce": (None, _MUON + " optimizer over a model with biases"),
    "test_horovod_allreduce_prescale": ((3,), _HALF3),
    "test_horovod_reducescatter_prescale": ((3,), _HALF3),
    "test_horovod_grouped_reducescatter_prescale": ((3,), _HALF3),
}

_HORO_INIT = '"""Shim made by fluxmpi_py\'s scripts/run_horovod_suite.py."""\n'
_TORCH_INIT = (
    "from fluxmpi_py.horovod import *  # noqa: F401,F403\n"
    "from fluxmpi_py.horovod import __all__  # noqa: F401\n"
)
_THREADS = """import threading


def in_thread(target, args=(), daemon=True, silent=False):
    t = threading.Thread(target=target, args=args, daemon=daemon)
    t.start()
    return t
"""
# The plugin: each rank writes {test id: [outcome, first error line]} into $HVD_SUITE_OUT.
_PLUGIN = """import json
import os

_results = {}


def _rank():
    return os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        first = ""
        if report.outcome == "failed":
            text = str(report.longrepr)
            lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
            first = (lines[0][1:].strip() if lines else text.splitlines()[-1])[:200]
        elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            first = str(report.longrepr[2])[:200]
        if _results.get(report.nodeid, ["passed"])[0] == "passed":
            _results[report.nodeid] = [report.outcome, first]
        # Written at once: a rank may be ended (an abort by another) before pytest finishes.
        out = os.environ.get("HVD_SUITE_OUT")
        if out:
            with open(os.path.join(out, "rank%s.json" % _rank()), "w") as f:
                json.dump(_results, f)
"""


def find_suite(path: Path, suite: str) -> Path:
    if path.is_file():
        return path
    for cand in (path / suite, path / Path(suite).relative_to("test")):
        if cand.is_file():
            return cand
    raise SystemExit(f"{path}: no {suite} in it")


def make_shim(work: Path, python: str) -> Path:
    shim = work / "shim"
    (shim / "horovod" / "torch").mkdir(parents=True)
    (shim / "horovod" / "runner" / "util").mkdir(parents=True)
    (shim / "horovod" / "__init__.py").write_text(_HORO_INIT)
    (shim / "horovod" / "torch" / "__init__.py").write_text(_TORCH_INIT)
    (shim / "horovod" / "runner" / "__init__.py").write_text("")
    (shim / "horovod" / "runner" / "util" / "__init__.py").write_text("")
    (shim / "horovod" / "runner" / "util" / "threads.py").write_text(_THREADS)
    (shim / "hvd_suite_plugin.py").write_text(_PLUGIN)
    for mod, stand_in in (
        ("mock", "from unittest.mock import *  # noqa: F401,F403\n"),
        ("cloudpickle", "from pickle import dumps, loads  # noqa: F401\n"),
    ):
        if subprocess.run([python, "-c", f"import {mod}"], capture_output=True).returncode:
            (shim / f"{mod}.py").write_text(stand_in)
    return shim


def collect(python: str, suite: Path, env: dict, keyword: str | None) -> list[str]:
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only", str(suite)]
    if keyword:
        cmd += ["-k", keyword]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=suite.parent)
    ids = [ln.strip() for ln in proc.stdout.splitlines() if "::" in ln]
    if not ids:
        raise SystemExit(f"no tests collected from {suite}:\n{proc.stdout}{proc.stderr}")
    return ids


def run_one(args, suite: Path, test: str, np_: int, env: dict, out: Path) -> dict[str, list]:
    """One launch of one test at np_ ranks; returns {rank: [outcome, first line]}."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = ["nice", "-n", "10", args.mpiexec, "--oversubscribe", "-n", str(np_)]
    cmd += ["-x", "PYTHONPATH", "-x", "HVD_SUITE_OUT", "-x", "OMP_NUM_THREADS"]
    cmd += [args.python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "hvd_suite_plugin"]
    cmd += ["-q", f"{suite.name}::{test.split('::', 1)[1]}"]
    env = dict(env, HVD_SUITE_OUT=str(out))
    timed_out = False
    with open(out / "mpiexec.log", "w") as log:
        # Its own session, so that a timeout (or this script's end) ends mpiexec and its ranks.
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=suite.parent, start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    results: dict[str, list] = {}
    for rank in range(np_):
        path = out / f"rank{rank}.json"
        got = json.loads(path.read_text()) if path.exists() else {}
        if got:
            results[str(rank)] = next(iter(got.values()))
        else:
            why = f"timed out after {args.timeout} s" if timed_out else "no outcome"
            results[str(rank)] = ["failed", f"{why}; the log's first error: {first_error(out)}"]
    return results


def first_error(out: Path) -> str:
    """The first pytest ``E`` line of the launch's log (colours removed), else its last line
    naming an error."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", (out / "mpiexec.log").read_text(errors="replace"))
    lines = text.splitlines()
    found = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    found = found or [ln.strip() for ln in lines if "Error" in ln]
    return found[0][:200] if found else "none"


def verdict(results: dict[str, list]) -> tuple[str, str]:
    failed = {r: msg for r, (kind, msg) in results.items() if kind == "failed"}
    if failed:
        ranks = sorted(failed, key=int)
        return "failed", f"(ranks {', '.join(ranks)}) {failed[ranks[0]]}"
    if any(kind == "skipped" for kind, _ in results.values()):
        return "skipped", next(msg for kind, msg in results.values() if kind == "skipped")
    return "passed", ""


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("horovod", type=Path, help="a Horovod checkout, its test/ dir, or the file")
    p.add_argument("--np", type=int, nargs="+", default=[2], help="world sizes (default: 2)")
    p.add_argument("--timeout", type=float, default=120, help="seconds per launch (default 120)")
    p.add_argument("-k", dest="keyword", help="pytest -k expression to choose tests")
    p.add_argument("--suite", default="test/parallel/test_torch.py", help="file in the checkout")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("-v", "--verbose", action="store_true", help="print each test's outcome")
    args = p.parse_args()
    args.python = os.environ.get("PYTHON", sys.executable)
    args.mpiexec = os.environ.get("MPIEXEC") or shutil.which("mpiexec") or "mpiexec"
    suite = find_suite(args.horovod.resolve(), args.suite)

    work = Path(tempfile.mkdtemp(prefix="hvd_suite_"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks still run
    try:
        shim = make_shim(work, args.python)
        root = os.environ.get("FLUXMPI_PY_ROOT", str(repo))
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env["PYTHONPATH"] = os.pathsep.join(
            [str(shim), root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        if os.getuid() == 0:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        tests = collect(args.python, suite, env, args.keyword)
        status = 0
        for np_ in args.np:
            counts = {"passed": 0, "failed": 0, "skipped": 0, "known clash": 0}
            failures, clashes = [], []
            for i, test in enumerate(tests):
                name = test.rsplit("::", 1)[1]
                results = run_one(args, suite, test, np_, env, work / f"np{np_}" / name)
                kind, msg = verdict(results)
                sizes, why = KNOWN_CLASHES.get(name, ((), ""))
                if kind == "failed" and (sizes is None or np_ in sizes):
                    kind = "known clash"
                    clashes.append(f"{name}: {msg} ({why})")
                elif kind == "failed":
                    failures.append(f"{name} {msg}")
                counts[kind] += 1
                if args.verbose:
                    print(f"[np={np_} {i + 1}/{len(tests)}] {name}: {kind} {msg}", flush=True)
            total = ", ".join(f"{n} {k}" for k, n in counts.items())
            print(f"== {suite.name}, np={np_}: {len(tests)} tests, {total}", flush=True)
            for line in failures:
                print(f"FAILED {line}")
            for line in clashes:
                print(f"KNOWN CLASH {line}")
            if failures:
                status = 1
        if args.keep:
            print(f"work directory: {work}")
        return status
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
