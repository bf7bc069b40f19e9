#!/usr/bin/env python
"""A Horovod training script, moved to fluxmpi_py by changing its import line.

Everything below is written as for `horovod.torch`: hvd.init, a DistributedSampler over
hvd.size() ranks, hvd.DistributedOptimizer with named_parameters, broadcast_parameters and
broadcast_optimizer_state from rank 0, and metrics averaged with hvd.allreduce. It trains a
small MLP on scikit-learn's digits (nothing is downloaded), prints the held-out accuracy on
rank 0, and exits with status 1 if it is below --min-accuracy or if the ranks' weights differ.

    mpiexec -n 2 python examples/horovod_digits.py
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import fluxmpi_py.horovod as hvd  # was: import horovod.torch as hvd


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument("--lr", type=float, default=0.01, help="scaled by hvd.size(), as Horovod's")
    p.add_argument("--min-accuracy", type=float, default=0.9, help="exit 1 below this")
    return p.parse_args(argv)


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()  # average over the ranks


def main(argv=None) -> int:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(hvd.rank())  # different starting weights: broadcast_parameters fixes that

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    train = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
        loss_avg = metric_average(total / len(loader), "avg_loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:3d}/{args.epochs}  train loss {loss_avg:.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    accuracy = metric_average(accuracy, "avg_accuracy")  # every rank scores the same test set
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0))  # one row per rank
    identical = bool((gathered == gathered[0]).all())
    ok = accuracy >= args.min_accuracy and identical
    if hvd.rank() == 0:
        print(f"held-out accuracy: {100 * accuracy:.1f}% ({len(y_test)} images)")
        print(f"weights identical on all {hvd.size()} ranks: {'yes' if identical else 'NO'}")
        print("OK" if ok else f"FAILED: accuracy below {args.min_accuracy} or weights differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
