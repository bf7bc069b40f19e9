"""Packing a gradient bucket: our pack (one kernel launch per bucket on a GPU, one loop on the
host; csrc/ops/bucket_pack.*) against one scaled copy per tensor and against
torch._foreach_copy_, on ResNet-50's 161 gradient shapes, and unpacking back.

    python benchmarks/bench_pack.py [--device cuda|cpu] [--quick]

Cases: fp32 gradients packed into fp32 with the average's 1/2, fp32 packed into bf16 (the
compressed wire), bf16 into bf16. One JSON line with median times in ms. scripts/gpu_check.sh
runs it on a GPU; on the host it only checks that the script runs.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, median_time, resnet50_param_shapes  # noqa: E402

import fluxmpi_py._C as C  # noqa: E402


def bench_case(shapes, grad_dtype, wire, dev, reps, sync):
    """Median ms of each way to pack (scale 1/2, cast to `wire`) and unpack the gradients."""
    grads = [torch.randn(s, device=dev, dtype=grad_dtype) for s in shapes]
    plan = C.plan_pack(grads, wire, scales=[0.5] * len(grads))
    flat = torch.empty(plan.numel, device=dev, dtype=wire)
    slots = [
        flat.narrow(0, e["offset"], e["numel"]).view(g.shape) for e, g in zip(plan.entries, grads)
    ]
    outs = [torch.empty_like(g) for g in grads]

    def timed(fn):
        def run():
            fn()
            if sync:
                sync()

        return round(median_time(run, reps, sync=sync) * 1e3, 4)

    def per_tensor():
        for s, g in zip(slots, grads):
            if wire == grad_dtype:
                torch.mul(g, 0.5, out=s)
            else:
                s.copy_(g.mul(0.5))

    def copy_back():
        for o, s in zip(outs, slots):
            o.copy_(s)

    return {
        "bytes": sum(g.numel() * g.element_size() for g in grads),
        "ours_pack": timed(lambda: C.pack(plan, grads, flat)),
        "per_tensor_scaled_copy": timed(per_tensor),
        "foreach_copy_unscaled": timed(lambda: torch._foreach_copy_(slots, grads)),
        "ours_unpack": timed(lambda: C.unpack(plan, flat, outs)),
        "per_tensor_copy_back": timed(copy_back),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps (a smoke test)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    shapes = resnet50_param_shapes(8 if args.quick else 1)
    reps = 3 if args.quick else 50
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    result = {
        "bench": "pack",
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "tensors": len(shapes),
        "cases": {},
    }
    for grad_dtype, wire in (
        (torch.float32, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
    ):
        name = f"{str(grad_dtype)[6:]}->{str(wire)[6:]}"
        result["cases"][name] = bench_case(shapes, grad_dtype, wire, dev, reps, sync)
    emit(f"bench_pack_{dev.type}" + (".quick" if args.quick else ""), result, 0)


if __name__ == "__main__":
    main()
