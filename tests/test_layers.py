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
