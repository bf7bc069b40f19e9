"""Run several harness workers in one mpiexec launch: Python, torch, MPI and fluxmpi_py start
once instead of once per worker (tests/mpi_util.py bundles the workers that need no
environment of their own).

The plan, in HARNESS_BUNDLE, is `script:case,case;script:case,...` (an empty case list: all the
worker's cases). Each worker is imported under its own module name, not as __main__, so its
`run_cases(globals())` line does not run; its cases then run in order, recorded under the
worker's name (harness.py). A failure ends the whole job, as in a launch of one worker.
"""

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BUNDLE_ENV = "HARNESS_BUNDLE"


def load(script):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    name = "bundled_" + os.path.splitext(script)[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main():
    plan = []
    for entry in filter(None, os.environ[BUNDLE_ENV].split(";")):
        script, _, names = entry.partition(":")
        cases = harness._cases_of(vars(load(script)))
        wanted = [n for n in names.split(",") if n]
        unknown = sorted(set(wanted) - {k for k, _ in cases})
        if unknown:
            raise SystemExit(f"bundle: {script} has no case named {', '.join(unknown)}")
        plan.append((script, [(k, v) for k, v in cases if not wanted or k in wanted]))
    harness.run_scripts(plan)


if __name__ == "__main__":
    main()
