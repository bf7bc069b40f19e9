"""synchronize_ of two modules against the limit and against one broadcast per tensor.

    mpiexec -n 2 python benchmarks/bench_sync.py           # full size, 20 repetitions (x10 on many_small)
    mpiexec -n 2 python benchmarks/bench_sync.py --quick   # ResNet-50 widths / 4, 4 repetitions (x10)
    mpiexec -n 2 python benchmarks/bench_sync.py --module many_small   # one module only

Modules (float32 parameters, built from shape lists, no torchvision):
  resnet50    161 tensors with ResNet-50's parameter shapes, 25.6M floats (102 MB)
  many_small  1000 tensors of 1024 floats (4 MB)
Peers, timed in the same run on the same bytes:
  synchronize_       ours, after its first call moved the parameters into flat storage
  synchronize__no_relocate   ours with relocate=False: small tensors packed on every call,
                     large ones broadcast alone
  limit              one mpi4py Bcast of a pre-made buffer holding all the bytes
  per_tensor_mpi4py  one mpi4py Bcast per tensor, straight from the parameters' memory
  per_tensor_bcast_  one fluxmpi_py.bcast_ per tensor (each with its cross-rank check)
Repetitions alternate between the methods, so that a change in machine load hits all alike,
in a new random order each time (the same on every rank): a method's time here depends on
which method ran just before it (a rotating order keeps the predecessor fixed, and that alone
made the same synchronize_ call read 1.07x to 1.3x the limit). Each repetition is the slowest
rank's time between barriers. Where memory lands changes a
broadcast's time here by up to 1.5x (the module built first is slowest), so the repetitions
are spread over 4 rounds that rebuild every method's memory in a rotated order. Reported: medians (ms), ours /
limit and per-tensor / ours, and the same from the fastest repetitions; first_call_ms is
synchronize_'s first call on a module (the one that relocates). Goals: ours <= 1.2x the limit
on both modules, and per-tensor (mpi4py) >= 3x ours on many_small. Rank 0 prints one JSON line and writes it to
benchmarks/results/bench_sync.json (--quick: bench_sync.quick.json).

mpi4py and fluxmpi_py share one MPI: mpi4py is imported first and initializes it (thread
level "multiple"); fluxmpi_py.Init adopts it. The reverse order works too.
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import resnet50_param_shapes  # noqa: E402
from mpi4py import MPI  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def module_of(shapes, rank):
    m = nn.Module()
    m.params = nn.ParameterList(nn.Parameter(torch.full(s, float(rank + 1))) for s in shapes)
    return m


def timed(fn, comm):
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def build(kind, shapes, rank, numel):
    """The memory one method works on. Each method has its own, so that no method's numpy views
    alias another's parameters (synchronize_ never relocates a parameter that another tensor
    shares)."""
    if kind == "limit":
        return torch.full((numel,), float(rank + 1)).numpy()
    model = module_of(shapes, rank)
    if kind == "per_tensor":
        params = list(model.parameters())
        return params, [p.detach().numpy() for p in params]  # the parameters' own memory
    return model


def methods_on(mem, comm):
    """The timed calls, each on its own memory from `build`."""
    model, kept, flat = mem["ours"], mem["ours_kept"], mem["limit"]
    peer_params, arrays = mem["per_tensor"]
    return {
        "synchronize_": lambda: fm.synchronize_(model, root_rank=0),
        "synchronize__no_relocate": lambda: fm.synchronize_(kept, root_rank=0, relocate=False),
        "limit": lambda: comm.Bcast(flat, root=0),
        "per_tensor_mpi4py": lambda: [comm.Bcast(a, root=0) for a in arrays],
        "per_tensor_bcast_": lambda: [fm.bcast_(p.detach(), root_rank=0) for p in peer_params],
    }


def bench(name, shapes, comm, reps):
    rank = comm.Get_rank()
    numel = sum(math.prod(s) for s in shapes)
    kinds = ["ours", "ours_kept", "limit", "per_tensor"]
    times, first = {}, []
    # Where a buffer lands in memory changes its broadcast time by up to 1.5x here (the module
    # built first is the slowest), so every round rebuilds all memory in a rotated order: each
    # method is built first once. Repetitions within a round alternate between the methods.
    rounds = len(kinds)
    for rnd in range(rounds):
        order = kinds[rnd:] + kinds[:rnd]
        mem = {k: build(k, shapes, rank, numel) for k in order}
        model, kept = mem["ours"], mem["ours_kept"]

        # Correctness first: every rank ends with the root's values. This first call is also
        # the one that relocates small parameters into flat storage: timed on its own.
        comm.Barrier()
        t0 = time.perf_counter()
        fm.synchronize_(model, root_rank=0)
        first.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        assert all(bool((p == 1.0).all()) for p in model.parameters()), f"{name}: wrong values"
        # The same without relocation (every small tensor packed and unpacked on every call).
        fm.synchronize_(kept, root_rank=0, relocate=False)
        assert all(bool((p == 1.0).all()) for p in kept.parameters()), f"{name}: relocate=False"

        methods = methods_on(mem, comm)
        for fn in methods.values():  # warm up
            timed(fn, comm)
        names = list(methods)
        rng = random.Random(rnd)  # the same sequence on every rank: no communication needed
        for _ in range(max(1, reps // rounds)):
            # A shuffled order: every method follows every other equally often. A fixed or
            # rotated order makes one method always follow, e.g., a thousand small broadcasts,
            # which changes its time by 10-30% here.
            order = names[:]
            rng.shuffle(order)
            for k in order:
                times.setdefault(k, []).append(timed(methods[k], comm))
        del mem, model, kept, methods
    first_ms = statistics.median(first) * 1e3
    params = shapes
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    return {
        "tensors": len(params),
        "floats": numel,
        "bytes": numel * 4,
        **{f"{k}_ms": round(v * 1e3, 3) for k, v in med.items()},
        "first_call_ms": round(first_ms, 3),
        "ratio_to_limit": round(med["synchronize_"] / med["limit"], 3),
        "no_relocate_ratio_to_limit": round(med["synchronize__no_relocate"] / med["limit"], 3),
        "per_tensor_mpi4py_over_ours": round(med["per_tensor_mpi4py"] / med["synchronize_"], 2),
        "per_tensor_bcast__over_ours": round(med["per_tensor_bcast_"] / med["synchronize_"], 2),
        # Fastest repetitions: on a loaded machine the medians mostly measure the scheduler.
        "min_ms": {k: round(v * 1e3, 3) for k, v in low.items()},
        "min_ratio_to_limit": round(low["synchronize_"] / low["limit"], 3),
        "min_per_tensor_mpi4py_over_ours": round(low["per_tensor_mpi4py"] / low["synchronize_"], 2),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="ResNet-50 widths / 4, 4 repetitions")
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions on resnet50, spread over 4 rounds (default 20, quick 4); "
        "many_small, 100x cheaper per call, gets 10x as many",
    )
    ap.add_argument(
        "--module",
        choices=("both", "resnet50", "many_small"),
        default="both",
        help="time one module only (its goals alone are reported; the file name says which)",
    )
    args = ap.parse_args()

    torch.set_num_threads(1)
    fm.Init()
    comm = MPI.COMM_WORLD
    reps = args.reps or (4 if args.quick else 20)
    results = {}
    if args.module in ("both", "resnet50"):
        shapes = resnet50_param_shapes(4 if args.quick else 1)
        results["resnet50"] = bench("resnet50", shapes, comm, reps)
    if args.module in ("both", "many_small"):
        results["many_small"] = bench("many_small", [(1024,)] * 1000, comm, 10 * reps)
    if comm.Get_rank() == 0:
        r, s = results.get("resnet50"), results.get("many_small")
        goals = {}
        if r is not None:
            goals["resnet50_le_1.2x_limit"] = r["ratio_to_limit"] <= 1.2
        if s is not None:
            goals["many_small_le_1.2x_limit"] = s["ratio_to_limit"] <= 1.2
            goals["many_small_ge_3x_faster_than_per_tensor"] = s["per_tensor_mpi4py_over_ours"] >= 3
        line = json.dumps(
            {
                "benchmark": "bench_sync",
                "what": "synchronize_(module) vs one mpi4py Bcast of all bytes (limit) and one "
                "broadcast per tensor; median ms, slowest rank",
                "world_size": comm.Get_size(),
                "quick": bool(args.quick),
                "reps": {k: reps if k == "resnet50" else 10 * reps for k in results},
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "mpi_library": fm.build_info()["mpi_library"],
                "torch": torch.__version__,
                **results,
                "goals": goals,
            }
        )
        print(line, flush=True)
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
        os.makedirs(out, exist_ok=True)
        name = "bench_sync" + ("" if args.module == "both" else f".{args.module}")
        with open(os.path.join(out, name + (".quick.json" if args.quick else ".json")), "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
