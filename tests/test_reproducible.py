"""The same bits at any world size (issue 34): DistributedOptimizer(deterministic=True) with
the global-batch data mode. `python -m fluxmpi_py.reproduce` runs tests/workers/reproduce_script.py
(a CNN and an MLP: AdamW, BatchNorm, accumulation, 30 steps) in separate launches at 1, 2, 3, 4
and 2 ranks and compares every step's digests and the final tensors; the same script with
deterministic=False differs, and the tool names where. tests/workers/repro_worker.py trains the
same models over sub-groups of one 4-rank launch (3 + 1, then 2 + 2 ranks)."""

import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from mpi_util import ROOT, singleton_env, worker_params, worker_path  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

SCRIPT = worker_path("reproduce_script.py")


@pytest.mark.parametrize("case", worker_params("repro_worker.py", [4], timeout=300))
def test_repro_multirank(case):
    case.check_passed()


def reproduce(out, ranks, steps, *script_args, timeout=400, run_timeout=None):
    """python -m fluxmpi_py.reproduce on the script; (exit status, output). Each run may take
    a third of `timeout`; the whole command is killed (its process group) after `timeout`."""
    cmd = [sys.executable, "-m", "fluxmpi_py.reproduce", SCRIPT, "--ranks", ranks, "--steps"]
    cmd += [str(steps), "--timeout", str(run_timeout or timeout // 3), "--out", str(out)]
    cmd += ["--", *script_args] if script_args else []
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=singleton_env(),
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout), proc.stdout.read()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(
            f"python -m fluxmpi_py.reproduce did not end in {timeout} s: {proc.stdout.read()}"
        )


def records(out):
    """Each run's per-step digests, read from the tool's --out folder, in run order."""
    runs = []
    for folder in sorted(os.listdir(out), key=lambda f: int(f[3 : f.index("-")])):
        with open(os.path.join(out, folder, "steps.jsonl")) as f:
            runs.append([json.loads(line)["digests"] for line in list(f)[1:]])
    return runs


def test_same_bits_in_separate_launches_at_1_2_3_4_and_2_ranks(tmp_path):
    rc, out = reproduce(tmp_path, "1,2,3,4,2", 30)
    assert rc == 0, out
    assert (
        "same bits: " in out
        and "each of 30 steps are equal at 1 rank, 2 ranks, 3 ranks, 4 ranks, 2 ranks (run 2)"
        in out
    ), out
    for label in ("2 ranks", "3 ranks", "4 ranks", "2 ranks (run 2)"):
        assert re.search(rf"final: {re.escape(label)}: all \d+ tensors torch.equal", out), out
    runs = records(tmp_path)  # every parameter, buffer and optimizer state, at every step
    paths = runs[0][0]
    assert any(".exp_avg_sq" in p for p in paths) and any(".running_var" in p for p in paths)
    assert len(runs) == 5 and all(len(r) == 30 and r == runs[0] for r in runs)


def test_the_default_differs_and_the_tool_names_where(tmp_path):
    rc, out = reproduce(tmp_path, "1,2", 3, "--default")
    assert rc == 1, out
    m = re.search(r"differ: first at step (\d+) of 3, '([^']+)': at 2 ranks it differs", out)
    assert m, out
    step, path = int(m.group(1)), m.group(2)
    one, two = records(tmp_path)
    assert all(one[s] == two[s] for s in range(step - 1))  # the steps before it agree
    first = next(p for p in one[step - 1] if one[step - 1][p] != two[step - 1].get(p))
    assert path == first, out  # the first entry in the recorded order
    assert re.search(
        r"final: 2 ranks: \d+ of \d+ tensors differ from 1 rank's; the first, '[^']+': largest difference",
        out,
    ), out


def test_a_run_past_its_timeout_is_ended(tmp_path):
    rc, out = reproduce(tmp_path, "1,1", 3, timeout=60, run_timeout=0.5)
    assert rc == 2 and "failed: 1 rank: still running after --timeout 0.5 s: ended" in out, out


def test_error_bound_against_a_float64_sum():
    # M micro-batches of one rank: the reduced mean is within q/2 (+ the final rounding) of
    # the exact mean, computed in float64 from the same float32 gradients.
    fm.Init()
    torch.manual_seed(0)
    model = torch.nn.Linear(50, 40)
    k = 7
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        named_parameters=model.named_parameters(),
        deterministic=True,
        backward_passes_per_step=k,
        check_every=0,
    )
    for step in range(3):  # the grid adapts after the first step
        xs = [torch.randn(4, 50) * 10**step for _ in range(k)]
        refs = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
        for x in xs:  # the float32 gradient of each micro-batch, summed in float64
            grads = torch.autograd.grad(model(x).pow(2).mean(), list(model.parameters()))
            for (n, _), g in zip(model.named_parameters(), grads):
                refs[n] += g.double()
        grid = opt.exact_grid()
        for x in xs:
            model(x).pow(2).mean().backward()
        opt.synchronize()
        for n, p in model.named_parameters():
            exact = refs[n] / k
            q = grid[n][1]
            err = (p.grad.double() - exact).abs()
            ulp = torch.finfo(torch.float32).eps * exact.abs()  # half an ulp of float32, doubled
            bound = q / 2 + ulp + 2**-50 * exact.abs()
            assert bool((err <= bound).all()), (step, n, float((err - bound).max()), q)
            assert q == math.ldexp(1.0, grid[n][0] - (62 - (k - 1).bit_length()))
        with opt.skip_synchronize():
            opt.step()
        assert all(p.grad is None for p in model.parameters())
    assert opt.exact_grid()["weight"][0] < 16 + 16  # adapted from the first step's 2**16
