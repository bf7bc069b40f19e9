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


def test_the_face_exports_every_public_module_name():
    # fm.X for every name a public module lists in __all__, the same object, and nothing else
    # (scripts/gen_reexports.py writes the re-export blocks).
    import importlib

    import fluxmpi_py as fm

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gen_reexports import LAYOUT

    expected = {}
    for pkg, mods in LAYOUT.items():
        for m in mods:
            mod = importlib.import_module(f"fluxmpi_py.{pkg}.{m}")
            for name in mod.__all__:
                expected[name] = getattr(mod, name)
    assert sorted(fm.__all__) == sorted(expected), set(fm.__all__) ^ set(expected)
    assert [n for n, obj in expected.items() if getattr(fm, n) is not obj] == []
