#!/usr/bin/env python
"""Train a small CNN on scikit-learn's digits on N ranks: the `make demo`.

The data (1,797 8x8 images of handwritten digits) ships inside scikit-learn, so nothing is
downloaded. Every rank starts from its own random weights and synchronize_ makes them rank 0's;
each rank trains on its shard of the training set (DistributedDataContainer) and
DistributedOptimizer averages the gradients, so the ranks stay identical. Training images are
shifted at random by up to one pixel (each rank draws its own shifts). Loss and accuracy
are reduced across ranks every epoch; the run ends with the held-out accuracy and a check that
every rank holds the same weights (exit status 1 if either check fails).

    mpiexec -n 2 python examples/digits_cnn.py          # what `make demo` runs
    python examples/digits_cnn.py --epochs 3            # a world of one
"""

import argparse
import json
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument(
        "--lr", type=float, default=3e-3, help="peak learning rate (Adam, one-cycle schedule)"
    )
    p.add_argument("--seed", type=int, default=0, help="data split, shuffling and weights")
    p.add_argument("--test-fraction", type=float, default=0.2, help="held-out share of the data")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument(
        "--min-accuracy",
        type=float,
        default=0.95,
        help="exit with status 1 if the held-out accuracy ends below this",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (none either where the terminal has no width, as under mpiexec)",
    )
    p.add_argument("--checkpoint", metavar="PATH", help="save model and optimizer here at the end")
    p.add_argument("--summary", metavar="PATH", help="write the results as JSON here (rank 0)")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or not 0 < args.test_fraction < 1:
        p.error("--epochs and --batch-size must be >= 1 and --test-fraction in (0, 1)")
    return args


