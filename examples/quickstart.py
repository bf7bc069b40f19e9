#!/usr/bin/env python
"""FluxMPI's Quick Start in PyTorch: fit y = x^2 with a tiny network, data-parallel.

Each rank draws its own 16 points (seeded by its rank) and starts from its own random
weights; synchronize_ gives every rank rank 0's weights and optimizer state, and
DistributedOptimizer averages the gradients, so all ranks train the same model. Rank 0
prints its loss every tenth of the run and one summary line at the end; ``--all-ranks`` has
every rank print its own loss each epoch, as FluxMPI's Quick Start does.

    mpiexec -n 2 python examples/quickstart.py
    python examples/quickstart.py              # a world of one
"""

import argparse
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--points", type=int, default=16, help="data points per rank")
    p.add_argument("--quiet", action="store_true", help="print the summary line only")
    p.add_argument(
        "--all-ranks", action="store_true", help="every rank prints its loss each epoch (FluxMPI's)"
    )
    args = p.parse_args(argv)
    if args.epochs < 1 or args.points < 1:
        p.error("--epochs and --points must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)

    import torch
    from torch import nn

    import fluxmpi_py as fm

    fm.Init(verbose=args.all_ranks)
    torch.set_num_threads(1)

    torch.manual_seed(fm.local_rank())  # every rank: its own data and its own initial weights
    model = nn.Sequential(nn.Linear(1, 2), nn.Tanh(), nn.Linear(2, 1))
    model = fm.synchronize_(model, root_rank=0)

    x = torch.rand(args.points, 1)
    y = x**2

    opt = fm.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr))
    opt = fm.synchronize_(opt, root_rank=0)

    def loss_fn():
        return ((model(x) - y) ** 2).sum()  # FluxMPI's sum(abs2, model(x) .- y)

    every = max(1, args.epochs // 10)  # rank 0's lines: epoch 1, every tenth of the run, last

    def report(epoch):
        if args.all_ranks:
            return True
        periodic = epoch == 1 or epoch % every == 0 or epoch == args.epochs
        return not args.quiet and fm.local_rank() == 0 and periodic

    losses = []
    t1 = time.time()
    for epoch in range(1, args.epochs + 1):
        opt.zero_grad()
        loss = loss_fn()
        losses.append(loss.item())
        if report(epoch):
            fm.fluxmpi_println(f"Epoch {epoch}: Loss {loss.item():.6f}")
        loss.backward()
        opt.step()  # gradients averaged over the ranks, then Adam
    seconds = time.time() - t1

    # The loss averaged over the ranks, first and last epoch; and the ranks' weights agree.
    ends = fm.allreduce_(torch.tensor([losses[0], losses[-1]], dtype=torch.float64), op="average")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spread = (
        (fm.allreduce_(flat.clone(), op="max") - fm.allreduce_(flat.clone(), op="min")).abs().max()
    )
    if fm.local_rank() == 0:  # one line: what the run did
        print(
            f"quickstart: {fm.total_workers()} ranks, {args.epochs} epochs in {seconds:.2f} s; "
            f"mean loss over ranks: epoch 1 {ends[0].item():.6f} -> epoch {args.epochs} "
            f"{ends[1].item():.6f}; parameters identical on all {fm.total_workers()} ranks: "
            f"{spread.item() == 0.0}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
