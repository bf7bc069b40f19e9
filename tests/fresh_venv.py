"""Fresh virtual environments that see this environment's torch, for install tests.

A new venv gets a ``.pth`` file naming this interpreter's site-packages, so torch (and its
dependencies) import without a second multi-GB install. Only directories are added that way:
the ``.pth`` files inside them (among them the editable install of fluxmpi_py) are not run, so
fluxmpi_py imports in the new venv only once something installs it there.
"""

import os
import shutil
import site
import subprocess
import sys

from mpi_util import ROOT

# What a copy of the source tree leaves out: build products and environments.
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.so", "*.egg-info", "__pycache__")


def make_venv(path):
    """Create a venv at `path` that imports this environment's torch; return its python."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    py = os.path.join(str(path), "bin", "python")
    theirs = subprocess.run(
        [py, "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    with open(os.path.join(theirs, "same_torch.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    return py


def copy_source(dest):
    """A clean copy of the source tree (no build products) at `dest`; return its path."""
    shutil.copytree(ROOT, dest, ignore=SKIP)
    return str(dest)


def run(args, cwd, env=None, timeout=600):
    """Run `args`; return (exit code, stdout+stderr)."""
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def clean_env(**extra):
    """This environment without the variables that would point a child at this tree."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PEP517_BUILD_BACKEND", "PYTHONNOUSERSITE", "VIRTUAL_ENV")
    }
    env.update(extra)
    return env
