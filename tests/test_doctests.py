"""The docstring examples of every fluxmpi_py module, each module in a process of its own (forked
from the suite's fork server, tests/forks.py, which has imported torch and fluxmpi_py), a world of
one (no mpiexec); and every public callable has one. Modules are found on disk, so a new one is
covered by itself (a module with neither examples nor __all__ has nothing to run). Examples that
need several ranks are marked ``# doctest: +SKIP`` and run for real elsewhere (e.g.
fluxmpi_py.runtime.launch's, by tests/test_launch.py)."""

import glob
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT  # noqa: E402


def has_something_to_check(path):
    # A module with no example and no __all__ (a private helper) needs no process of its own.
    with open(path, encoding="utf-8") as f:
        source = f.read()
    return ">>>" in source or "__all__" in source


def module_name(path):
    rel = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


# Every module of the package and its subpackages, found on disk.
MODULES = sorted(
    module_name(p)
    for p in glob.glob(os.path.join(ROOT, "fluxmpi_py", "**", "*.py"), recursive=True)
    if has_something_to_check(p)
)

# Prints one JSON line: the doctest counts, the failure report, and the public callables
# (the module's __all__) whose docstring has no example.
RUN_EXAMPLES = r"""
import contextlib, doctest, importlib, io, json, sys
m = importlib.import_module(sys.argv[1])
report = io.StringIO()
with contextlib.redirect_stdout(report):
    res = doctest.testmod(m, optionflags=doctest.ELLIPSIS)
missing = [n for n in getattr(m, "__all__", ())
           if callable(getattr(m, n)) and ">>>" not in (getattr(m, n).__doc__ or "")]
print("DOCTEST " + json.dumps(dict(attempted=res.attempted, failed=res.failed,
                                   report=report.getvalue(), missing=missing)))
"""


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module, tmp_path, forked):
    # Preferences written by an example go to a directory of this test's own.
    p = forked.run(RUN_EXAMPLES, [module], env_extra={"FLUXMPI_PY_CONFIG_DIR": str(tmp_path)})
    out = p.stdout + p.stderr
    lines = [line for line in p.stdout.splitlines() if line.startswith("DOCTEST ")]
    assert p.returncode == 0 and lines, out[-4000:]
    res = json.loads(lines[-1][len("DOCTEST ") :])
    print(f"{module}: {res['attempted']} examples run, {res['failed']} failed")
    assert res["failed"] == 0, res["report"][-6000:]
    assert not res["missing"], f"{module}: no example in the docstring of {res['missing']}"
