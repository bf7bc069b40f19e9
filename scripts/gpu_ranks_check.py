"""The CUDA path at 2 ranks on whatever GPUs this node has (scripts/gpu_check.sh runs it, on one
GPU with NCCL told to let two ranks share it): allreduce_, bcast_, the row collectives
(gather, scatter, reduce_scatter, alltoall, grouped and async forms, gradients, group=), DDP
on the fluxmpi backend, synchronize_ and DistributedOptimizer on CUDA tensors, each against
the value one process computes. Prints one line per check, "ok: ..." or "FAIL: ...", and
exits 1 if any failed.

    mpiexec -n 2 python scripts/gpu_ranks_check.py [--route nccl|mpi] [--caller-stream]
        [--host-wait] [--expect-refusal] [--cpu]

--cpu: the same checks on host tensors, so that the CPU tests (tests/test_gpu_choice.py) check
the checks themselves.

--route: fail unless CUDA collectives take that route (build_info()["cuda_collectives"]).
--caller-stream: NCCL calls on the caller's stream (FLUXMPI_NCCL_COMM_STREAM=0), not their own.
--host-wait: the host waits for each NCCL call (FLUXMPI_NCCL_HOST_WAIT=1).
--nccl-groups: group= on CUDA tensors over NCCL communicators of the groups' members (Init's
default, FLUXMPI_NCCL_GROUPS=1); without it this script stages group= over MPI (=0), so that
both routes keep a check.
--expect-refusal: ranks share a GPU with FLUXMPI_CUDA_OVER_MPI=0; a CUDA allreduce_ must raise
a ValueError naming the sharing on every rank, and a CPU one must still work.
"""

from __future__ import annotations

import sys

import torch

import fluxmpi_py as fm


def row_collectives(dev, rank, world, check) -> None:
    """gather, scatter, reduce_scatter, alltoall, the grouped forms, gradients and group= on
    ``dev``'s tensors, against closed forms (computed on the host)."""
    total = world * (world + 1) // 2
    first = rank * (rank + 1) // 2
    mine = torch.arange(float(first), float(first + rank + 1))  # rank r's rows of 0..total-1
    g = fm.gather(mine.to(dev), root_rank=world - 1)
    check("gather of uneven rows", (g is None) if rank != world - 1 else
          torch.equal(g.cpu(), torch.arange(float(total))))  # fmt: skip
    part = fm.scatter(torch.arange(float(total), device=dev), root_rank=0,
                      splits=[r + 1 for r in range(world)])  # fmt: skip
    check("scatter in uneven parts", torch.equal(part.cpu(), mine))
    for op, scale in (("sum", 1.0), ("average", 1.0 / world)):
        x = torch.arange(2.0 * world, device=dev) * (rank + 1)
        want = torch.arange(2.0 * rank, 2.0 * rank + 2) * total * scale
        got = fm.reduce_scatter(x, op=op)
        check(f"reduce_scatter {op} in equal parts", torch.allclose(got.cpu(), want))
    x = torch.arange(float(total), device=dev)
    got = fm.reduce_scatter(x, op="sum", splits=[r + 1 for r in range(world)])
    check("reduce_scatter in uneven parts", torch.equal(got.cpu(), mine * world))
    got = fm.alltoall(torch.full((2 * world,), float(rank), device=dev))
    want = torch.arange(float(world)).repeat_interleave(2)
    check("alltoall in equal parts", torch.equal(got.cpu(), want))
    splits = [(rank + j) % 2 + 1 for j in range(world)]  # rows for rank j
    got = fm.alltoall(torch.full((sum(splits),), float(rank), device=dev), splits=splits)
    want = torch.cat([torch.full(((j + rank) % 2 + 1,), float(j)) for j in range(world)])
    check("alltoall in uneven parts", torch.equal(got.cpu(), want))
    ts = [torch.full((5,), float(rank + 1), device=dev), torch.ones(3, 3, device=dev).double()]
    fm.grouped_allreduce_(ts)
    check("grouped_allreduce_ of two dtypes",
          bool((ts[0] == total).all()) and bool((ts[1] == world).all()))  # fmt: skip
    outs = fm.grouped_allgather([torch.full((rank + 1,), float(rank), device=dev)] * 2)
    want = torch.cat([torch.full((r + 1,), float(r)) for r in range(world)])
    check("grouped_allgather", all(torch.equal(o.cpu(), want) for o in outs))
    req = fm.Ialltoall(torch.full((world,), float(rank), device=dev))
    check("Ialltoall", torch.equal(req.wait().cpu(), torch.arange(float(world))))
    # gradients: allgather's is a reduce_scatter, gather's a scatter from the root
    w = torch.ones(3, device=dev, requires_grad=True)
    fm.allgather(w.unsqueeze(0)).sum().backward()
    check("allgather backward", bool((w.grad == world).all()))
    w = torch.ones(rank + 1, device=dev, requires_grad=True)
    y = fm.gather(w, root_rank=0)
    (y * torch.arange(float(total), device=dev)).sum().backward()
    check("gather backward", torch.equal(w.grad.cpu(), mine))
    # group=: a sub-communicator of the first and last rank (every rank at 1 and 2)
    members = sorted({0, world - 1})
    group = fm.new_group(members)
    if rank in members:
        t = torch.full((4,), float(rank + 1), device=dev)
        fm.allreduce_(t, group=group)
        got = fm.allgather(torch.full((1,), float(rank), device=dev), group=group)
        check("allreduce_ and allgather with group= (the first and last rank)",
              bool((t == sum(r + 1 for r in members)).all()) and
              torch.equal(got.cpu(), torch.tensor(members, dtype=torch.float32)))  # fmt: skip
        b = torch.arange(5.0, device=dev) * (rank + 1)
        fm.bcast_(b, root_rank=1 if len(members) > 1 else 0, group=group)  # the group's rank 1
        want = torch.arange(5.0) * (members[-1] + 1)
        a = torch.full((3,), float(rank + 1), device=dev)
        fm.allreduce_(a, "average", group=group)
        check("bcast_ from the group's last rank and an average with group=",
              torch.equal(b.cpu(), want) and
              bool((a == sum(r + 1 for r in members) / len(members)).all()))  # fmt: skip


