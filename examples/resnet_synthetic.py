#!/usr/bin/env python
"""Training throughput (images/s) of a small ResNet on synthetic images, ours against DDP.

Every rank trains the same ResNet (CIFAR-style: 3 stages of basic blocks) on a fixed batch
of random images, with SGD, in two ways in the same launch: wrapped in fluxmpi_py's
DistributedOptimizer, and as torch DistributedDataParallel over gloo. The modes alternate in
rounds and the best round of each counts, which evens out a noisy, shared machine. Rank 0
prints one JSON line: step time (ms) and throughput (images/s over all ranks) per mode.
Weak scaling: the batch per rank stays fixed as ranks are added. benchmarks/plot_scaling.py
runs it at 1..N ranks and draws the picture.

    mpiexec -n 2 python examples/resnet_synthetic.py
    mpiexec -n 2 python examples/resnet_synthetic.py --quick        # seconds, for tests
"""

import argparse
import gc
import inspect
import json
import os
import socket
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--mode", choices=("both", "fluxmpi", "ddp"), default="both")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--width", type=int, default=16, help="channels of the first stage")
    p.add_argument("--blocks", type=int, default=3, help="basic blocks per stage (3: ResNet-20)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the first round")
    p.add_argument("--rounds", type=int, default=3, help="rounds per mode, alternating modes")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes (width 4, 16x16 images, batch 4, 2 steps, 1 round)",
    )
    p.add_argument("--out", metavar="PATH", help="also write the JSON line to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.width, args.image_size, args.batch_size, args.blocks = 4, 16, 4, 1
        args.steps, args.warmup, args.rounds = 2, 1, 1
    if min(args.batch_size, args.image_size, args.width, args.blocks, args.steps, args.rounds) < 1:
        p.error("sizes, --steps and --rounds must be >= 1")
    return args


def build_resnet(width, blocks, classes=10):
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.shortcut = (
                nn.Identity()
                if stride == 1 and cin == cout
                else nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )
            )
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    layers = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(inplace=True),
    ]
    cin = width
    for stage, cout in enumerate((width, 2 * width, 4 * width)):
        for b in range(blocks):
            layers.append(BasicBlock(cin, cout, 2 if stage > 0 and b == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def _rendezvous(fm, torch):
    """Address and free port of rank 0, for gloo's TCP store, sent over MPI."""
    single_node = _one_node(fm, torch)
    port = torch.zeros(1, dtype=torch.int64)
    host = b""
    if fm.local_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port[0] = s.getsockname()[1]
        host = b"127.0.0.1" if single_node else socket.gethostname().encode()
    fm.bcast_(port, root_rank=0)
    n = fm.bcast_(torch.tensor([len(host)], dtype=torch.int64), root_rank=0)
    buf = (
        torch.tensor(list(host), dtype=torch.uint8)
        if fm.local_rank() == 0
        else torch.zeros(int(n.item()), dtype=torch.uint8)
    )
    fm.bcast_(buf, root_rank=0)
    return os.environ.get("MASTER_ADDR", bytes(buf.tolist()).decode()), int(port.item())


def _one_node(fm, torch):
    """True when every rank runs on the same node (one node-local rank 0 in the job)."""
    leaders = torch.tensor([1 if fm.node_local_rank() == 0 else 0], dtype=torch.int64)
    return fm.allreduce_(leaders, op="sum").item() == 1


def main(argv=None):
    args = parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import fluxmpi_py as fm

    fm.Init()
    torch.set_num_threads(args.threads)
    rank, world = fm.local_rank(), fm.total_workers()

    torch.manual_seed(0)  # the same initial model for both modes, on every rank
    template = build_resnet(args.width, args.blocks)
    g = torch.Generator().manual_seed(1 + rank)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
    labels = torch.randint(0, 10, (args.batch_size,), generator=g)

    runners = {}
    if args.mode in ("both", "fluxmpi"):
        model = build_resnet(args.width, args.blocks)
        model.load_state_dict(template.state_dict())
        opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))

        def step_ours(model=model, opt=opt):
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()

        runners["fluxmpi_py"] = step_ours
    if args.mode in ("both", "ddp"):
        addr, port = _rendezvous(fm, torch)
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world
        )
        model = build_resnet(args.width, args.blocks)
        model.load_state_dict(template.state_dict())
        # Buffers are not broadcast at each forward: neither side synchronizes BatchNorm statistics, so both
        # measure the gradient reduction alone. gradient_as_bucket_view is DDP's faster setting.
        sync_off = (
            {"forward_sync_buffers": False}
            if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
            else {"broadcast_buffers": False}
        )
        ddp = DDP(model, gradient_as_bucket_view=True, **sync_off)
        opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

        def step_ddp(model=ddp, opt=opt_ddp):
            opt.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            opt.step()

        runners["ddp_gloo"] = step_ddp

    for run in runners.values():
        for _ in range(args.warmup):
            run()
    rounds = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            fm.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                run()
            fm.barrier()
            rounds[name].append((time.perf_counter() - t0) / args.steps)
    # Rank 0's clock decides; max over ranks makes the slowest rank the one that counts.
    results = {}
    for name, times in rounds.items():
        t = fm.allreduce_(torch.tensor(times, dtype=torch.float64), op="max")
        best = t.min().item()
        results[name] = {
            "step_ms": 1e3 * best,
            "images_per_s": world * args.batch_size / best,
            "rounds_ms": [round(1e3 * v, 3) for v in t.tolist()],
        }
    if dist.is_initialized():
        # Tear gloo down here, on every rank together: left to the garbage collector at exit,
        # one rank could block in gloo's destructors while the other is already leaving MPI.
        runners.clear()
        del ddp, opt_ddp, step_ddp
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()

    if rank == 0:
        report = {
            "benchmark": "resnet_synthetic",
            "ranks": world,
            "batch_per_rank": args.batch_size,
            "image_size": args.image_size,
            "width": args.width,
            "blocks_per_stage": args.blocks,
            "parameters": sum(p.numel() for p in template.parameters()),
            "threads_per_rank": args.threads,
            "steps": args.steps,
            "rounds": args.rounds,
            "results": results,
        }
        if len(results) == 2:
            report["ddp_over_ours_step_time"] = (
                results["ddp_gloo"]["step_ms"] / results["fluxmpi_py"]["step_ms"]
            )
        line = json.dumps(report)
        print(line, flush=True)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
