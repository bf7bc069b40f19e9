"""Training-step time on CUDA at 2 ranks: ours (DistributedOptimizer over NCCL) against DDP on
NCCL and against no communication, all in the same launch, interleaved in shuffled rounds.

    mpiexec -n 2 python benchmarks/bench_gpu_step.py [--quick]

On a machine with one GPU, both ranks share it: scripts/gpu_check.sh launches this with a
distinct NCCL_HOSTID per rank so that NCCL accepts two ranks on one device (both ours and DDP
then run over NCCL's socket transport, the same for both). Workloads: ResNet-50's 161
parameter shapes (trivial compute, so the step is backward's launches, the gradient traffic
and the optimizer) in fp32 and in bf16, and torchvision's ResNet-50 at batch 16 (fp32) where
torchvision is installed. Variants: local (no communication), ours, ours with
compression="bf16" (fp32 models), ours as before issue 31 (the host waiting for each NCCL
call, on the caller's stream: FLUXMPI_NCCL_HOST_WAIT=1 FLUXMPI_NCCL_COMM_STREAM=0), DDP on NCCL (default buckets, and gradient_as_bucket_view),
DDP with torch's bf16_compress_hook (fp32 models). --plans adds bucket plans of ours:
a first bucket of 1 MiB (DDP's), and buckets of 10, 50 and 100 MiB. (The plan before issue
31, CUDA gradients of 1 MiB or more each in an NCCL call of its own, measured 162.6 ms against
89.7 ms on an H100 on 2026-11-27: `cuda_direct_min_bytes=1 << 20`.)

Prints one JSON line (rank 0): per workload, each variant's step time in ms (the slowest
rank's median), and the ratios ddp/ours and ours/local.
"""

import argparse
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, resnet50_param_shapes  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py._C as C  # noqa: E402


class ShapesModel(nn.Module):
    """ResNet-50's parameter shapes with trivial compute: backward + communication + step."""

    def __init__(self, shapes, dtype, dev):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.ps = nn.ParameterList(
            [nn.Parameter((torch.randn(s, generator=gen) * 0.01).to(dev, dtype)) for s in shapes]
        )
        self.ws = [torch.randn(s, generator=gen).to(dev, dtype) for s in shapes]

    def forward(self, x):
        return sum((p * w).sum() for p, w in zip(self.ps, self.ws)) * x.mean()


def workloads(quick, dev):
    shapes = resnet50_param_shapes(4 if quick else 1)
    out = {
        "resnet50_shapes_fp32": (
            lambda: ShapesModel(shapes, torch.float32, dev),
            lambda: torch.ones(2, device=dev),
            None,
            True,
        ),
        "resnet50_shapes_bf16": (
            lambda: ShapesModel(shapes, torch.bfloat16, dev),
            lambda: torch.ones(2, device=dev, dtype=torch.bfloat16),
            None,
            False,
        ),
    }
    try:
        import torchvision
    except ImportError:
        return out
    batch = 4 if quick else 16
    out["resnet50_batch16_fp32"] = (
        lambda: torchvision.models.resnet50().to(dev),
        lambda: torch.randn(batch, 3, 224, 224, device=dev),
        lambda: torch.randint(0, 1000, (batch,), device=dev),
        True,
    )
    return out


def loss_of(model, x, y):
    out = model(x)
    return out.float() if y is None else nn.functional.cross_entropy(out, y)


