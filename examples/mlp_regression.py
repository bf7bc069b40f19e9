#!/usr/bin/env python
"""flashlight's distributed perceptron example in PyTorch: regression with a 10-100-1 MLP.

Each rank generates its own share of the data: 10 features uniform in [1, 2], the target the
sum of their cubes plus sin(2*pi*u) noise. The model (Linear 10->100, ReLU, Linear 100->1)
starts from rank 0's weights (synchronize_) and trains with SGD (lr 1e-4, momentum 0.9)
wrapped in DistributedOptimizer. After each epoch the mean squared error is averaged over the
ranks; rank 0 prints it every ``--log-every`` epochs (and the first and last), then one summary
line.

    mpiexec -n 2 python examples/mlp_regression.py
    python examples/mlp_regression.py --epochs 10       # a world of one
"""

import argparse
import math
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--samples", type=int, default=10000, help="total over all ranks")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--log-every", type=int, default=0, help="epochs between lines (0: a tenth of the run)"
    )
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.samples < 1:
        p.error("--epochs, --batch-size and --samples must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import fluxmpi_py as fm

    fm.Init()
    torch.set_num_threads(1)
    rank, world = fm.local_rank(), fm.total_workers()

    n_features = 10
    n_local = args.samples // world  # equal shares: every rank takes the same number of steps
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)  # each rank its own data
    x = torch.rand(n_local, n_features, generator=g) + 1.0  # features in [1, 2]
    y = (x**3).sum(1, keepdim=True) + torch.sin(2 * math.pi * torch.rand(n_local, 1, generator=g))
    # the data is this rank's own: a DataLoader over all of it is meant
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, generator=g)

    torch.manual_seed(args.seed + rank)
    model = fm.synchronize_(nn.Sequential(nn.Linear(n_features, 100), nn.ReLU(), nn.Linear(100, 1)))
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    )
    loss_fn = nn.MSELoss()

    every = args.log_every or max(1, args.epochs // 10)
    mse = []
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        total = torch.zeros(2, dtype=torch.float64)  # squared-error sum, samples
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(yb), len(yb)], dtype=torch.float64)
        fm.allreduce_(total, op="sum")
        mse.append(total[0].item() / total[1].item())
        if rank == 0 and (epoch == 1 or epoch % every == 0 or epoch == args.epochs):
            print(f"Epoch: {epoch} Mean Squared Error: {mse[-1]:.6f}", flush=True)
    if rank == 0:
        print(
            f"mlp_regression: {world} ranks, {args.epochs} epochs, {n_local * world} samples in "
            f"{time.perf_counter() - start:.1f} s; mean squared error {mse[0]:.4f} -> "
            f"{mse[-1]:.4f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
