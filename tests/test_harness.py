"""The multi-rank harness itself: every worker is launched by some test, and the case names
pytest collects are the ones the harness runs."""

import ast
import glob
import os
import sys

import pytest

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


def test_a_features_workers_share_its_ids(tmp_path):
    # a feature's cases split over several workers keep the ids they had in one
    a, b = tmp_path / "a_worker.py", tmp_path / "b_worker.py"
    a.write_text("def case_x():\n    pass\n")
    b.write_text("def case_y():\n    pass\n")
    ids = [p.id for p in worker_params([str(a), str(b)], [None, 2])]
    assert ids == [
        "case_x",
        "clean_exit",
        "case_y",
        "clean_exit-b_worker",
        "np=2-case_x",
        "np=2-clean_exit",
        "np=2-case_y",
        "np=2-clean_exit-b_worker",
    ]
    b.write_text("def case_x():\n    pass\n")  # the same name twice: the ids would clash
    with pytest.raises(ValueError, match="case_x: defined in more than one"):
        worker_params([str(a), str(b)], [2])


def test_no_worker_outgrows_one_feature():
    # a worker past ~400 lines holds a second feature: split it, and list both in the test's
    # worker_params (ids stay as they were)
    long = {
        os.path.basename(p): n
        for p in glob.glob(os.path.join(WORKERS, "*.py"))
        if (n := len(open(p, encoding="utf-8").read().splitlines())) > 450
    }
    assert not long, long


def _top_names(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def test_what_a_worker_takes_from_another_is_there():
    # a worker imports helpers and cases from its feature's other workers; a split that moves
    # one away shows here, not in a bundled launch that fails before its first case
    paths = {os.path.basename(p)[:-3]: p for p in glob.glob(os.path.join(WORKERS, "*.py"))}
    defined = {m: _top_names(p) for m, p in paths.items()}
    missing = []
    for m, p in paths.items():
        for n in ast.walk(ast.parse(open(p, encoding="utf-8").read())):
            if isinstance(n, ast.ImportFrom) and n.module in defined:
                missing += [
                    f"{m}: {n.module}.{a.name}" for a in n.names if a.name not in defined[n.module]
                ]
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                if n.value.id in defined and n.value.id != m and n.attr not in defined[n.value.id]:
                    missing.append(f"{m}: {n.value.id}.{n.attr}")
    assert not missing, missing
