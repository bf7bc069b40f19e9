"""A soak: STEPS training steps of a tiny model on every rank; run by tests/test_soak.py.

    soak_worker.py STEPS DIR

Each step runs DistributedOptimizer (with module buffers and check_every), an allreduce_ of
the loss and, every 500 steps, save_checkpoint to DIR. After a warm-up of WARMUP steps the
resident memory (RSS) and the number of open file descriptors are sampled every 500 steps;
each rank prints them and fails unless the descriptors stay the same and RSS grows by less
than RSS_SLACK over the run.
"""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

WARMUP, EVERY = 500, 500
RSS_SLACK = 2 << 20  # bytes: a leak of 1 KiB a step over 2500 steps is past it


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def main(steps, directory):
    torch.set_num_threads(1)
    fm.Init()
    rank = fm.local_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1)
    )
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  module=model, check_every=100)  # fmt: skip
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    samples = []
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        fm.allreduce_(loss.detach(), "average")
        if step % EVERY == 0:
            fm.save_checkpoint(os.path.join(directory, "soak.pt"), model=model, optimizer=opt)
        if step >= WARMUP and step % EVERY == 0:
            samples.append((step, rss_bytes(), open_fds()))
    seconds = time.perf_counter() - t0
    shown = ", ".join(f"step {s}: {r / 2**20:.2f} MiB, {n} fds" for s, r, n in samples)
    print(f"rank {rank}: {steps} steps in {seconds:.1f}s; {shown}", flush=True)
    growth = samples[-1][1] - samples[0][1]
    assert growth < RSS_SLACK, f"rank {rank}: RSS grew by {growth} bytes: {shown}"
    assert len({n for _, _, n in samples}) == 1, f"rank {rank}: open descriptors changed: {shown}"
    print(f"rank {rank}: flat (RSS +{growth / 2**10:.0f} KiB)", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