def ddp_on_fluxmpi(dev, rank, world, check) -> None:
    """torch's DDP on the "fluxmpi" backend over ``dev``: after 3 steps at batch 4 per rank, the
    weights of one process at batch 4 * world."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fluxmpi")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    single = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    single.load_state_dict(net.state_dict())
    net, single = net.to(dev), single.to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.0005)  # 2 buckets
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(world * 4, 8, generator=gen), torch.randn(world * 4, 1, generator=gen)
    x, y = x.to(dev), y.to(dev)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    sopt = torch.optim.SGD(single.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[rank * 4 : rank * 4 + 4]), y[rank * 4 :][:4]).backward()
        opt.step()
        sopt.zero_grad()
        torch.nn.functional.mse_loss(single(x), y).backward()
        sopt.step()
    close = all(
        torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(net.parameters(), single.parameters())
    )
    check(f"DDP on the fluxmpi backend ({dev.type}) equals batch {world}B", close)


def large_gradient_buckets(dev, rank, world, check):
    """DistributedOptimizer on gradients of 4 KiB to 4 MiB under 5 MiB buckets: on CUDA every
    gradient is a view of a fused bucket (one pack and one NCCL call per bucket, issue 31),
    on the host those of 1 MiB and more go direct. Each rank's gradient is known, so the
    averaged step is checked against its value."""
    shapes = [(1 << 18,), (3, 1 << 18), (1000,), (1 << 20,)]  # 1 MiB, 3 MiB, 4 KB, 4 MiB
    for first in (None, 1):  # DDP's small first bucket (1 MiB), as an option
        params = [torch.nn.Parameter(torch.zeros(s, device=dev)) for s in shapes]
        opt = fm.DistributedOptimizer(
            torch.optim.SGD(params, lr=1.0), bucket_cap_mb=5, first_bucket_cap_mb=first
        )
        for _ in range(2):
            opt.zero_grad()
            sum((p * (rank + 1 + k)).sum() for k, p in enumerate(params)).backward()
            opt.step()
        # the gradient of params[k] on rank r is r + 1 + k: averaged, (world + 1) / 2 + k
        ok = all(
            torch.allclose(p, torch.full_like(p, -2 * ((world + 1) / 2 + k)))
            for k, p in enumerate(params)
        )
        check(
            f"DistributedOptimizer on 4 KiB to 4 MiB gradients in 5 MiB buckets "
            f"(first bucket {first or 5} MiB)",
            ok,
        )


def side_streams(dev, rank, world, check) -> None:
    """Tensors written on a side stream: a collective must wait, on the device, for the stream
    current when it was called. Each tensor is filled on stream s after a long sleep there
    (torch.cuda._sleep), so a collective that does not wait for s reduces the zeros before the
    fill. allreduce_, Iallreduce, torch.distributed.all_reduce on the fluxmpi backend (blocking
    and async_op=True), and DistributedOptimizer with forward and backward on s, against one
    process on the default stream. The CPU dry run has no streams and runs the same calls."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fluxmpi")
    cuda = dev.type == "cuda"
    s = torch.cuda.Stream(dev) if cuda else None
    want = world * (world + 1) / 2

    def on_s():
        return torch.cuda.stream(s) if cuda else _nullcontext()

    def filled_late():
        t = torch.zeros(1 << 20, device=dev)
        if cuda:
            torch.cuda._sleep(100_000_000)  # tens of ms of spinning on s before the fill
        t.fill_(rank + 1)
        return t

    cases = {
        "allreduce_": lambda t: fm.allreduce_(t),
        "Iallreduce(...).wait()": lambda t: fm.Iallreduce(t).wait(),
        "torch.distributed.all_reduce": lambda t: dist.all_reduce(t),
        "torch.distributed.all_reduce(async_op=True).wait()": lambda t: dist.all_reduce(
            t, async_op=True
        ).wait(),
    }
    for name, call in cases.items():
        with on_s():
            t = filled_late()
            call(t)
            ok = bool((t == want).all())  # read on s, after the wait
        check(f"{name} of a tensor filled on a side stream after a sleep", ok)

    # The async row collectives: the results are made on the engine's stream and read here, on
    # s, after wait(); rank r's rows hold r + 1.
    rows_want = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(1 << 20)
    row_cases = {
        "Iallgather(...).wait()": lambda t: fm.Iallgather(t).wait(),
        "allgather(..., async_op=True).wait()": lambda t: fm.allgather(t, async_op=True).wait(),
        "grouped_allgather([...], async_op=True).wait()": lambda t: fm.grouped_allgather(
            [t], async_op=True
        ).wait()[0],
    }
    for name, call in row_cases.items():
        with on_s():
            got = call(filled_late())
            ok = bool(torch.equal(got.cpu(), rows_want))  # read on s, after the wait
        check(f"{name} of a tensor filled on a side stream after a sleep", ok)

    def net():
        torch.manual_seed(3)
        return torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        ).to(dev)

    gen = torch.Generator().manual_seed(4)
    x_all, y_all = (
        torch.randn(world * 8, 64, generator=gen),
        torch.randn(world * 8, 1, generator=gen),
    )
    mine, single = net(), net()
    opt = fm.DistributedOptimizer(torch.optim.SGD(mine.parameters(), lr=0.1))
    sopt = torch.optim.SGD(single.parameters(), lr=0.1)
    with on_s():
        xs, ys = x_all[rank * 8 : rank * 8 + 8].to(dev), y_all[rank * 8 : rank * 8 + 8].to(dev)
        for _ in range(3):
            opt.zero_grad()
            if cuda:
                torch.cuda._sleep(50_000_000)
            torch.nn.functional.mse_loss(mine(xs), ys).backward()
            opt.step()
    torch.cuda.current_stream(dev).wait_stream(s) if cuda else None
    for _ in range(3):
        sopt.zero_grad()
        torch.nn.functional.mse_loss(single(x_all.to(dev)), y_all.to(dev)).backward()
        sopt.step()
    close = all(
        torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(mine.parameters(), single.parameters())
    )
    check(f"DistributedOptimizer with forward and backward on a side stream equals batch {world}B",
          close)  # fmt: skip


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def mixed_backend_string(dev, rank, world, check) -> None:
    """A group made with "cpu:fluxmpi,cuda:nccl" (the issue's mixed form; "cuda:gloo" in the
    CPU dry run, since a CPU torch has no NCCL): host tensors reduce on fluxmpi, CUDA tensors
    on torch's own NCCL backend."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("fluxmpi")
    # torch's NCCL refuses two ranks on one GPU ("invalid usage") where NCCL was not told to
    # let them share it (the route over MPI): gloo then takes the CUDA half.
    shared = fm.build_info().get("cuda_collectives") == "mpi"
    cuda_backend = "nccl" if dev.type == "cuda" and not shared else "gloo"
    group = dist.new_group(backend=f"cpu:fluxmpi,cuda:{cuda_backend}")
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=group)
    # The group's host backend, by the name torch's Backend reports (a sub-group runs on a
    # communicator of its members, so the world's agreement count no longer shows it).
    on_fluxmpi = group._get_backend(torch.device("cpu")).name() == "fluxmpi"
    check(f"cpu:fluxmpi,cuda:{cuda_backend}: a host all_reduce, on fluxmpi",
          on_fluxmpi and bool((t == world * (world + 1) / 2).all()))  # fmt: skip
    if dev.type == "cuda":
        u = torch.full((5,), float(rank + 1), device=dev)
        dist.all_reduce(u, group=group)
        check(f"cpu:fluxmpi,cuda:{cuda_backend}: a CUDA all_reduce (on {cuda_backend})",
              bool((u.cpu() == world * (world + 1) / 2).all()))  # fmt: skip


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--route", choices=("nccl", "mpi"), default=None)
    ap.add_argument("--expect-refusal", action="store_true")
    ap.add_argument(
        "--caller-stream", action="store_true", help="NCCL on the caller's stream (not its own)"
    )
    ap.add_argument("--host-wait", action="store_true", help="the host waits for each NCCL call")
    ap.add_argument("--nccl-groups", action="store_true", help="group= on CUDA over NCCL")
    ap.add_argument("--cpu", action="store_true", help="the same checks on CPU tensors (a dry run)")
    ap.add_argument(
        "--no-stream-waits",
        action="store_true",
        help="a negative control: the side-stream checks only, with the library's stream waits "
        "off; exits 0 only if some of them fail (the probe sees a missing wait)",
    )
    args = ap.parse_args()
    fm.Init()
    import fluxmpi_py._C as C

    C.set_nccl_comm_stream(not args.caller_stream)
    C.set_nccl_host_wait(args.host_wait)
    C.set_nccl_groups(args.nccl_groups)
    rank, world = fm.local_rank(), fm.total_workers()
    dev = torch.device("cpu") if args.cpu else torch.device("cuda", torch.cuda.current_device())
    failed = []

    def check(name, ok):
        print(f"rank {rank}: {'ok' if ok else 'FAIL'}: {name}", flush=True)
        if not ok:
            failed.append(name)

    if args.no_stream_waits:
        C.set_stream_waits(False)
        side_streams(dev, rank, world, check)
        C.set_stream_waits(True)
        print(f"rank {rank}: without the stream waits, {len(failed)} side-stream checks failed")
        return 0 if failed else 1

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
            # sharing is found by the GPU's physical identity (its UUID), not its index
            check("the sharing is named by the GPU's UUID", "share GPU-" in str(e))
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
    for part in (
        row_collectives,
        ddp_on_fluxmpi,
        mixed_backend_string,
        large_gradient_buckets,
        side_streams,
    ):  # never run on a GPU
        try:
            part(dev, rank, world, check)
        except Exception as e:  # noqa: BLE001 (reported as a failed check)
            check(f"{part.__name__} raised {type(e).__name__}: {e}", False)

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
