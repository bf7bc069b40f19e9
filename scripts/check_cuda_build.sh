#!/usr/bin/env bash
# Build fluxmpi_py with CUDA and NCCL and check that it compiles, links and imports, on a
# machine that may have no GPU. CI runs it on every run (`make cuda-check`, from .ci/run).
#
#   scripts/check_cuda_build.sh            # venv (made if absent), build, link checks, tests
#   scripts/check_cuda_build.sh --no-tests # stop after the import check
#
# FLUXMPI_CUDA_TESTS: the pytest arguments of the last step (default: the CPU tests that cover
# what the CUDA build changes: the pack plan and kernels' host twin, the CUDA switch, the
# optimizer and synchronize_, whose CUDA-only branches sit in the same files).
#
# The build runs in a copy of the source tree (FLUXMPI_CUDA_WORKDIR), so the in-place CPU
# build of this checkout is never overwritten. What it proves: the CUDA sources compile with
# FLUXMPI_WITH_CUDA, _C links libnccl and the CUDA runtime, imports without a GPU, reports an
# NCCL version, and the CPU code paths pass the repo's tests in that build. What it cannot
# prove without a GPU: that the NCCL collectives move data correctly.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${FLUXMPI_CUDA_VENV:-/work/cudavenv}
WORK=${FLUXMPI_CUDA_WORKDIR:-/tmp/fluxmpi_cuda_check}
TORCH_SPEC=${FLUXMPI_CUDA_TORCH:-torch==2.14.1}   # a CUDA 13 build, on local disk here
NCCL_SPEC=${FLUXMPI_CUDA_NCCL:-nvidia-nccl-cu13}
export MAX_JOBS=${MAX_JOBS:-2}
RUN_TESTS=1
[ "${1:-}" = "--no-tests" ] && RUN_TESTS=0

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

step "venv $VENV"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
if ! "$PY" -c "import torch, nvidia.nccl, mpi4py, numpy, pytest, ninja" 2>/dev/null; then
  # torch's CUDA build and NCCL take about 5.5 GiB installed, and pip unpacks them in TMPDIR
  # first: say so before pip fails halfway with "No space left on device".
  NEED_KIB=$((8 * 1024 * 1024))
  for d in "$VENV" "${TMPDIR:-/tmp}"; do
    have=$(df -Pk "$d" | awk 'NR == 2 { print $4 }')
    [ "$have" -ge "$NEED_KIB" ] || fail "$d has $((have / 1024)) MiB free; installing $TORCH_SPEC \
and $NCCL_SPEC needs about $((NEED_KIB / 1024)) MiB there (free space, or point FLUXMPI_CUDA_VENV / \
TMPDIR elsewhere)"
  done
  "$PY" -m pip install -q --no-cache-dir "$TORCH_SPEC" "$NCCL_SPEC" numpy mpi4py pytest ninja
fi
"$PY" -c "import torch; assert torch.version.cuda, 'torch ' + torch.__version__ + ' has no CUDA'" \
  || fail "the venv's torch is a CPU build; set FLUXMPI_CUDA_TORCH to a CUDA build"
"$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPU available:', torch.cuda.is_available())"

step "CUDA toolkit"
# setup.py finds the toolkit itself (CUDA_HOME if set, else torch's guess, corrected to
# /usr/local/cuda when the guess has no headers); here we only show which nvcc that is.
NVCC=""
for d in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-*; do
  if [ -x "$d/bin/nvcc" ]; then NVCC=$d/bin/nvcc; break; fi
done
[ -n "$NVCC" ] || NVCC=$(command -v nvcc) || fail "no nvcc found; install the CUDA toolkit or set CUDA_HOME"
echo "$NVCC: $("$NVCC" --version | tail -n 1)"
# Only nvcc-compiled .cu files use this; one architecture keeps a no-GPU check short.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-8.0}

step "copy of the source tree in $WORK"
# A sync, not a copy: a file whose bytes changed is rewritten (a fresh mtime, so ninja rebuilds
# what depends on it); an unchanged one is left alone (so a second run recompiles only what
# changed); files gone from the tree go. The objects in build/ and the built .so stay.
mkdir -p "$WORK"
"$PY" - "$ROOT" "$WORK" <<'EOF'
import filecmp, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
skip = {".git", ".venv", "build", "__pycache__", ".pytest_cache"}
def kept(name):
    return name not in skip and not name.endswith((".so", ".egg-info"))
