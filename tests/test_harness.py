"""The multi-rank harness itself: every worker is launched by some test, and the case names
pytest collects are the ones the harness runs."""

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import WORKERS, worker_cases, worker_params  # noqa: E402

TESTS = os.path.dirname(__file__)


def test_every_harness_worker_is_launched_by_a_test():
    tests = "".join(
        open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(TESTS, "test_*.py"))
    )
    workers = [
        p
        for p in glob.glob(os.path.join(WORKERS, "*_worker.py"))
        if "run_cases(" in open(p, encoding="utf-8").read()
    ]
    assert workers
    unlaunched = [os.path.basename(p) for p in workers if f'"{os.path.basename(p)}"' not in tests]
    assert not unlaunched, f"no test launches {unlaunched}: parametrize one with worker_params"


def test_case_names_come_from_the_source_in_definition_order(tmp_path):
    worker = tmp_path / "w_worker.py"
    worker.write_text(
        "def case_b():\n    pass\n\n\ndef helper():\n    pass\n\n\n"
        "def case_a():\n    pass\n\n\ndef case_b():  # redefined: keeps its place\n"
        "    pass\n\n\nif True:\n    def case_nested():\n        pass\n"
    )
    assert worker_cases(str(worker)) == ["case_b", "case_a"]


def test_a_case_only_at_some_world_sizes_gets_tests_at_those_alone(tmp_path):
    worker = tmp_path / "w_worker.py"
    worker.write_text(
        "from harness import only_at\n\n\ndef case_a():\n    pass\n\n\n"
        "@only_at(2, 3)\ndef case_b():\n    pass\n\n\n@harness.only_at(1)\ndef case_c():\n"
        "    pass\n"
    )
    assert worker_cases(str(worker)) == ["case_a", "case_b", "case_c"]
    assert worker_cases(str(worker), None) == ["case_a", "case_c"]  # no mpiexec: a world of 1
    assert worker_cases(str(worker), 2) == ["case_a", "case_b"]
    assert worker_cases(str(worker), 4) == ["case_a"]
    ids = [p.id for p in worker_params(str(worker), [1, 3])]
    assert ids == ["np=1-case_a", "np=1-case_c", "np=1-clean_exit", "np=3-case_a", "np=3-case_b",
                   "np=3-clean_exit"]  # fmt: skip
