#!/usr/bin/env bash
# Run Horovod's own torch test suite against fluxmpi_py.horovod.
#
#   scripts/horovod_suite.sh HOROVOD_CHECKOUT [NP ...]      (default NP: 2)
#
# A shim package made in a temporary directory turns `import horovod.torch as hvd` into
# fluxmpi_py.horovod; every rank runs the same pytest session (same tests, same order) and
# writes its own log and JUnit file. Prints, per world size, rank 0's pytest summary and the
# tests that failed on any rank. Horovod's code is only read from the checkout given.
# Environment: PYTHON (default: .venv/bin/python, else python3); TIMEOUT (seconds per
# mpiexec: default 1200, or 120 per test with ISOLATE=1); ISOLATE=1 runs one mpiexec per test
# (slow: a test that leaves the ranks out of step cannot derail the ones after it); SUITE
# (default test/parallel/test_torch.py); PYTEST_ARGS (extra pytest arguments, e.g.
# "-k allreduce"; split at spaces); KEEP=1 keeps the temporary directory (its path is printed); FLUXMPI_PY_ROOT
# (the directory holding the fluxmpi_py package to test; default: this checkout).
set -euo pipefail

if [[ $# -lt 1 || ! -d "$1" ]]; then
    echo "usage: $0 HOROVOD_CHECKOUT [NP ...]" >&2
    exit 2
fi
checkout=$(cd "$1" && pwd)
shift
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2)
repo=$(cd "$(dirname "$0")/.." && pwd)
suite="$checkout/${SUITE:-test/parallel/test_torch.py}"
[[ -f "$suite" ]] || { echo "$suite: not found" >&2; exit 2; }
python=${PYTHON:-}
if [[ -z "$python" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
mpiexec=$(command -v mpiexec || echo "$(dirname "$python")/mpiexec")

work=$(mktemp -d)
[[ "${KEEP:-0}" == 1 ]] && echo "work directory: $work" || trap 'rm -rf "$work"' EXIT

# The shim: horovod.torch is fluxmpi_py.horovod. Horovod's test/utils/common.py also imports
# horovod.runner.util.threads, mock and cloudpickle; stand-ins are added where missing.
mkdir -p "$work/shim/horovod/torch" "$work/shim/horovod/runner/util"
cat > "$work/shim/horovod/__init__.py" <<'EOF'
"""Shim made by fluxmpi_py's scripts/horovod_suite.sh: horovod.torch is fluxmpi_py.horovod."""
EOF
cat > "$work/shim/horovod/torch/__init__.py" <<'EOF'
from fluxmpi_py.horovod import *  # noqa: F401,F403
from fluxmpi_py.horovod import __all__  # noqa: F401
EOF
touch "$work/shim/horovod/runner/__init__.py" "$work/shim/horovod/runner/util/__init__.py"
cat > "$work/shim/horovod/runner/util/threads.py" <<'EOF'
import threading


def in_thread(target, args=(), daemon=True, silent=False):
    t = threading.Thread(target=target, args=args, daemon=daemon)
    t.start()
    return t
EOF
# A pytest plugin of the shim adapts the suite to newer Pythons and torch: Python 3.11
# removed inspect.getargspec (given back as getfullargspec), and the optimizers the suite
# loops over (torch.optim.Optimizer.__subclasses__()) now include Muon, which takes only 2-D
# parameters (the suite's models have biases): it is left out of that list.
cat > "$work/shim/hvd_suite_compat.py" <<'EOF'
import inspect

import torch

if not hasattr(inspect, "getargspec"):
    inspect.getargspec = inspect.getfullargspec
_subclasses = torch.optim.Optimizer.__subclasses__
torch.optim.Optimizer.__subclasses__ = staticmethod(
    lambda: [c for c in _subclasses() if c.__name__ != "Muon"]
)
EOF
"$python" -c "import mock" 2>/dev/null || echo "from unittest.mock import *  # noqa" > "$work/shim/mock.py"
"$python" -c "import cloudpickle" 2>/dev/null || echo "from pickle import dumps, loads  # noqa" > "$work/shim/cloudpickle.py"

export PYTHONPATH="$work/shim:${FLUXMPI_PY_ROOT:-$repo}${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ $(id -u) == 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# One mpiexec for the whole file; ISOLATE=1: one per test (a test that leaves the ranks out
# of step, e.g. by failing on some ranks only, cannot then derail the tests after it).
tests=("")
if [[ "${ISOLATE:-0}" == 1 ]]; then
    # shellcheck disable=SC2086
    mapfile -t tests < <("$python" -m pytest -p no:cacheprovider -p hvd_suite_compat -q \
        --collect-only "$suite" ${PYTEST_ARGS:-} 2>/dev/null | grep '::')
    [[ ${#tests[@]} -gt 0 ]] || { echo "no tests collected from $suite" >&2; exit 2; }
fi
# Each rank: its own log and JUnit file (the rank from Open MPI's or MPICH's variable).
# shellcheck disable=SC2016
rank_cmd='r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}; exec "$0" -m pytest -p no:cacheprovider -p hvd_suite_compat -q -rfEs "$@" --junitxml="$OUT/junit.$TEST.$r.xml" >>"$OUT/rank$r.log" 2>&1'

status=0
for np in "${sizes[@]}"; do
    out="$work/np$np"
    mkdir -p "$out"
    rc=0
    for t in "${tests[@]}"; do
        limit=${TIMEOUT:-1200}
        [[ -n "$t" ]] && limit=${TIMEOUT:-120}
        trc=0
        # shellcheck disable=SC2086
        OUT="$out" TEST="${t##*::}" timeout "$limit" "$mpiexec" -n "$np" --oversubscribe \
            -x OUT -x TEST -x PYTHONPATH bash -c "$rank_cmd" "$python" "$suite${t:+::${t#*::}}" \
            ${PYTEST_ARGS:-} >>"$out/mpiexec.log" 2>&1 || trc=$?
        [[ $trc == 124 ]] && echo "np=$np ${t:-all}: timed out after ${limit}s"
        [[ $trc == 0 ]] || rc=$trc
    done
    echo "== np=$np (mpiexec exit $rc)"
    [[ -n "${tests[0]:-}" ]] || tail -n 1 "$out/rank0.log" 2>/dev/null | sed 's/^/rank 0: /'
    "$python" - "$out" "$np" <<'EOF'
import glob, os, sys
import xml.etree.ElementTree as ET

out, np = sys.argv[1], int(sys.argv[2])
failed, counts = {}, {}
for path in sorted(glob.glob(os.path.join(out, "junit.*.xml"))):
    rank = int(path.rsplit(".", 2)[1])
    root = ET.parse(path).getroot()
    n = counts.setdefault(rank, {"passed": 0, "failed": 0, "skipped": 0})
    for case in root.iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        kind = {"failure": "failed", "error": "failed"}.get(kind, kind)
        n[kind] += 1
        if kind == "failed":
            msg = next(c for c in case if c.tag in ("failure", "error")).get("message", "")
            failed.setdefault(case.get("name"), {})[rank] = msg.splitlines()[0][:150] if msg else ""
missing = sorted(set(range(np)) - set(counts))
for rank, n in sorted(counts.items()):
    print(f"rank {rank}: {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped")
if missing:
    print(f"ranks without a JUnit file (killed or hung): {missing}")
for name, by_rank in sorted(failed.items()):
    first = min(by_rank)
    print(f"FAILED {name} (ranks {sorted(by_rank)}): {by_rank[first]}")
EOF
    [[ $rc == 0 ]] || status=1
done
exit $status
