#!/usr/bin/env bash
# The package against a second torch release (`make test-torch2`): a venv with that torch
# (build/torch2-venv, reused), the extension built for CPU in a copy of the tree
# (build/torch2-tree, its objects kept for the next run), then the tests of what touches
# torch's extension points: the c10d backend and its groups, the collectives, the optimizer,
# the data loaders, and the scan for patches of torch. The pinned torch (requirements-dev.txt)
# is what `make test` runs; this one is torch 2.14.1, the other release on local disk here (a
# CUDA 13 build: it runs on a machine without a GPU, and the extension is built for CPU).
#
# FLUXMPI_TORCH2: the pip requirement of the second torch (default torch==2.14.1)
# FLUXMPI_TORCH2_TESTS: the pytest arguments (default: the files named below)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${FLUXMPI_TORCH2_VENV:-$ROOT/build/torch2-venv}
WORK=${FLUXMPI_TORCH2_WORKDIR:-$ROOT/build/torch2-tree}
TORCH_SPEC=${FLUXMPI_TORCH2:-torch==2.14.1}
TESTS=${FLUXMPI_TORCH2_TESTS:-tests/test_no_torch_patches.py tests/test_c10d.py \
tests/test_collectives.py tests/test_optimizer.py tests/test_data.py}
export MAX_JOBS=${MAX_JOBS:-2} FLUXMPI_PY_WITH_CUDA=0

step() { printf '\n== %s\n' "$*"; }

step "venv $VENV with $TORCH_SPEC"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY=$VENV/bin/python
want=${TORCH_SPEC#torch==}
if ! "$PY" -c "import torch, mpi4py, numpy, pytest, ninja; assert torch.__version__.split('+')[0] == '$want'" 2>/dev/null; then
  "$PY" -m pip install -q "$TORCH_SPEC" mpi4py==4.1.2 numpy pytest ninja
fi
"$PY" -c "import torch; print('torch', torch.__version__)"

step "copy of the source tree in $WORK"
# tracked and new files, as git sees them; a file whose bytes are unchanged keeps its mtime,
# so that ninja rebuilds only what changed
mkdir -p "$WORK"
(cd "$ROOT" && git ls-files -co --exclude-standard -z) | "$PY" -c '
import filecmp, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
for rel in sys.stdin.buffer.read().decode().split("\0"):
    a, b = os.path.join(src, rel), os.path.join(dst, rel)
    if not rel or not os.path.isfile(a):
        continue
    os.makedirs(os.path.dirname(b), exist_ok=True)
    if not (os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)):
        shutil.copyfile(a, b)
        shutil.copymode(a, b)
' "$ROOT" "$WORK"
cd "$WORK"

# -O0 instead of setup.py's -O3: this build checks torch's API, not speed, and -O0 compiles
# faster on these 2 cores (FLUXMPI_TORCH2_OPT=-O3 builds as `make build` does)
OPT=${FLUXMPI_TORCH2_OPT:--O0}
sed -i "s/cxx_flags = \[\"-O3\"/cxx_flags = [\"$OPT\"/" setup.py
grep -q "cxx_flags = \[\"$OPT\"" setup.py || { echo "setup.py: no cxx_flags = [\"-O3\" to replace"; exit 1; }

step "build for CPU against torch $("$PY" -c 'import torch; print(torch.__version__)') (log: $WORK/build.log)"
"$PY" setup.py build_ext --inplace > build.log 2>&1 || { tail -n 60 build.log; exit 1; }

step "tests: $TESTS"
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 "$PY" -m pytest -q -p no:cacheprovider $TESTS