def main(argv=None):
    args = parse_args(argv)

    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from tqdm import tqdm

    import fluxmpi_py as fm

    t_start = time.perf_counter()
    fm.Init()
    torch.set_num_threads(args.threads)
    rank, world = fm.local_rank(), fm.total_workers()

    # The same split on every rank; each rank then takes its shard of the training part.
    digits = load_digits()
    x = (
        torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    )  # [0,16] -> [-1,1]
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx_train, idx_test = train_test_split(
        range(len(y)), test_size=args.test_fraction, random_state=args.seed, stratify=digits.target
    )
    train = fm.DistributedDataContainer(
        TensorDataset(x[idx_train], y[idx_train]), shuffle=True, seed=args.seed
    )
    # pad=False: every held-out image is counted exactly once across the ranks.
    test = fm.DistributedDataContainer(TensorDataset(x[idx_test], y[idx_test]), pad=False)

    torch.manual_seed(args.seed + rank)  # different on purpose: synchronize_ makes them rank 0's
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8x8 -> 4x4
        nn.Flatten(),
        nn.Dropout(0.25),
        nn.Linear(64 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )
    model = fm.synchronize_(model, root_rank=0)
    opt = fm.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr))
    opt = fm.synchronize_(opt, root_rank=0)
    loader = DataLoader(train, batch_size=args.batch_size)
    # Schedulers work on the wrapper as on the optimizer it wraps.
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.epochs * len(loader)
    )
    n_params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(
            f"digits: {len(idx_train)} training images ({len(train)} per rank on {world} "
            f"rank{'s' if world > 1 else ''}), {len(idx_test)} held out; "
            f"CNN with {n_params:,} parameters; {args.epochs} epochs",
            flush=True,
        )

    @torch.no_grad()
    def held_out_accuracy():
        model.eval()
        counts = torch.zeros(2, dtype=torch.int64)  # correct, seen
        for xb, yb in DataLoader(test, batch_size=256):
            counts += torch.tensor([(model(xb).argmax(1) == yb).sum().item(), len(yb)])
        model.train()
        fm.allreduce_(counts, op="sum")
        return counts[0].item(), counts[1].item()

    aug = torch.Generator().manual_seed(args.seed * 1000 + rank)

    def shift(xb):
        # Each image moved by up to one pixel in each direction; the border is background (-1).
        padded = F.pad(xb, (1, 1, 1, 1), value=-1.0)
        dx = torch.randint(0, 3, (len(xb),), generator=aug)
        dy = torch.randint(0, 3, (len(xb),), generator=aug)
        rows = (dy[:, None] + torch.arange(8))[:, :, None]
        cols = (dx[:, None] + torch.arange(8))[:, None, :]
        return padded[torch.arange(len(xb))[:, None, None], 0, rows, cols].unsqueeze(1)

    history = {"loss": [], "train_accuracy": [], "test_accuracy": []}
    # A live bar needs a terminal with a width: under mpiexec, Open MPI gives each rank a
    # pseudo-terminal 0 columns wide (whether mpiexec's own output is a terminal or a file),
    # where tqdm draws empty lines. There the epoch lines below are the progress.
    # (The terminal's own width: $COLUMNS, which shutil reads first, may be set regardless.)
    try:
        live = sys.stdout.isatty() and os.get_terminal_size(sys.stdout.fileno()).columns > 0
    except OSError:  # not a terminal
        live = False
    bar = tqdm(
        total=args.epochs * len(loader),
        unit="step",
        mininterval=0.25,
        file=sys.stdout,
        disable=rank != 0 or args.no_progress or not live,
        desc="training",
    )
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        stats = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, images
        for xb, yb in loader:
            opt.zero_grad()
            xb = shift(xb)
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            loss.backward()
            opt.step()
            sched.step()
            stats += torch.tensor(
                [loss.item() * len(yb), (out.argmax(1) == yb).sum().item(), len(yb)],
                dtype=torch.float64,
            )
            bar.update()
        fm.allreduce_(stats, op="sum")  # over all ranks: the epoch's loss and accuracy
        correct, seen = held_out_accuracy()
        history["loss"].append(stats[0].item() / stats[2].item())
        history["train_accuracy"].append(stats[1].item() / stats[2].item())
        history["test_accuracy"].append(correct / seen)
        if rank == 0:
            bar.set_postfix(loss=f"{history['loss'][-1]:.4f}")
            bar.write(
                f"epoch {epoch + 1:3d}/{args.epochs}  loss {history['loss'][-1]:.4f}  "
                f"train acc {100 * history['train_accuracy'][-1]:5.1f}%  "
                f"held-out acc {100 * correct / seen:5.1f}%",
                file=sys.stdout,
            )
    bar.close()

    # Every rank must hold the same weights: elementwise max and min over ranks must agree.
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    hi, lo = fm.allreduce_(flat.clone(), op="max"), fm.allreduce_(flat.clone(), op="min")
    max_diff = (hi - lo).abs().max().item()
    identical = max_diff == 0.0

    if args.checkpoint:
        fm.save_checkpoint(args.checkpoint, model=model, optimizer=opt, epoch=args.epochs)
    seconds = time.perf_counter() - t_start
    accuracy = history["test_accuracy"][-1]
    ok = identical and accuracy >= args.min_accuracy
    if rank == 0:
        print(
            f"held-out accuracy: {100 * accuracy:.1f}% ({correct}/{seen} images never seen in "
            f"training; bar {100 * args.min_accuracy:.0f}%)"
        )
        ranks = f"{world} rank{'s' if world > 1 else ''}"
        if identical:
            print(f"weights identical on all {ranks}: yes (all {n_params:,} parameters equal)")
        else:
            print(
                f"weights identical on all {ranks}: NO (the ranks differ by up to {max_diff:g} "
                f"in a parameter, over {n_params:,} parameters)"
            )
        print(f"done in {seconds:.1f} s: {'OK' if ok else 'FAILED'}", flush=True)
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump(
                    {
                        "world_size": world,
                        "epochs": args.epochs,
                        **history,
                        "held_out_accuracy": accuracy,
                        "held_out_images": seen,
                        "weights_identical": identical,
                        "max_weight_difference": max_diff,
                        "seconds": seconds,
                    },
                    f,
                )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
