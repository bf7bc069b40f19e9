"""The element passes of DistributedOptimizer(deterministic=True), per call, one thread, on
the largest ResNet-50 gradient (2.36 M floats): the compiled kernels (csrc/ops/exact_sum.*)
against the torch passes they replaced, in the same run, interleaved.

    python benchmarks/bench_exact_sum.py [--quick]

Per backward pass: `aminmax`, the scaled product, `round_`, the copy into int64 and its `add_`
(the accumulating pass) against one `exact_quantize`. Per step: the copy into float64, `div_`
by M / q (M = 2) and the float32 result against one `exact_dequantize` (into a reused output:
both sides then skip the fresh tensor's page faults). One JSON line: median ms and the ratios.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, median_time, set_threads  # noqa: E402

import fluxmpi_py._C as C  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small tensor, few reps")
    args = ap.parse_args()
    set_threads()
    n = 1 << 16 if args.quick else 512 * 512 * 3 * 3
    reps, rounds = (5, 1) if args.quick else (30, 3)
    torch.manual_seed(0)
    g = torch.randn(n) * 1e-3
    top = math.frexp(float(g.abs().max()))[1] + 16  # the grid's top, as the optimizer sets it
    bits = 61  # P for M = 2 micro-batches
    scale, bound, divisor = (
        math.ldexp(1.0, bits - top),
        math.ldexp(1.0, top),
        2 * 2.0 ** (bits - top),
    )
    acc = torch.zeros(n, dtype=torch.int64)
    work32, work64 = torch.empty(n), torch.empty(n, dtype=torch.float64)
    work_i, out = torch.empty(n, dtype=torch.int64), torch.empty(n)

    def torch_pass():
        lo, hi = torch.aminmax(g)
        float(torch.maximum(hi, -lo))
        torch.mul(g, scale, out=work32).round_()
        acc.add_(work_i.copy_(work32))

    def kernel_pass():
        C.exact_quantize(g, acc, scale, bound, True)

    def torch_step():
        work64.copy_(acc).div_(divisor)
        out.copy_(work64)

    def kernel_step():
        C.exact_dequantize(acc, out, divisor)

    cases = {"torch_pass": torch_pass, "kernel_pass": kernel_pass}
    cases |= {"torch_step": torch_step, "kernel_step": kernel_step}
    times = {k: [] for k in cases}
    for _ in range(rounds):  # interleaved: drift hits both sides alike
        for k, fn in cases.items():
            times[k].append(median_time(fn, reps))
    ms = {k: round(1000 * sorted(v)[len(v) // 2], 3) for k, v in times.items()}
    result = {
        "bench": "exact_sum",
        "numel": n,
        "ms": ms,
        "pass_torch_over_kernel": round(ms["torch_pass"] / ms["kernel_pass"], 2),
        "step_torch_over_kernel": round(ms["torch_step"] / ms["kernel_step"], 2),
    }
    emit("bench_exact_sum" + (".quick" if args.quick else ""), result, 0)


if __name__ == "__main__":
    main()
