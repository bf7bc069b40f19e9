"""scripts/gpu_check.sh, read without a GPU: every step that can hang runs under a timeout of at
most 120 s, so that one hang costs a GPU session at most that (issue 31)."""

from __future__ import annotations

import os
import re

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "gpu_check.sh")
# what starts a step's long-running work
LAUNCHES = ("mpiexec --oversubscribe", "setup.py build_ext", "-m pytest", "benchmarks/")


def test_every_step_runs_under_a_timeout_of_at_most_120_s():
    text = open(SCRIPT).read()
    (default,) = re.findall(r"STEP_S=\$\{GPU_CHECK_STEP_S:-(\d+)\}", text)
    assert 0 < int(default) <= 120
    joined = text.replace("\\\n", " ")  # continued lines as one
    code = [line for line in joined.splitlines() if not line.lstrip().startswith("#")]
    launches = [line for line in code if any(k in line for k in LAUNCHES)]
    assert len(launches) >= 6, launches
    for line in launches:
        m = re.search(r"timeout (\"\$STEP_S\"|\d+)", line)
        assert m, f"no timeout: {line.strip()}"
        assert m.group(1) == '"$STEP_S"' or int(m.group(1)) <= 120, line.strip()


def test_the_default_steps_are_steps_of_the_script():
    # A misspelt name in DEFAULT_STEPS would silently skip a check in a GPU lease.
    text = open(SCRIPT).read()
    (default,) = re.findall(r'^DEFAULT_STEPS="([^"]+)"', text, re.M)
    defined = set(re.findall(r"\bwant ([\w-]+)", text))
    defined |= set(re.findall(r"^(?:nccl_mode|kill_step|bench_step) ([\w-]+)", text, re.M))
    assert "nccl-2" in defined and "bench-step-unbound" in defined, sorted(defined)
    unknown = [s for s in default.split() if s not in defined]
    assert not unknown, f"DEFAULT_STEPS names no step: {unknown}"
