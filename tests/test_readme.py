"""The README: built from docs/, starts with the two commands, and every top-level Python block
in it runs as written (in a world of one, or under mpiexec where the block is marked with
``<!-- readme-test: mpiexec -n N -->``). Indented blocks inside list items are fragments."""

import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MARK = re.compile(r"<!-- readme-test: mpiexec -n (\d+) -->")


def python_blocks(text):
    """[(section, np or None, code)] for every unindented ```python block, in order."""
    blocks, section, lines = [], "top", text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if line == "```python":
            end = lines.index("```", i + 1)
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            mark = MARK.fullmatch(before.strip())
            blocks.append(
                (
                    section,
                    int(mark.group(1)) if mark else None,
                    "\n".join(lines[i + 1 : end]) + "\n",
                )
            )
            i = end
        i += 1
    return blocks


BLOCKS = python_blocks(open(README).read())


def test_readme_is_built_from_the_sections():
    rc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "docs", "build_readme.py"), "--check"]
    ).returncode
    assert rc == 0, "README.md is out of date: run python docs/build_readme.py"


def test_readme_starts_with_the_two_commands():
    head = open(README).read().split("\n")[:6]
    assert any(line.startswith("make demo") for line in head) and any(
        line.startswith("make test") for line in head
    )


def test_readme_reads_as_a_guide():
    # Short enough to read (about 100 lines per major feature area); design notes and
    # measurement details live in docs/.
    assert len(open(README).read().splitlines()) <= 700
    assert len(BLOCKS) >= 8, BLOCKS  # the examples below are really collected


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "make test" in ci


@pytest.mark.parametrize(
    "section,np,code",
    BLOCKS,
    ids=[
        f"{i}-{re.sub(r'[^a-z0-9]+', '_', s.lower()).strip('_')}"
        for i, (s, _, _) in enumerate(BLOCKS)
    ],
)
def test_readme_python_block_runs(section, np, code, tmp_path):
    # In a directory of its own: a block may write files (a checkpoint).
    script = tmp_path / "block.py"
    script.write_text(code)
    rc, out = run_mpi(str(script), np, timeout=300, cwd=tmp_path, expect_ok=False)
    assert rc == 0, (
        f"README block in {section!r} failed on {np or 1} rank(s):\n{code}\n{out[-4000:]}"
    )
