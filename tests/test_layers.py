"""csrc/ keeps its layers (python > ops > fusion | backend > runtime): scripts/check_layers.py
passes on the tree and fails on a copy given an upward include, a sibling include or a cycle."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "check_layers.py")


def check(csrc):
    proc = subprocess.run(
        [sys.executable, SCRIPT, csrc], capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_csrc_follows_the_layers():
    rc, out = check(os.path.join(ROOT, "csrc"))
    assert rc == 0, out


@pytest.mark.parametrize(
    "path, line, fault",
    [
        # the two faults this checker was written for, put back
        (
            "runtime/environment.cpp",
            '#include "backend/nccl_backend.h"',
            'runtime/environment.cpp:1: includes "backend/nccl_backend.h": layer runtime may not '
            "include layer backend",
        ),
        (
            "fusion/broadcast_plan.h",
            '#include "ops/coalesced_broadcast.h"',
            "layer fusion may not include layer ops",
        ),
        (
            "fusion/bucket_plan.cpp",
            '#include "backend/backend.h"',
            "layer fusion may not include layer backend",
        ),
        (
            "ops/flat_storage.h",
            '#include "ops/sync_fast_path.h"',
            "ops/flat_storage -> ops/sync_fast_path -> ops/coalesced_broadcast",
        ),
        ("ops/shard.cpp", '#include "ops/no_such_file.h"', "which is not in csrc/"),
    ],
)
def test_checker_fails_on_a_bad_include(tmp_path, path, line, fault):
    csrc = tmp_path / "csrc"
    shutil.copytree(os.path.join(ROOT, "csrc"), csrc)
    f = csrc / path
    f.write_text(line + "\n" + f.read_text())
    rc, out = check(str(csrc))
    assert rc == 1 and fault in out, out


def test_checker_fails_on_a_file_outside_the_layers(tmp_path):
    csrc = tmp_path / "csrc"
    shutil.copytree(os.path.join(ROOT, "csrc"), csrc)
    (csrc / "bindings.cpp").write_text('#include "ops/collectives.h"\n')
    rc, out = check(str(csrc))
    assert rc == 1 and "bindings.cpp: outside every layer" in out, out


# --- the Python package: scripts/check_py_layers.py -------------------------------------------
PY_SCRIPT = os.path.join(ROOT, "scripts", "check_py_layers.py")


def check_package(package):
    proc = subprocess.run(
        [sys.executable, PY_SCRIPT, package], capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_package_follows_the_layers():
    rc, out = check_package(os.path.join(ROOT, "fluxmpi_py"))
    assert rc == 0, out


@pytest.mark.parametrize(
    "path, line, fault",
    [
        # an upward import, and the sibling rule
        (
            "runtime/groups.py",
            "from ..training import optimizer",
            "runtime/groups.py:1: imports fluxmpi_py.training.optimizer: layer runtime may not "
            "import layer training",
        ),
        ("sync/_walk.py", "from ..data import sampler", "layer sync may not import layer data"),
        # the circle the package had (optimizer <-> join), put back at the top
        (
            "training/join.py",
            "from .optimizer import DistributedOptimizer",
            "fluxmpi_py.training.join -> fluxmpi_py.training.optimizer",
        ),
        # the same import hidden inside a function is reported as such
        (
            "training/join.py",
            "def _late():\n    from .optimizer import DistributedOptimizer",
            "imports fluxmpi_py.training.optimizer inside a function",
        ),
        # the compiled core through anything but _core
        ("collectives/inplace.py", "from .. import _C", "imports _C; only _core.py may"),
        ("training/optimizer.py", "import fluxmpi_py._C as C", "imports _C; only _core.py may"),
        # integrations on the private side of the layers below: _core, an underscore module,
        # an underscore name (the faults of issue 32, put back)
        (
            "integrations/horovod/_ops.py",
            "from ..._core import C as _C",
            "integrations/horovod/_ops.py:1: imports fluxmpi_py._core.C: integrations build on "
            "the public API",
        ),
        ("integrations/c10d.py", "import fluxmpi_py._core", "c10d.py:1: imports fluxmpi_py._core:"),
        (
            "integrations/horovod/_gradients.py",
            "from ...training import _reduction_plan as plan",
            "imports fluxmpi_py.training._reduction_plan: integrations build on the public API",
        ),
        (
            "integrations/horovod/_topology.py",
            "from ...runtime.world import local_rank, _comm_handle",
            "_topology.py:1: imports fluxmpi_py.runtime.world._comm_handle: integrations",
        ),
        (
            "integrations/horovod/_extras.py",
            "import fluxmpi_py as fm\nC = fm._core.C",
            "_extras.py:2: reads fluxmpi_py._core: integrations build on the public API",
        ),
    ],
)
def test_package_checker_fails_on_a_bad_import(tmp_path, path, line, fault):
    package = tmp_path / "fluxmpi_py"
    shutil.copytree(
        os.path.join(ROOT, "fluxmpi_py"),
        package,
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    f = package / path
    f.write_text(line + "\n" + f.read_text())
    rc, out = check_package(str(package))
    assert rc == 1 and fault in out, out


def test_package_checker_fails_on_a_module_outside_the_layers(tmp_path):
    package = tmp_path / "fluxmpi_py"
    shutil.copytree(
        os.path.join(ROOT, "fluxmpi_py"),
        package,
        ignore=shutil.ignore_patterns("*.so", "__pycache__"),
    )
    (package / "helpers.py").write_text("from ._core import C\n")
    rc, out = check_package(str(package))
    assert rc == 1 and "helpers.py: outside every layer" in out, out


def _reexported(init_path):
    """(modules star-imported, modules whose __all__ is added to the package's) by an
    __init__.py: each public module's names are written once, in its own __all__."""
    import ast

    tree = ast.parse(open(init_path, encoding="utf-8").read())
    aliases = {
        a.asname or a.name: a.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module is None
        for a in n.names
    }
    starred = [
        n.module
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.level == 1 and n.names[0].name == "*"
    ]
    added = [
        aliases.get(e.value.value.id, e.value.value.id)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"]
        for e in n.value.elts
        if isinstance(e, ast.Starred)
        and isinstance(e.value, ast.Attribute)
        and e.value.attr == "__all__"
        and isinstance(e.value.value, ast.Name)
    ]
    return starred, added


def test_the_face_exports_every_public_module_name():
    # fm.X for every name a public module lists in __all__, the same object, and nothing else:
    # each package's __init__ star-imports its public modules and builds its own __all__ from
    # the same modules' __all__, and the package's face does so with the five layers.
    import importlib

    import fluxmpi_py as fm

    layers, added = _reexported(os.path.join(ROOT, "fluxmpi_py", "__init__.py"))
    assert sorted(layers) == sorted(added) == sorted(LAYER_PACKAGES), (layers, added)
    expected = {}
    for pkg in added:  # in the face's order
        mods, listed = _reexported(os.path.join(ROOT, "fluxmpi_py", pkg, "__init__.py"))
        assert sorted(mods) == sorted(listed) and len(set(listed)) == len(listed), (pkg, mods)
        for m in listed:
            mod = importlib.import_module(f"fluxmpi_py.{pkg}.{m}")
            for name in mod.__all__:
                assert name not in expected, f"{name} is exported twice"
                expected[name] = getattr(mod, name)
    assert fm.__all__ == list(expected), set(fm.__all__) ^ set(expected)
    assert [n for n, obj in expected.items() if getattr(fm, n) is not obj] == []


LAYER_PACKAGES = ["runtime", "collectives", "training", "sync", "data"]


def test_the_face_check_fails_on_a_module_left_out_of_all(tmp_path):
    # a module star-imported but not added to __all__ (or the other way round) is caught
    init = tmp_path / "__init__.py"
    init.write_text(
        "import typing as _typing\nfrom . import a as _a\nfrom . import b as _b\n"
        "from .a import *\nfrom .b import *\n"
        "if not _typing.TYPE_CHECKING:\n    __all__ = [*_a.__all__]\n"
    )
    mods, listed = _reexported(str(init))
    assert sorted(mods) == ["a", "b"] and listed == ["a"]


# --- the suite: scripts/check_py_layers.py --tests --------------------------------------------


def check_suite(tests):
    proc = subprocess.run(
        [sys.executable, PY_SCRIPT, "--tests", tests], capture_output=True, text=True, timeout=60
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_the_suite_follows_its_layers_without_a_circle():
    rc, out = check_suite(os.path.join(ROOT, "tests"))
    assert rc == 0, out


@pytest.mark.parametrize(
    "path, line, fault",
    [
        # the circle this check was written for (mpi_util <-> the fork server's pytest side)
        ("forks.py", "import mpi_util", "import cycle: tests/forks.py -> tests/mpi_util.py"),
        ("virtual_hosts.py", "import slurm_cluster", "tests/slurm_cluster.py -> tests/virtual"),
        ("mpi_util.py", "def f():\n    import stop_runs", "imports tests/stop_runs.py inside"),
        ("stop_runs.py", "import test_stop", "helpers may not import tests"),
        ("workers/harness.py", "import mpi_util", "workers may not import helpers"),
    ],
)
def test_suite_checker_fails_on_a_bad_import(tmp_path, path, line, fault):
    tests = tmp_path / "tests"
    shutil.copytree(
        os.path.join(ROOT, "tests"), tests, ignore=shutil.ignore_patterns("__pycache__")
    )
    f = tests / path
    f.write_text(line + "\n" + f.read_text())
    rc, out = check_suite(str(tests))
    assert rc == 1 and fault in out, out