seen = set()
for root, dirs, files in os.walk(src):
    dirs[:] = [d for d in dirs if kept(d)]
    rel = os.path.relpath(root, src)
    os.makedirs(os.path.join(dst, rel), exist_ok=True)
    for f in filter(kept, files):
        a, b = os.path.join(root, f), os.path.join(dst, rel, f)
        seen.add(os.path.normpath(os.path.join(rel, f)))
        if not (os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)):
            shutil.copyfile(a, b)
            shutil.copymode(a, b)
for root, dirs, files in os.walk(dst):
    dirs[:] = [d for d in dirs if kept(d)]
    for f in filter(kept, files):
        rel = os.path.normpath(os.path.relpath(os.path.join(root, f), dst))
        if rel not in seen and not rel.endswith((".log", ".txt")):
            os.remove(os.path.join(root, f))
EOF
cd "$WORK"

step "build (log: $WORK/build.log)"
unset FLUXMPI_PY_WITH_CUDA
"$PY" setup.py build_ext --inplace > build.log 2>&1 || { tail -n 60 build.log; fail "build failed"; }
# The MPI it was built against: make's (MPICC, PyPI's Open MPI in the checkout's .venv, or
# MPI_FROM=site's mpicc on PATH), the same one whose mpiexec runs the tests below.
MPI_LINE=$(grep -m 1 "building against the MPI of" build.log) || fail "setup.py found no MPI"
ok "${MPI_LINE#fluxmpi_py: }"
# This venv's mpi4py wheel has no MPI of its own: it takes the same library (PyPI's Open MPI in
# the checkout's venv), not whichever libmpi.so.40 the system has.
MPI_BIN=$(dirname "${MPI_LINE##* }")
[ -e "$MPI_BIN/../lib/libmpi.so.40" ] && export MPI4PY_LIBMPI=$(realpath "$MPI_BIN/../lib/libmpi.so.40")
# torch writes the full compile plan to build.ninja on every build, incremental or not.
NINJA=$(ls build/temp.*/build.ninja 2>/dev/null | head -n 1)
[ -n "$NINJA" ] || fail "no build.ninja: was ninja installed in $VENV?"
grep -E "^cuda_cflags|^cflags" "$NINJA" | grep -q -- "-DFLUXMPI_WITH_CUDA=1" \
  || fail "FLUXMPI_WITH_CUDA was not defined"
