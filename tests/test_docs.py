"""The README and the documentation pages (docs/**/*.md, the site `make docs` builds): the README
is the short front door, starting with the two commands, and every top-level Python block in
any of them runs as written (in a world of one, or under mpiexec where the block is marked with
``<!-- readme-test: mpiexec -n N -->`` on the line before it; the blocks of one N share one
launch, tests/workers/doc_blocks_worker.py). Indented blocks inside list items are fragments. A
block that appears twice (the quick start is in the README and its page) runs once."""

import glob
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import launch_worker  # noqa: E402

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
CASES = {key: f"case_block_{i}" for i, key in enumerate(BLOCKS)}  # a block's name in its launch


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


@pytest.fixture(scope="module")
def mpi_blocks(request, tmp_path_factory):
    """launch(np): one mpiexec launch (once per world size) that runs this session's selected
    blocks of that world size, each as a harness case in a directory of its own."""

    def launch(np):
        selected = [
            (item.callspec.params["np"], item.callspec.params["code"])
            for item in request.session.items
            if getattr(item, "originalname", None) == "test_python_block_runs"
            and item.module is request.module
        ]
        root = tmp_path_factory.mktemp(f"doc-blocks-np{np}")
        plan = []
        for key in [key for key in BLOCKS if key in selected and key[0] == np]:
            directory = root / CASES[key]
            directory.mkdir()
            (directory / "block.py").write_text(key[1])
            plan.append((CASES[key], str(directory)))
        (root / "plan.json").write_text(json.dumps(plan))
        env = {"DOC_BLOCKS": str(root / "plan.json")}
        return launch_worker("doc_blocks_worker.py", np, timeout=300 * len(plan), env=env)

    launches = {}
    return lambda np: launches[np] if np in launches else launches.setdefault(np, launch(np))


@pytest.mark.parametrize(
    "where,np,code",
    [(where, np, code) for (np, code), where in BLOCKS.items()],
    ids=[
        re.sub(r"[^a-z0-9]+", "_", where.lower()).strip("_")[:70] + f"-{i}"
        for i, where in enumerate(BLOCKS.values())
    ],
)
def test_python_block_runs(where, np, code, tmp_path, forked, mpi_blocks):
    # In a directory of its own: a block may write files (a checkpoint). A world of one runs in
    # a process forked from the suite's fork server (tests/forks.py), the others under mpiexec,
    # in one launch per world size (its own directory still, and its own record).
    if np is not None:
        launch = mpi_blocks(np)
        try:
            launch.check_case(CASES[(np, code)])
            failure = None
        except pytest.fail.Exception as e:
            failure = str(e)
        if failure is not None:
            pytest.fail(
                f"block in {where!r} failed on {np} ranks:\n{code}\n{failure}", pytrace=False
            )
        # it passed; unless another block's failure ended the job (its own item says so), the
        # job must also have exited 0 in time
        failed = [r for r in launch.records if r["status"] == "failed"]
        assert failed or (launch.rc == 0 and not launch.timed_out), (
            f"the blocks on {np} ranks passed, but the job exited {launch.rc} (timed out: "
            f"{launch.timed_out}):\n{launch.output[-4000:]}"
        )
        return
    p = forked.run(code, cwd=tmp_path, timeout=300)
    rc, out = p.returncode, p.stdout + p.stderr
    assert rc == 0, f"block in {where!r} failed on 1 rank:\n{code}\n{out[-4000:]}"
