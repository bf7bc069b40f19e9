"""A small training run that can be killed and resumed; run by tests/test_resume.py.

    resume_worker.py MODE[,MODE...] DIR

Several modes run one after another in one launch, each from the same seeds as a fresh process.

MODE: ``full`` trains TOTAL steps, saving a checkpoint (rng=True) after step K; ``killed``
does the same but SIGKILLs the last rank two steps after the checkpoint; ``resume`` loads the
checkpoint and trains to TOTAL; ``resume_norng`` does so without restoring the generators.
``restart`` is run by ``python -m fluxmpi_py.run --max-restarts 1``: it saves a checkpoint
every EVERY steps into DIR/restart/, starts from ``fm.latest_checkpoint`` of that directory,
and in its first attempt (FLUXMPI_RESTART=0) SIGKILLs the last rank two steps after step K.
Every mode but ``killed`` writes each rank's final model, optimizer and generator states to
DIR/final-MODE-rank<R>.pt. The loop draws from every generator a checkpoint restores: torch
(dropout, noise), numpy and Python's random; the data come shuffled from a
DistributedDataContainer through a DataLoader with two worker processes.
"""

import os
import random
import signal
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

TOTAL, K, BATCH, N = 15, 8, 4, 48  # 48 samples on 2 ranks: 6 steps per epoch; K is mid-epoch
EVERY = 4  # the restart mode's checkpoints: steps 4, 8 (the newest when it is killed), 12


def main(mode, directory):
    torch.set_num_threads(1)
    fm.Init()
    rank = fm.local_rank()
    ckpt = os.path.join(directory, "ckpt.pt")
    attempt = int(os.environ.get("FLUXMPI_RESTART", "0"))
    restarts_dir = os.path.join(directory, "restart")
    if mode == "restart" and rank == 0:
        os.makedirs(restarts_dir, exist_ok=True)  # only rank 0 writes checkpoints

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    data = torch.utils.data.TensorDataset(torch.randn(N, 8), torch.randn(N, 1))
    torch.manual_seed(100 + rank)  # each rank's own dropout and noise
    random.seed(200 + rank)
    np.random.seed(300 + rank)

    opt = fm.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), module=model)
    container = fm.DistributedDataContainer(data, shuffle=True, seed=5)
    loader = torch.utils.data.DataLoader(
        container, batch_size=BATCH, num_workers=2, generator=torch.Generator().manual_seed(9)
    )
    step, epoch = 0, 0
    if mode.startswith("resume"):
        loaded = fm.load_checkpoint(
            ckpt, model=model, optimizer=opt, data=container, rng=mode == "resume"
        )
        step, epoch = loaded["step"], container.epoch
    if mode == "restart":
        latest = fm.latest_checkpoint(restarts_dir, "ckpt-*.pt")
        if latest is not None:
            loaded = fm.load_checkpoint(latest, model=model, optimizer=opt, data=container)
            step, epoch = loaded["step"], container.epoch
        where = "the start" if latest is None else os.path.basename(latest)
        print(f"rank {rank}: attempt {attempt} starts at step {step} from {where}", flush=True)

    while step < TOTAL:
        container.set_epoch(epoch)  # the same epoch keeps a loaded position
        consumed = 0
        for x, y in loader:
            scale = 1.0 + random.random() * float(np.random.rand())
            loss = torch.nn.functional.mse_loss(model(x), y) * scale
            (loss + 0.01 * torch.randn(()) * loss.detach()).backward()
            opt.step()
            opt.zero_grad()
            step, consumed = step + 1, consumed + len(x)
            if step == K and mode in ("full", "killed"):
                state = container.state_dict(consumed=consumed)
                fm.save_checkpoint(
                    ckpt, rng=True, model=model, optimizer=opt, data=state, step=step
                )
            if mode == "restart" and step % EVERY == 0:
                state = container.state_dict(consumed=consumed)
                name = os.path.join(restarts_dir, f"ckpt-{step:03d}.pt")
                fm.save_checkpoint(
                    name, rng=True, model=model, optimizer=opt, data=state, step=step
                )
            killing = mode == "killed" or (mode == "restart" and attempt == 0)
            if killing and step == K + 2 and rank == fm.total_workers() - 1:
                print(f"rank {rank}: killing myself after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(60)
            if step == TOTAL:
                break
        epoch += 1

    fm.check_consistency((model, opt))
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": torch.from_numpy(np.random.get_state()[1].astype("int64")),
            "data": container.state_dict(consumed=consumed),
        },
        os.path.join(directory, f"final-{mode}-rank{rank}.pt"),
    )
    print(f"rank {rank}: {mode} done at step {step}", flush=True)


if __name__ == "__main__":
    for each in sys.argv[1].split(","):  # MODE,MODE: one after another in one launch
        main(each, sys.argv[2])
