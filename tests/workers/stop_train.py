"""A preemptible training loop, as a user writes it; run by tests/test_slurm.py and
tests/test_stop.py under srun, sbatch, mpiexec and ``python -m fluxmpi_py.run``.

    stop_train.py DIR STEPS [--delay S] [--signal-at K] [--kill-at K]

Each rank prints what Init gave it (rank, size, node-local rank, the Slurm job). The loop is
the natural one: it resumes from ``fm.latest_checkpoint(DIR)`` with ``rng=True``, builds its
DataLoader without a ``generator=`` over a DistributedDataContainer, and the model has
dropout. After every step it asks ``fm.stop_requested()``: on a stop it saves DIR/ckpt-<step>.pt
and exits with ``fm.REQUEUE_STATUS``. Rank 0 writes the number of steps done to DIR/progress.
``--workers N``: DataLoader workers; ``--generator``: the DataLoader gets a generator of its
own. ``--signal-at K``: the last rank sends itself SIGUSR1 after step K (one rank, as a scheduler's
signal may reach only one). ``--hold``: before the last step of a run that did not resume, the
ranks wait (barriers, up to HOLD_S) for a stop, so that a signal sent from outside lands before the end however loaded the
machine is. ``--kill-at K``: the last rank SIGKILLs itself after step K. At the
end every rank prints the digest of its model, optimizer and generator state; the ranks must
hold the same model and optimizer.
"""

import argparse
import hashlib
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import fluxmpi_py as fm

BATCH, N = 8, 256  # 128 samples per rank on 2 ranks: 16 steps per epoch
HOLD_S = 120.0  # --hold: the longest wait for a stop before the last step


def digest(*objects):
    """A hash of the tensors' bytes and the other values in nested dicts and lists (not of
    torch.save's bytes, which hold a serialization id of their own)."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            h.update(str((x.dtype, tuple(x.shape))).encode())
            h.update(x.detach().contiguous().view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(str(k).encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            h.update(repr(x).encode())

    walk(objects)
    return h.hexdigest()[:16]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("steps", type=int)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--signal-at", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--hold", action="store_true", help="wait for a stop before the last step")
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--generator", action="store_true", help="DataLoader(generator=...)")
    args = p.parse_args()
    torch.set_num_threads(1)
    fm.Init(verbose=True)
    rank, size = fm.local_rank(), fm.total_workers()
    print(
        f"task rank={rank} size={size} node_rank={fm.node_local_rank()} "
        f"node_size={fm.node_size()} job={os.environ.get('SLURM_JOB_ID', '-')} "
        f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')}",
        flush=True,
    )
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, 8, generator=g), torch.randn(N, 1, generator=g)
    data = fm.DistributedDataContainer(torch.utils.data.TensorDataset(x, y), shuffle=True, seed=3)
    torch.manual_seed(0)  # the same model in every run (synchronize_ makes it rank 0's anyway)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
    )
    model = fm.synchronize_(model)
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    torch.manual_seed(100 + rank)  # each rank's own dropout
    # no generator=: the trap (a container loaded mid-epoch undoes the draw, or warns)
    own = torch.Generator().manual_seed(7) if args.generator else None
    loader = torch.utils.data.DataLoader(
        data, batch_size=BATCH, num_workers=args.workers, generator=own
    )

    step, epoch = 0, 0
    latest = fm.latest_checkpoint(args.dir, "ckpt-*.pt")
    if latest is not None:
        step = fm.load_checkpoint(latest, model=model, optimizer=opt, data=data, rng=True)["step"]
        epoch = data.epoch
        print(f"rank {rank}: resumed from {os.path.basename(latest)} at step {step}", flush=True)
    while step < args.steps:
        data.set_epoch(epoch)  # the same epoch keeps a loaded position
        consumed = 0
        for xb, yb in loader:
            opt.zero_grad()
            F.mse_loss(model(xb), yb).backward()
            opt.step()
            step, consumed = step + 1, consumed + len(xb)
            if rank == 0:
                with open(os.path.join(args.dir, "progress"), "w") as f:
                    f.write(str(step))
            if rank == size - 1 and step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR1)
            if rank == size - 1 and step == args.kill_at:
                print(f"rank {rank}: killing myself after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(args.delay)
            if args.hold and latest is None and step == args.steps - 1:  # not once resumed
                # the same number of barriers on every rank: the stop is agreed at one of them
                for _ in range(int(HOLD_S / 0.1)):
                    fm.barrier()
                    if fm.stop_requested():
                        break
                    time.sleep(0.1)
            if fm.stop_requested():
                path = os.path.join(args.dir, f"ckpt-{step:04d}.pt")
                state = data.state_dict(consumed=consumed)
                fm.save_checkpoint(
                    path, model=model, optimizer=opt, data=state, step=step, rng=True
                )
                print(f"rank {rank}: stopped after step {step}, saved {path}", flush=True)
                sys.exit(fm.REQUEUE_STATUS)
            if step == args.steps:
                break
        epoch += 1
    fm.check_consistency((model, opt))
    print(f"rank {rank}: digest {digest(model.state_dict(), opt.state_dict())} "
          f"rng {digest(torch.get_rng_state())} at step {step}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
