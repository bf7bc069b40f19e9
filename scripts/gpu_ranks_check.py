"""The CUDA path at 2 ranks on whatever GPUs this node has (scripts/gpu_check.sh runs it, on one
GPU with NCCL told to let two ranks share it): allreduce_, bcast_, synchronize_ and
DistributedOptimizer on CUDA tensors, each against the value one process computes. Prints one
line per check, "ok: ..." or "FAIL: ...", and exits 1 if any failed.

    mpiexec -n 2 python scripts/gpu_ranks_check.py [--route nccl|mpi] [--comm-stream]
        [--expect-refusal]

--route: fail unless CUDA collectives take that route (build_info()["cuda_collectives"]).
--comm-stream: NCCL calls on a stream of their own (FLUXMPI_NCCL_COMM_STREAM=1's experiment).
--expect-refusal: ranks share a GPU with FLUXMPI_CUDA_OVER_MPI=0; a CUDA allreduce_ must raise
a ValueError naming the sharing on every rank, and a CPU one must still work.
"""

from __future__ import annotations

import sys

import torch

import fluxmpi_py as fm


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--route", choices=("nccl", "mpi"), default=None)
    ap.add_argument("--expect-refusal", action="store_true")
    ap.add_argument("--comm-stream", action="store_true", help="NCCL on a stream of its own")
    args = ap.parse_args()
    fm.Init()
    if args.comm_stream:
        import fluxmpi_py._C as C

        C.set_nccl_comm_stream(True)
    rank, world = fm.local_rank(), fm.total_workers()
    dev = torch.device("cuda", torch.cuda.current_device())
    failed = []

    def check(name, ok):
        print(f"rank {rank}: {'ok' if ok else 'FAIL'}: {name}", flush=True)
        if not ok:
            failed.append(name)

    route = fm.build_info()["cuda_collectives"]
    if args.route:
        check(
            f"CUDA collectives go over {args.route} (build_info says {route})", route == args.route
        )
    if args.expect_refusal:
        try:
            fm.allreduce_(torch.ones(3, device=dev))
            check("a CUDA allreduce_ on a shared GPU raises", False)
        except ValueError as e:
            check(f"a CUDA allreduce_ on a shared GPU raises: {e}", "share" in str(e))
        t = torch.ones(3)
        fm.allreduce_(t)
        check("a CPU allreduce_ after the refusal", bool((t == world).all()))
        return 1 if failed else 0

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.full((1001,), float(rank + 1), device=dev, dtype=dtype)
        fm.allreduce_(t, "sum")
        check(f"allreduce_ sum {dtype}", bool((t == world * (world + 1) / 2).all()))
    for dtype in (torch.float32, torch.float64):  # the average inside NCCL (ncclAvg)
        t = torch.full((1001,), float(rank + 1), device=dev, dtype=dtype)
        fm.allreduce_(t, "average")
        check(f"allreduce_ average {dtype}", bool((t == (world + 1) / 2).all()))
    # Over MPI (the collectives NCCL lacks): CUDA-aware, or staged through host memory.
    rows = fm.allgather(torch.full((rank + 1, 2), float(rank), device=dev))
    want = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(world)])
    check("allgather of uneven CUDA rows (over MPI)", torch.equal(rows.cpu(), want))
    t = torch.arange(7.0, device=dev) * (rank + 1)
    fm.bcast_(t, root_rank=0)
    check("bcast_", torch.equal(t.cpu(), torch.arange(7.0)))

    torch.manual_seed(rank)  # different weights on every rank until synchronize_
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = model.to(dev)
    fm.synchronize_(model, root_rank=0)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref = ref.to(dev)
    check(
        "synchronize_ gives rank 0's weights",
        all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters())),
    )

    # DistributedOptimizer at batch B per rank equals one process at batch world * B.
    gen = torch.Generator().manual_seed(1)
    x_all, y_all = (
        torch.randn(world * 4, 8, generator=gen),
        torch.randn(world * 4, 1, generator=gen),
    )
    for compression in (None, "bf16", "fp16"):  # 16-bit buckets reduce natively in NCCL
        m = [p.detach().clone() for p in ref.parameters()]
        mine = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        mine = mine.to(dev)
        with torch.no_grad():
            for p, q in zip(mine.parameters(), m):
                p.copy_(q)
        opt = fm.DistributedOptimizer(
            torch.optim.SGD(mine.parameters(), lr=0.1), compression=compression
        )
        xs, ys = x_all[rank * 4 : rank * 4 + 4].to(dev), y_all[rank * 4 : rank * 4 + 4].to(dev)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(mine(xs), ys).backward()
            opt.step()
        single = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        ).to(dev)
        with torch.no_grad():
            for p, q in zip(single.parameters(), m):
                p.copy_(q)
        sopt = torch.optim.SGD(single.parameters(), lr=0.1)
        for _ in range(3):
            sopt.zero_grad()
            torch.nn.functional.mse_loss(single(x_all.to(dev)), y_all.to(dev)).backward()
            sopt.step()
        tol = 1e-5 if compression is None else 2e-2
        close = all(
            torch.allclose(a, b, rtol=tol, atol=tol)
            for a, b in zip(mine.parameters(), single.parameters())
        )
        check(f"DistributedOptimizer(compression={compression}) equals batch {world}B", close)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
