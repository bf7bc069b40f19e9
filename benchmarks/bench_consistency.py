"""The cost of one check_consistency call (what DistributedOptimizer(check_every=N) adds every N
steps), on ResNet-50's 161 parameter shapes with SGD momentum: 322 tensors, 51.1M floats
(204 MB) hashed per call.

    python benchmarks/bench_consistency.py [--quick]            # 1 rank
    mpiexec -n 2 python benchmarks/bench_consistency.py [--quick]

Prints one JSON line (rank 0) with median times in ms: the whole call, the local hashing
alone (tensor_digests) and the rate in GB/s; writes benchmarks/results/bench_consistency_np<N>.json.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, median_time, resnet50_param_shapes, set_threads  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="ResNet-50 widths / 4, 3 repetitions")
    args = ap.parse_args()
    set_threads()
    fm.Init()
    torch.manual_seed(0)
    shapes = resnet50_param_shapes(4 if args.quick else 1)
    params = {f"p{i}": torch.nn.Parameter(torch.randn(s)) for i, s in enumerate(shapes)}
    opt = torch.optim.SGD(params.values(), lr=0.1, momentum=0.9)
    for p in params.values():
        p.grad = torch.randn(p.shape)
    opt.step()  # creates the momentum buffers
    obj = {"parameters": params, "optimizer": opt}
    tensors = list(params.values()) + [opt.state[p]["momentum_buffer"] for p in params.values()]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    reps = 3 if args.quick else 15

    check = median_time(lambda: fm.check_consistency(obj), reps, sync=fm.barrier)
    digests = median_time(lambda: C.tensor_digests(tensors), reps)
    result = {
        "bench": "consistency",
        "ranks": fm.total_workers(),
        "tensors": len(tensors),
        "floats": sum(t.numel() for t in tensors),
        "ms": {"check_consistency": round(1000 * check, 2), "hash_only": round(1000 * digests, 2)},
        "hash_GB_per_s": round(nbytes / digests / 1e9, 2),
    }
    emit(f"bench_consistency_np{fm.total_workers()}", result, fm.local_rank())


if __name__ == "__main__":
    main()
