"""The same bits at any world size (issue 34): DistributedOptimizer(deterministic=True) with
the global-batch data mode. `python -m fluxmpi_py.reproduce` runs tests/workers/reproduce_script.py
(a CNN and an MLP: AdamW, BatchNorm, accumulation, 30 steps) in separate launches at 1, 2, 3, 4
and 2 ranks and compares every step's digests and the final tensors; the same script with
deterministic=False differs, and the tool names where. tests/workers/repro_worker.py trains the
same models over sub-groups of one 4-rank launch (3 + 1, then 2 + 2 ranks);
tests/workers/uneven_worker.py deals 8 micro-batches unevenly over 3 ranks."""

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import forks  # noqa: E402
from launch_env import mpi_env  # noqa: E402
from mpi_util import ROOT, find_mpiexec, singleton_env, worker_params, worker_path  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py.reproduce import _parse  # noqa: E402

SCRIPT = worker_path("reproduce_script.py")


@pytest.mark.parametrize("case", worker_params("repro_worker.py", [4], timeout=300))
def test_repro_multirank(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("exact_paths_worker.py", [1, 2, 3], timeout=240))
def test_exact_paths_multirank(case):
    case.check_passed()


@pytest.mark.parametrize("case", worker_params("uneven_worker.py", [3], timeout=240))
def test_uneven_shares_multirank(case):
    # 8 micro-batches a step at 3 ranks (3, 3, 2): the bits of 1 and 2 ranks (issue 51)
    case.check_passed()


