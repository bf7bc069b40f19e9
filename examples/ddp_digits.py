#!/usr/bin/env python
"""A PyTorch DDP training script, moved to fluxmpi_py by changing one line.

Everything below is plain torch.distributed: init_process_group, a DistributedSampler,
DistributedDataParallel and all_reduce for the metrics. With backend "fluxmpi" and the
"fluxmpi://" rendezvous it runs under mpiexec (rank and size from MPI, no MASTER_ADDR). It
trains a small MLP on scikit-learn's digits (nothing is downloaded), prints the held-out
accuracy on rank 0, and exits with status 1 if it is below --min-accuracy or if the ranks'
weights differ.

    mpiexec -n 2 python examples/ddp_digits.py
"""

import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import fluxmpi_py  # noqa: F401  (registers the "fluxmpi" backend and fluxmpi://)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--min-accuracy", type=float, default=0.9, help="exit 1 below this")
    return p.parse_args(argv)


def mean_over_ranks(value: float) -> float:
    t = torch.tensor(value)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group("fluxmpi", init_method="fluxmpi://")  # was: ("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(rank)  # different starting weights: DDP broadcasts rank 0's

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0)
    train = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(train, seed=0)  # rank and size from the default group
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()  # DDP averages the gradients over the ranks
            optimizer.step()
            total += loss.item()
        loss_avg = mean_over_ranks(total / len(loader))
        if rank == 0:
            print(f"epoch {epoch + 1:3d}/{args.epochs}  train loss {loss_avg:.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    accuracy = mean_over_ranks(accuracy)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(every, flat)
    identical = all(torch.equal(every[0], f) for f in every)
    ok = accuracy >= args.min_accuracy and identical
    if rank == 0:
        print(f"held-out accuracy: {100 * accuracy:.1f}% ({len(y_test)} images)")
        print(f"weights identical on all {size} ranks: {'yes' if identical else 'NO'}")
        print("OK" if ok else f"FAILED: accuracy below {args.min_accuracy} or weights differ")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