ok "compiled with -DFLUXMPI_WITH_CUDA=1 ($NINJA)"
# Every CUDA-only source setup.py selects must have been compiled (.cu files by nvcc).
CUDA_SOURCES=$("$PY" - <<'EOF'
import ast, glob, os
tree = ast.parse(open("setup.py").read())
fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "sources")
ns = {"glob": glob, "os": os}
exec(compile(ast.Module(body=[fn], type_ignores=[]), "setup.py", "exec"), ns)
print("\n".join(sorted(set(ns["sources"](True)) - set(ns["sources"](False)))))
EOF
)
[ -n "$CUDA_SOURCES" ] || fail "setup.py selected no CUDA sources"
for src in $CUDA_SOURCES; do
  rule=$(grep -E "^build .*: [a-z_]+ $WORK/$src\$" "$NINJA") || fail "$src is not in the build"
  obj=${rule#build }; obj=${obj%%: *}
  [ -f "$obj" ] || fail "$src was not compiled ($obj missing)"
  if [[ $src == *.cu ]]; then
    [[ $rule == *": cuda_compile "* ]] || fail "$src is not compiled by nvcc"
    ok "nvcc compiled $src"
  else
    ok "compiled $src"
  fi
done
grep -E "(warning|error)" build.log | grep -v "^ninja" | head -n 20 || true

if ! grep -q '\.cu$' <<< "$CUDA_SOURCES"; then
  # No .cu in the build yet: show that nvcc compiles a kernel against this torch's headers with
  # the project's nvcc flags, as a future csrc/**/*.cu will be (about 1-2 minutes).
  step "nvcc probe (no .cu in the build)"
  mkdir -p nvcc_probe
  cat > nvcc_probe/probe.cu <<'EOF'
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
__global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
void launch(at::Tensor t, float a) {
  int n = static_cast<int>(t.numel());
  scale<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>(t.data_ptr<float>(), a, n);
}
EOF
  read -r -a PROBE_FLAGS <<< "$("$PY" - <<'EOF' 2>/dev/null
from torch.utils import cpp_extension as c
print(" ".join(["-I" + p for p in c.include_paths()] + c.COMMON_NVCC_FLAGS))
EOF
)"
  ARCH=${TORCH_CUDA_ARCH_LIST%%;*}; ARCH=${ARCH//./}; ARCH=${ARCH%%+*}
  "$NVCC" -c nvcc_probe/probe.cu -o nvcc_probe/probe.o -std=c++20 -O3 -Xcompiler -fPIC \
    -gencode "arch=compute_$ARCH,code=sm_$ARCH" "${PROBE_FLAGS[@]}" -I"$(dirname "$(dirname "$NVCC")")/include" \
    > nvcc_probe/log.txt 2>&1 || { tail -n 30 nvcc_probe/log.txt; fail "nvcc could not compile a kernel"; }
  ok "nvcc compiled a kernel against torch's headers with -std=c++20 for sm_$ARCH"
fi

step "link"
SO=$(ls fluxmpi_py/_C*.so)
# Like every torch extension, _C finds libtorch/libc10 through `import torch` (no rpath);
# give ldd the same directory so that only genuinely missing libraries show as not found.
TORCH_LIB=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
LD_LIBRARY_PATH=$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "$SO" > ldd.txt
grep -E "libnccl|libcudart|libc10_cuda|libtorch_cuda" ldd.txt || true
grep -q "not found" ldd.txt && { grep "not found" ldd.txt; fail "unresolved libraries"; }
grep -q "libnccl" ldd.txt || fail "_C does not link libnccl"
ok "_C links $(grep -o 'libnccl[^ ]*' ldd.txt | head -n 1) => $(awk '/libnccl/ {print $3}' ldd.txt)"
NCCL_SYMS=$(nm -D --undefined-only "$SO" | grep -oE "nccl[A-Za-z]+" | sort -u | tr '\n' ' ')
for sym in ncclAllReduce ncclBroadcast ncclReduce ncclAllGather ncclCommInitRank ncclGetUniqueId \
           ncclCommGetAsyncError ncclGetVersion; do
  [[ " $NCCL_SYMS " == *" $sym "* ]] || fail "_C does not reference $sym"
done
ok "NCCL symbols used: $NCCL_SYMS"
# The fused-bucket kernels (csrc/cuda/pack_kernels.cu): device code in _C (.nv_fatbin), the
# host side of each kernel instantiation (one per dtype pair) and the launcher linked in.
# (to files first: `nm | grep -q` fails under pipefail when grep stops reading early.)
nm "$SO" > nm.txt
readelf -S "$SO" > sections.txt
grep -q "\.nv_fatbin" sections.txt || fail "_C holds no device code (.nv_fatbin)"
KERNELS=$(grep -E " [Tt] .*copy_spans_kernel" nm.txt | grep -vc "\.cold" || true)
[ "$KERNELS" -gt 0 ] || fail "_C holds no copy_spans_kernel (csrc/cuda/pack_kernels.cu)"
grep -qE " T .*launch_copy_spans" nm.txt || fail "_C does not define launch_copy_spans"
ok "pack kernels linked: device code, launch_copy_spans, $KERNELS copy_spans_kernel instantiations"

step "import without a GPU"
cd /  # import the copy's package, not whatever sits in the caller's directory
PYTHONPATH=$WORK "$PY" - <<'EOF'
import torch
import fluxmpi_py as fm
info = fm.build_info()
print(info)
assert info["compiled_with_cuda"] is True, info
assert info["nccl"], info
fm.Init()
t = torch.arange(4.0)
fm.allreduce_(t, "sum")  # the CPU path of the CUDA build, world of one
assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
print("GPU available:", torch.cuda.is_available(), "- NCCL collectives not exercised here")
EOF
ok "imports; build_info reports CUDA and NCCL"

if [ "$RUN_TESTS" = 1 ]; then
  step "the repo's tests with the CUDA build (CPU paths)"
  cd "$WORK"
  read -r -a TESTS <<< "${FLUXMPI_CUDA_TESTS:-tests/test_pack.py tests/test_cuda_switch.py tests/test_optimizer.py tests/test_sync.py tests/test_stub.py}"
  PYTHONPATH=$WORK "$PY" -m pytest -q "${TESTS[@]}"
fi
step "CUDA build check passed (built and linked; nothing ran on a GPU)"
