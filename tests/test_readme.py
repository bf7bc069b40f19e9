import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_is_built_from_the_sections():
    rc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "docs", "build_readme.py"), "--check"]
    ).returncode
    assert rc == 0, "README.md is out of date: run python docs/build_readme.py"


def test_readme_starts_with_the_two_commands():
    head = open(os.path.join(ROOT, "README.md")).read().split("\n")[:6]
    assert any(line.startswith("make demo") for line in head) and any(
        line.startswith("make test") for line in head
    )


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "make test" in ci
