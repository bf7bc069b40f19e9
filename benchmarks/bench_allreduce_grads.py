"""The gradient reduction alone on 2 ranks: allreduce_gradients, and DistributedOptimizer's
synchronize() on gradients already made (its fused buckets, no backward), against raw MPI on
one pre-made flat buffer (the limit) and against one MPI call per tensor, same launch.

    mpiexec -n 2 python benchmarks/bench_allreduce_grads.py [--quick]

Gradient lists: ResNet-50's 161 parameter shapes (25.6M floats) and 1000 tensors of 1024
floats. Prints one JSON line (rank 0) with median times in ms and ratios.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, median_time, resnet50_param_shapes, set_threads  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps (a smoke test)")
    ap.add_argument("--lists", default="", help="comma-separated list names (default: all)")
    args = ap.parse_args()
    set_threads()
    fm.Init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = fm.local_rank()
    shapes = resnet50_param_shapes(4 if args.quick else 1)
    lists = {"resnet50": shapes, "1000x1024": [(1024,)] * (100 if args.quick else 1000)}
    if args.lists:
        lists = {k: v for k, v in lists.items() if k in args.lists.split(",")}
    reps = 3 if args.quick else 20
    result = {"bench": "allreduce_grads", "ranks": fm.total_workers(), "lists": {}}

    def variants_on(params, flat):
        """The timed calls on one gradient list and a flat buffer of its size."""
        opt = fm.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), check_every=0)

        def raw_flat():
            comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)

        def per_tensor():
            for p in params:
                comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)

        def ours_sum():
            fm.allreduce_gradients(params, op="sum")

        def ours_avg():
            fm.allreduce_gradients(params, op="average")

        def optimizer():
            opt.synchronize()

        return {
            "raw_mpi_flat": raw_flat,
            "per_tensor_mpi": per_tensor,
            "ours_sum": ours_sum,
            "ours_average": ours_avg,
            "optimizer_synchronize": optimizer,
        }

    for name, shp in lists.items():
        params = [torch.nn.Parameter(torch.zeros(s)) for s in shp]
        for p in params:
            p.grad = torch.randn(p.shape)
        flat = torch.zeros(sum(p.numel() for p in params))
        variants = variants_on(params, flat)
        times = {k: [] for k in variants}
        for _ in range(1 if args.quick else 3):
            for k, fn in variants.items():
                times[k].append(median_time(fn, reps, warmup=2, sync=comm.Barrier))
        ms = {k: round(1000 * sorted(v)[len(v) // 2], 3) for k, v in times.items()}
        result["lists"][name] = {
            "tensors": len(params),
            "floats": int(flat.numel()),
            "ms": ms,
            "ours_sum_over_raw": round(ms["ours_sum"] / ms["raw_mpi_flat"], 3),
            "ours_average_over_raw": round(ms["ours_average"] / ms["raw_mpi_flat"], 3),
            "optimizer_over_raw": round(ms["optimizer_synchronize"] / ms["raw_mpi_flat"], 3),
            "per_tensor_over_ours_sum": round(ms["per_tensor_mpi"] / ms["ours_sum"], 3),
            "per_tensor_over_ours_average": round(ms["per_tensor_mpi"] / ms["ours_average"], 3),
        }
    emit("bench_allreduce_grads", result, rank)


if __name__ == "__main__":
    main()
