"""The README and the documentation pages (docs/**/*.md, the site `make docs` builds): the README
is the short front door, starting with the two commands, and every top-level Python block in
any of them runs as written (in a world of one, or under mpiexec where the block is marked with
``<!-- readme-test: mpiexec -n N -->`` on the line before it). Indented blocks inside list
items are fragments. A block that appears twice (the quick start is in the README and its page)
runs once."""

import glob
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import run_mpi  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
MARK = re.compile(r"<!-- readme-test: mpiexec -n (\d+) -->")
README_MAX_LINES = 300


def python_blocks(text):
    """[(section, np or None, code)] for every unindented ```python block, in order."""
    blocks, section, lines, fenced = [], "top", text.split("\n"), False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not fenced:
            section = line.lstrip("#").strip()
        if line.startswith("```") and line != "```python":
            fenced = not fenced  # another language's block: its "# ..." lines are no headings
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


def collect():
    """{(np, code): "page: section"}, the first place each distinct block appears."""
    found = {}
    for path in PAGES:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for section, np, code in python_blocks(text):
            found.setdefault((np, code), f"{os.path.relpath(path, ROOT)}: {section}")
    return found


BLOCKS = collect()


def test_readme_starts_with_the_two_commands():
    head = open(README).read().split("\n")[:6]
    assert any(line.startswith("make demo") for line in head) and any(
        line.startswith("make test") for line in head
    )


def test_readme_is_the_short_front_door():
    # Install, launch, a quick start, the API at a glance and the headline numbers; the rest
    # is on the documentation site (docs/, mkdocs.yml).
    lines = open(README).read().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    readme_blocks = python_blocks("\n".join(lines))
    assert any(np for _, np, _ in readme_blocks), "the quick start runs under mpiexec"


def test_every_page_is_collected():
    assert len(PAGES) > 20 and len(BLOCKS) >= 10, (PAGES, list(BLOCKS.values()))


def test_ci_runs_the_readme_test_command_and_builds_the_docs():
    ci = open(os.path.join(ROOT, ".ci", "run")).read().split("\n")
    assert "make test" in ci and "make docs" in ci


@pytest.mark.parametrize(
    "where,np,code",
    [(where, np, code) for (np, code), where in BLOCKS.items()],
    ids=[
        re.sub(r"[^a-z0-9]+", "_", where.lower()).strip("_")[:70] + f"-{i}"
        for i, where in enumerate(BLOCKS.values())
    ],
)
def test_python_block_runs(where, np, code, tmp_path, zygote):
    # In a directory of its own: a block may write files (a checkpoint). A world of one runs in
    # a process forked from the session's zygote (tests/zygote.py), the others under mpiexec.
    if np is None:
        p = zygote.run(code, cwd=tmp_path, timeout=300)
        rc, out = p.returncode, p.stdout + p.stderr
    else:
        script = tmp_path / "block.py"
        script.write_text(code)
        rc, out = run_mpi(str(script), np, timeout=300, cwd=tmp_path, expect_ok=False)
    assert rc == 0, f"block in {where!r} failed on {np or 1} rank(s):\n{code}\n{out[-4000:]}"
