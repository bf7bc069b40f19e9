"""A harness worker whose assertion fails on rank 1 only: its launch must be reported as a
failure (this proves that a multi-rank test can fail at all), under the failing case's own
name, and the case after it as not run (tests/test_failures.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_passes():
    assert fm.total_workers() >= 1


def case_fails_on_rank_1():
    assert fm.local_rank() != 1, "deliberate assertion failure on rank 1"


def case_after_the_failure():
    print("case_after_the_failure ran", flush=True)


if __name__ == "__main__":
    run_cases(globals())
