"""First contact: what an import or a build says when it cannot work, and the declared extras.

Each case runs in a fresh Python: a copy of the package laid out as a clone (a source tree
without the compiled core) or as an installed copy, in a temporary directory.
"""

import glob
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT  # noqa: E402

PACKAGE = os.path.join(ROOT, "fluxmpi_py")
# Drops setuptools' editable-install hook, so that only the copies a test lays out are found.
NO_EDITABLE = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if '__editable__' not in getattr(f, '__module__', '')]; "
)


def clean_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PEP517_BUILD_BACKEND", "PYTHONNOUSERSITE")
    }
    env.update(extra)
    return env


def python(args, cwd, **env):
    p = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    return p.returncode, p.stdout + p.stderr


def make_clone(root, with_core=None):
    """A clone's layout: setup.py, csrc/ and the package's Python files; `with_core` is a
    file to place as its compiled core."""
    os.makedirs(os.path.join(root, "csrc"))
    open(os.path.join(root, "setup.py"), "w").close()
    pkg = os.path.join(root, "fluxmpi_py")
    os.makedirs(pkg)
    copy_python_tree(pkg)
    if with_core:
        shutil.copy(with_core, os.path.join(pkg, os.path.basename(real_core())))
    return pkg


def copy_python_tree(pkg):
    """The package's Python files, its sub-packages included, and nothing compiled."""
    for f in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        dest = os.path.join(pkg, os.path.relpath(f, PACKAGE))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy(f, dest)


def real_core():
    found = glob.glob(os.path.join(PACKAGE, "_C.*.so"))
    if not found:
        pytest.fail("fluxmpi_py/_C is not built: run `make build`")
    return found[0]


def make_installed(site):
    pkg = os.path.join(site, "fluxmpi_py")
    os.makedirs(pkg)
    copy_python_tree(pkg)
    shutil.copy(real_core(), pkg)
    return pkg


def test_source_tree_hiding_the_installed_package_names_both(tmp_path):
    clone, site = str(tmp_path / "clone"), str(tmp_path / "site")
    src = make_clone(clone)
    installed = make_installed(site)
    rc, out = python(["-c", NO_EDITABLE + "import fluxmpi_py"], cwd=clone, PYTHONPATH=site)
    assert rc != 0
    assert f"imported from the source tree at {src}, which has no compiled core" in out, out
    assert f"installed package at {installed} is hidden by it" in out, out
    assert "the current directory is the clone's root" in out, out
    assert "run from another directory" in out and "--no-build-isolation -e ." in out, out
    assert "circular import" not in out, out
    # The same from a script in the clone's root, run from elsewhere: sys.path[0] is the clone.
    with open(os.path.join(clone, "train.py"), "w") as f:
        f.write(NO_EDITABLE + "import fluxmpi_py\n")
    rc, out = python([os.path.join(clone, "train.py")], cwd=str(tmp_path), PYTHONPATH=site)
    assert rc != 0 and f"installed package at {installed} is hidden" in out, out
    assert f"the script's directory, {clone} (sys.path[0]), is the clone's root" in out, out
    # Run from elsewhere, the installed package imports.
    rc, out = python(
        ["-c", NO_EDITABLE + "import fluxmpi_py; print(fluxmpi_py.__file__)"],
        cwd=str(tmp_path),
        PYTHONPATH=site,
    )
    assert rc == 0 and installed in out, out


def test_source_tree_without_any_compiled_core_says_build_it(tmp_path):
    clone = str(tmp_path / "clone")
    src = make_clone(clone)
    rc, out = python(["-c", NO_EDITABLE + "import fluxmpi_py"], cwd=clone)
    assert rc != 0
    assert f"source tree at {src}, which has no compiled core (_C), and no installed" in out, out
    assert f"`pip install --no-build-isolation -e .` in {clone}" in out, out
    assert "circular import" not in out, out


