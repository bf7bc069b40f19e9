"""Tells tests/mpi_util.py which cases of each harness worker this session selected, so that
a launch runs only those (e.g. under `pytest -k case_x`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mpi_util  # noqa: E402


def pytest_collection_finish(session):
    mpi_util.select_cases(
        value
        for item in session.items
        for value in getattr(getattr(item, "callspec", None), "params", {}).values()
        if isinstance(value, mpi_util.WorkerCase)
    )