def variants_for(make_model, x, y, fp32, plans=False):
    """One step function per variant, each with its own model and optimizer."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    steps = {}
    built = make_model

    def make_model():  # the same initial weights on every rank (torchvision's use the RNG)
        torch.manual_seed(0)
        return built()

    def plain(model, opt):
        def step():
            opt.zero_grad()
            loss_of(model, x, y).backward()
            opt.step()

        return step

    m = make_model()
    steps["local"] = plain(m, torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9))
    for label, compression in (("ours", None), ("ours_bf16", "bf16")):
        if compression and not fp32:
            continue
        m = make_model()
        sgd = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        steps[label] = plain(m, fm.DistributedOptimizer(sgd, compression=compression))
    if plans:
        for label, options in (
            ("ours_first_bucket_1mib", {"first_bucket_cap_mb": 1}),
            ("ours_bucket_10mb", {"bucket_cap_mb": 10}),
            ("ours_bucket_50mb", {"bucket_cap_mb": 50}),
            ("ours_bucket_100mb", {"bucket_cap_mb": 100}),
        ):
            m = make_model()
            sgd = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
            steps[label] = plain(m, fm.DistributedOptimizer(sgd, **options))
    # The NCCL mode before issue 31, for its step only: the host waits for each call, which
    # runs on the caller's stream (FLUXMPI_NCCL_HOST_WAIT=1 FLUXMPI_NCCL_COMM_STREAM=0).
    m = make_model()
    blocking = plain(
        m, fm.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9))
    )

    def ours_host_wait():
        before = C.nccl_comm_stream(), C.nccl_host_wait()
        C.set_nccl_comm_stream(False)
        C.set_nccl_host_wait(True)
        try:
            blocking()
        finally:
            C.set_nccl_comm_stream(before[0])
            C.set_nccl_host_wait(before[1])

    steps["ours_host_wait"] = ours_host_wait
    ddps = [("ddp_nccl", False, None), ("ddp_nccl_bucket_view", True, None)]
    if fp32:
        ddps.append(("ddp_nccl_bf16_hook", False, default_hooks.bf16_compress_hook))
    for label, view, hook in ddps:
        ddp = nn.parallel.DistributedDataParallel(
            make_model(), gradient_as_bucket_view=view, broadcast_buffers=False
        )
        if hook is not None:
            ddp.register_comm_hook(None, hook)
        steps[label] = plain(ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9))
    return steps


def init_ours_and_ddp(port):
    """Init() and torch's NCCL process group beside it (DDP's, on ``port``); (rank, world,
    this rank's CUDA device)."""
    fm.Init()
    rank, world = fm.local_rank(), fm.total_workers()
    dev = torch.device("cuda", torch.cuda.current_device())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    return rank, world, dev


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes, few reps (a smoke test)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--plans", action="store_true", help="also ours with other bucket plans")
    ap.add_argument("--workloads", nargs="*", default=None, help="these workloads only")
    args = ap.parse_args()

    rank, world, dev = init_ours_and_ddp(args.port)
    rounds = args.rounds or (3 if args.quick else 7)
    reps = 3 if args.quick else 10

    def sync():
        torch.cuda.synchronize(dev)

    record = {
        "bench": "gpu_step",
        "device": torch.cuda.get_device_name(dev),
        "world": world,
        "nccl_hostid": "NCCL_HOSTID" in os.environ,
        "cuda_collectives": fm.build_info().get("cuda_collectives"),
        "cpus_per_rank": len(os.sched_getaffinity(0)),
        "cuda_schedule": fm.build_info()["cuda_schedule"],  # FLUXMPI_CUDA_SCHEDULE, or "auto"
        "workloads": {},
    }
    for name, (make_model, make_x, make_y, fp32) in workloads(args.quick, dev).items():
        if args.workloads and name not in args.workloads:
            continue
        torch.manual_seed(1 + rank)  # each rank its own batch
        x, y = make_x(), (make_y() if make_y else None)
        steps = variants_for(make_model, x, y, fp32, args.plans)
        times = {k: [] for k in steps}
        order = list(steps)
        shuffle = random.Random(7)  # the same order on every rank: DDP's collectives must meet
        for step in steps.values():  # warm-up: NCCL communicators, DDP's buckets, allocator
            step()
            step()
        sync()
        for _ in range(rounds):
            shuffle.shuffle(order)
            for k in order:
                per = []
                for _ in range(reps):
                    sync()
                    t0 = time.perf_counter()
                    steps[k]()
                    sync()  # wall time to the end of the step's GPU work
                    per.append((time.perf_counter() - t0) * 1e3)
                times[k].append(sorted(per)[len(per) // 2])
        med = torch.tensor([sorted(v)[len(v) // 2] for v in times.values()], dtype=torch.float64)
        fm.allreduce_(med, "max")  # the slowest rank's median per variant
        ms = {k: round(float(v), 3) for k, v in zip(times, med)}
        rec = {"step_ms": ms, "ddp_nccl_over_ours": round(ms["ddp_nccl"] / ms["ours"], 3)}
        rec["ddp_bucket_view_over_ours"] = round(ms["ddp_nccl_bucket_view"] / ms["ours"], 3)
        rec["ours_over_local"] = round(ms["ours"] / ms["local"], 3)
        rec["ddp_nccl_over_ours_host_wait"] = round(ms["ddp_nccl"] / ms["ours_host_wait"], 3)
        if "ours_first_bucket_1mib" in ms:
            rec["ddp_nccl_over_ours_first_bucket_1mib"] = round(
                ms["ddp_nccl"] / ms["ours_first_bucket_1mib"], 3
            )
        if "ours_bf16" in ms:
            rec["ddp_bf16_hook_over_ours_bf16"] = round(
                ms["ddp_nccl_bf16_hook"] / ms["ours_bf16"], 3
            )
        record["workloads"][name] = rec
    emit("bench_gpu_step.quick" if args.quick else "bench_gpu_step", record, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