def test_compiled_core_that_does_not_load_says_rebuild_against_this_torch(tmp_path):
    # A core that needs a symbol this torch lacks, as one built against another torch does.
    c_file = tmp_path / "core.c"
    c_file.write_text(
        "void c10_symbol_of_another_torch(void);\n"
        "void *PyInit__C(void) { c10_symbol_of_another_torch(); return 0; }\n"
    )
    so = str(tmp_path / "core.so")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to make a stand-in core")
    subprocess.run([cc, "-shared", "-fPIC", "-o", so, str(c_file)], check=True)
    clone = str(tmp_path / "clone")
    src = make_clone(clone, with_core=so)
    rc, out = python(["-c", NO_EDITABLE + "import fluxmpi_py"], cwd=clone)
    assert rc != 0
    assert f"compiled core {src}/_C" in out and "does not load with the torch in this" in out, out
    assert "undefined symbol: c10_symbol_of_another_torch" in out, out
    assert "compiled against another torch" in out and "--no-build-isolation -e ." in out, out


def fake_build_env(tmp_path, dirname):
    """A PYTHONPATH dir whose sitecustomize hides torch, as a build's isolated environment
    does (pip's puts its own site dir there, under pip-build-env-*)."""
    site = tmp_path / dirname / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoTorch:\n"
        "    @staticmethod\n"
        "    def find_spec(name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'torch'\")\n"
        "sys.meta_path.insert(0, _NoTorch)\n"
    )
    return str(site)


@pytest.mark.parametrize("how", ["pip_build_env", "pep517_frontend"])
def test_isolated_build_says_use_no_build_isolation(tmp_path, how):
    if how == "pip_build_env":
        env = dict(PYTHONPATH=fake_build_env(tmp_path, "pip-build-env-x1y2"), PYTHONNOUSERSITE="1")
    else:  # any PEP 517 frontend; torch importable by this interpreter outside the isolation
        env = dict(
            PYTHONPATH=fake_build_env(tmp_path, "isolated"),
            PEP517_BUILD_BACKEND="setuptools.build_meta",
        )
    rc, out = python([os.path.join(ROOT, "setup.py"), "--name"], cwd=ROOT, **env)
    assert rc != 0
    assert "pip is building in an isolated environment that lacks torch" in out, out
    assert "pip install --no-build-isolation ." in out, out
    assert "torch is not installed" not in out, out


def test_missing_torch_outside_a_build_frontend_says_install_it(tmp_path):
    env = dict(PYTHONPATH=fake_build_env(tmp_path, "plain"))
    rc, out = python([os.path.join(ROOT, "setup.py"), "--name"], cwd=ROOT, **env)
    assert rc != 0 and "torch is not installed in this environment" in out, out


def test_examples_extra_declares_what_the_examples_import():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert {"scikit-learn", "tqdm", "matplotlib"} <= set(extras["examples"]), extras
    assert "pytest" in extras["test"], extras
    # ...and the Install section names the extra.
    with open(os.path.join(ROOT, "docs", "sections", "10-install.md")) as f:
        install = f.read().split("## Launch")[0]
    assert '".[examples]"' in install and "scikit-learn" in install and "tqdm" in install


def test_build_progress_shows_one_line_per_compiled_file():
    # What `make build` shows of a build: ninja's verbose steps (indented, as pip -v shows
    # them) become one short line each; errors pass through; a failure shows the full tail.
    fake_build = (
        "import sys\n"
        "print('  fluxmpi_py: compiling 2 sources of fluxmpi_py._C against torch X')\n"
        "print('  [1/2] c++ -MMD -MF /b/a.o.d -I/x/csrc ' + '-Dflag ' * 400 + "
        "'-c -c /x/csrc/ops/a.cpp -o /b/a.o')\n"
        "print('  [2/2] c++ -c -c /x/csrc/runtime/b.cpp -o /b/b.o')\n"
        "print('/x/csrc/runtime/b.cpp:3:1: error: expected declaration')\n"
        "sys.exit(1)\n"
    )
    p = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "scripts", "build_progress.py"),
            "--",
            sys.executable,
            "-c",
            fake_build,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = p.stdout
    assert p.returncode == 1, out
    assert "fluxmpi_py: compiling 2 sources" in out, out
    assert (
        "[1/2] compiling csrc/ops/a.cpp" in out and "[2/2] compiling csrc/runtime/b.cpp" in out
    ), out
    assert "error: expected declaration" in out and "build failed (exit 1)" in out, out
    assert max(len(line) for line in out.split("build failed")[0].splitlines()) < 200, out