def reproduce(out, ranks, steps, *script_args, timeout=400, run_timeout=None, mpiexec_args=None):
    """python -m fluxmpi_py.reproduce on the script; (exit status, output). Each run may take
    a third of `timeout`; the whole command is killed (its process group) after `timeout`."""
    cmd = [sys.executable, "-m", "fluxmpi_py.reproduce", SCRIPT, "--ranks", ranks, "--steps"]
    cmd += [str(steps), "--timeout", str(run_timeout or timeout // 3), "--out", str(out)]
    if mpiexec_args is not None:  # as the docs write it: two words, the value starting with -
        cmd += ["--mpiexec-args", mpiexec_args]
    # the ranks forked from the suite's fork server (tests/forks.py), through --python
    cmd += ["--python", shlex.join(forks.python())]
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
    # --mpiexec-args "--oversubscribe" (issue 46: argparse took the value for an option)
    rc, out = reproduce(tmp_path, "1,2", 3, "--default", mpiexec_args="--oversubscribe")
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


def test_the_ranks_run_the_python_given(tmp_path):
    cmd = [sys.executable, "-m", "fluxmpi_py.reproduce", SCRIPT, "--ranks", "1,1", "--steps"]
    cmd += ["1", "--timeout", "60", "--python", f"{sys.executable} -c 'raise SystemExit(7)'"]
    p = subprocess.run(cmd, env=singleton_env(), cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "failed: 1 rank: exit status 7" in p.stdout, p.stdout + p.stderr


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


# ---- the compiled kernels against today's torch passes (no Init) -------------------------
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def grid_data(dtype, n, top, shift, seed):
    """Gradients of `dtype` across many exponents below 2**top, with exact ties after the
    scaling by 2**shift, zeros of both signs, subnormals and the largest value on the grid."""
    gen = torch.Generator().manual_seed(seed)
    info = torch.finfo(dtype)
    low = math.frexp(info.smallest_normal)[1] - 1  # the exponent of the smallest normal
    exps = torch.randint(max(low, top - 40), top, (n,), generator=gen)
    g = (torch.rand(n, generator=gen, dtype=torch.float64) * 2 - 1) * torch.pow(2.0, exps)
    ties = torch.randint(-2000, 2000, (n // 8,), generator=gen).double() + 0.5
    g[: n // 8] = ties * math.ldexp(1.0, -shift)  # round(x * 2**shift) halfway: ties to even
    g = g.to(dtype)
    g[-4:] = torch.tensor([0.0, -0.0, info.smallest_normal / 2, 0.0], dtype=dtype)
    g[-1] = torch.nextafter(
        torch.tensor(math.ldexp(1.0, top), dtype=dtype), torch.zeros((), dtype=dtype)
    )
    return g


def torch_quantize(g, shift):
    """Today's reference: round(g * 2**shift) in float64, ties to even, as int64."""
    return (g.to(torch.float64) * math.ldexp(1.0, shift)).round_().to(torch.int64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "bits", [60, 44]
)  # the kernel's exact path (|g * 2**shift| >= 2**51), its fast one
def test_exact_quantize_matches_the_float64_passes_bit_for_bit(dtype, bits):
    top = 2 if dtype in (torch.float16, torch.bfloat16) else 9
    shift = bits - top  # P = 60: M = 3 micro-batches
    acc = torch.full((5000,), 12345, dtype=torch.int64)  # stale values: overwritten
    want = torch.zeros(5000, dtype=torch.int64)
    for accumulate, seed in ((False, 1), (True, 2), (True, 3)):
        g = grid_data(dtype, 5000, top, shift, seed)
        want = want + torch_quantize(g, shift)
        mx = fm._core.C.exact_quantize(
            g, acc, math.ldexp(1.0, shift), math.ldexp(1.0, top), accumulate
        )
        assert mx == float(g.abs().max()) and mx < math.ldexp(1.0, top)
        assert torch.equal(acc, want), (dtype, accumulate, int((acc != want).sum()))
    ties = torch.tensor([2.5, 3.5, -2.5, -0.5], dtype=dtype)  # to nearest, ties to even
    assert fm._core.C.exact_quantize(ties, acc[:4], 1.0, 2.0**8, False) == 3.5
    assert acc[:4].tolist() == [2, 4, -2, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_quantize_reports_overflow_and_non_finite(dtype):
    C = fm._core.C
    scale, bound = 2.0**40, 2.0**8
    base = torch.tensor([1.0, -3.5, 0.25, 7.0], dtype=dtype)
    for bad, want in ((256.0, 256.0), (-300.0, 300.0), (math.inf, math.inf), (-math.inf, math.inf)):
        g = torch.cat([base, torch.tensor([bad], dtype=dtype)])
        acc = torch.zeros(5, dtype=torch.int64)
        assert C.exact_quantize(g, acc, scale, bound, False) == want  # the step raises on it
        assert torch.equal(acc[:4], torch_quantize(base, 40))  # the others still summed
    g = torch.cat([base, torch.tensor([math.nan, math.inf], dtype=dtype)])
    assert math.isnan(C.exact_quantize(g, torch.zeros(6, dtype=torch.int64), scale, bound, True))
    assert C.exact_quantize(base[:0], torch.zeros(0, dtype=torch.int64), scale, bound, False) == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("micro_batches", [1, 3, 6])
def test_exact_dequantize_matches_the_float64_passes_bit_for_bit(dtype, micro_batches):
    gen = torch.Generator().manual_seed(micro_batches)
    s = torch.randint(-(2**62), 2**62, (4000,), generator=gen, dtype=torch.int64)
    s[:1000] >>= torch.randint(0, 62, (1000,), generator=gen)  # small sums too
    for q in (2.0**-50, 2.0**-20, 2.0**-45):
        for divisor in (micro_batches / q, 1 / q):  # average, sum
            out = torch.empty(4000, dtype=dtype)
            fm._core.C.exact_dequantize(s, out, divisor)
            want = s.to(torch.float64).div_(divisor).to(dtype)
            assert torch.equal(out, want), (dtype, q, divisor, int((out != want).sum()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_exact_sum_rows_is_quantize_then_dequantize_bit_for_bit(dtype, ranks):
    # the sharded path's owner pass against the int64 path's two kernels on the same rows,
    # past a block (2048) and with a value beyond the bound, written over one of its rows
    C = fm._core.C
    top, bits = 9, 62 - (ranks - 1).bit_length()
    scale, bound = math.ldexp(1.0, bits - top), math.ldexp(1.0, top)
    rows = torch.stack([grid_data(dtype, 5000, top, bits - top, seed) for seed in range(ranks)])
    rows[-1, 4321] = 1000.0  # beyond 2**9: adds 0 (the step raises on it)
    for divisor in (ranks / math.ldexp(1.0, top - bits), 3 / math.ldexp(1.0, top - bits)):
        acc = torch.zeros(4000, dtype=torch.int64)
        want_most = 0.0
        for r in range(ranks):
            want_most = max(want_most, C.exact_quantize(rows[r, 1000:], acc, scale, bound, r > 0))
        want = torch.empty(4000, dtype=dtype)
        C.exact_dequantize(acc, want, divisor)
        parts = rows.clone()
        most = C.exact_sum_rows(parts[:, 1000:], parts[0, 1000:], scale, bound, divisor)
        assert most == want_most == float(rows[:, 1000:].abs().max())
        assert torch.equal(parts[0, 1000:], want), (dtype, int((parts[0, 1000:] != want).sum()))
        assert torch.equal(parts[1:], rows[1:]) and torch.equal(parts[0, :1000], rows[0, :1000])
    rows[0, 1500] = math.nan
    assert math.isnan(
        C.exact_sum_rows(rows[:, 1000:], torch.empty(4000, dtype=dtype), 1.0, 2.0, 1.0)
    )


def int64_sum_rows(rows, scale, bound, divisor):
    """The int64 path's kernels over the rows (one accumulator, then back): (out, most)."""
    C = fm._core.C
    acc = torch.zeros(rows.shape[1], dtype=torch.int64)
    most = max(C.exact_quantize(row, acc, scale, bound, r > 0) for r, row in enumerate(rows))
    out = torch.empty(rows.shape[1], dtype=rows.dtype)
    C.exact_dequantize(acc, out, divisor)
    return out, most


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_sum_rows_float64_blocks_and_their_int64_fallback(dtype):
    # The owner's pass adds a block (2048 elements) in float64 where that is exact (every
    # |x * scale| below 2**51, the rows' sum below 2**52), else in int64: the same bits as the
    # int64 kernels either way. Block 0 is small values (float64); in block 1 one column's
    # 8 values sum to 2**53 + 2 on the grid, which a float64 sum in row order would round to
    # 2**53 (each + 1 a tie to even), so it must fall back; block 2 has a value beyond the
    # bound (int64, adding 0).
    C = fm._core.C
    scale, bound = 2.0**40, 2.0**12
    rows = torch.stack([grid_data(dtype, 3 * 2048, 2, 40, seed) for seed in range(8)])
    trap = [1.75, 1.75, 1.5, 1.5, 1.5, 2.0**-50, 2.0**-50, 0.0]  # times 2**50 on the grid
    rows[:, 2048 + 5] = torch.tensor(trap, dtype=torch.float64).mul(2.0**10).to(dtype)
    on_grid = [float(x) * scale for x in rows[:, 2048 + 5].double()]
    if dtype != torch.float16:  # float16 flushes 2**-40 to 0: no trap there
        assert math.fsum(on_grid) == 2.0**53 + 2 and sum(on_grid) == 2.0**53
    rows[3, 4096 + 7] = 6144.0  # beyond the bound
    for divisor in (scale, 3 * scale):  # the sum, an average
        want, want_most = int64_sum_rows(rows, scale, bound, divisor)
        assert want_most == 6144.0
        for float64 in (True, False):
            previous = C.set_exact_float64_pass(float64)
            before = C.exact_sum_block_counts()
            try:
                out = torch.empty(3 * 2048, dtype=dtype)
                most = C.exact_sum_rows(rows, out, scale, bound, divisor)
            finally:
                C.set_exact_float64_pass(previous)
            blocks = tuple(a - b for a, b in zip(C.exact_sum_block_counts(), before))
            assert torch.equal(out, want), (float64, int((out != want).sum()))
            assert most == want_most
            assert blocks == ((1, 2) if float64 else (0, 3)), (float64, blocks)
    rows[5, 100] = math.nan  # a NaN in a float64 block: NaN comes back, int64 sums that block
    before = C.exact_sum_block_counts()
    assert math.isnan(C.exact_sum_rows(rows, torch.empty(3 * 2048, dtype=dtype), scale, bound, 1))
    assert tuple(a - b for a, b in zip(C.exact_sum_block_counts(), before)) == (0, 3)


def test_exact_kernels_refuse_bad_tensors():
    C = fm._core.C
    g, acc = torch.ones(4), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="accumulator must be a contiguous CPU int64"):
        C.exact_quantize(g, acc.int(), 1.0, 2.0, False)
    with pytest.raises(ValueError, match="gradient has 3 elements but the accumulator has 4"):
        C.exact_quantize(g[:3], acc, 1.0, 2.0, False)
    with pytest.raises(ValueError, match="gradient must be a real floating"):
        C.exact_quantize(acc, acc, 1.0, 2.0, False)
    with pytest.raises(ValueError, match="scale must be a finite power of two, got 3"):
        C.exact_quantize(g, acc, 3.0, 2.0, False)
    with pytest.raises(ValueError, match="output must be contiguous"):
        C.exact_dequantize(acc, torch.ones(4, 2).t()[0], 1.0)
    rows = torch.ones(2, 4)
    with pytest.raises(ValueError, match="rows are contiguous"):
        C.exact_sum_rows(rows.t(), torch.ones(2), 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match=r"out must be a contiguous 1-d CPU tensor of rows' dtype"):
        C.exact_sum_rows(rows, torch.ones(4, dtype=torch.float64), 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="out has 3 elements but the rows have 4"):
        C.exact_sum_rows(rows, torch.ones(3), 1.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="scale must be a finite power of two"):
        C.exact_sum_rows(rows, torch.ones(4), 3.0, 2.0, 1.0)


def test_a_non_finite_gradient_gives_nan_and_keeps_the_grid():
    fm.Init()
    model = torch.nn.Linear(3, 2)
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        named_parameters=model.named_parameters(),
        deterministic=True,
        check_every=0,
    )
    (model(torch.ones(1, 3)) * 1e3).sum().backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    grid = opt.exact_grid()
    for bad in (math.inf, math.nan):
        (model(torch.tensor([[1.0, bad, 1.0]])) * 1e3).sum().backward()
        opt.synchronize()
        assert bool(model.weight.grad.isnan().all()), model.weight.grad
        assert torch.equal(model.bias.grad, torch.full((2,), 1e3))  # exact on the grid
        with opt.skip_synchronize():
            opt.step()
        assert opt.exact_grid() == grid


def test_mpiexec_args_as_documented_take_a_value_starting_with_a_dash():
    base = ["train.py", "--ranks", "1,2", "--steps", "3"]
    for extra in (["--mpiexec-args", "--oversubscribe"], ["--mpiexec-args=--oversubscribe"]):
        args = _parse(base + extra + ["--", "--lr", "0.1"])
        assert args.mpiexec_args == "--oversubscribe" and args.args == ["--lr", "0.1"], args
    args = _parse(base + ["--python", "-"])  # --python's words too
    assert args.python == "-", args


def test_the_shared_memory_paths_print_no_error():
    # deterministic=True's owners, a grouped allreduce and a reduce-scatter through shared
    # memory on one host: Open MPI's one-sided windows printed "osc_ucx_component.c:375 Error:
    # OSC UCX component priority set inside component query failed" once per rank on a correct
    # run (PyPI's Open MPI 5.0.11 without UCX devices); POSIX shared memory prints nothing
    job = [find_mpiexec(), "-n", "2", "--oversubscribe", sys.executable]
    proc = subprocess.run(
        job + [worker_path("deterministic_shm_worker.py")],
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count("owner 16 scatter 1 ring 1") == 2, out[-4000:]  # the shared paths ran
    noisy = [line for line in proc.stderr.splitlines() if re.search(r"Error|osc_ucx|failed", line)]
    assert not noisy, proc.stderr[-4000:]
