"""A rank that stalls, is killed or fails in a DataLoader worker. Usage: stall_worker.py MODE.

Every rank trains a small model with DistributedOptimizer; the last rank ("the staller")
misbehaves at step 3 while the others wait for it in the gradient allreduce.
    sleep       the staller sleeps 7 s in the middle of backward (stall_warning=2, no
                timeout), after its first gradients launched their reduction, then goes on:
                exit 0; the others wait in the gradient bucket's allreduce meanwhile
    timeout     the same, 120 s; FLUXMPI_STALL_WARNING / FLUXMPI_TIMEOUT from the test
    sigkill     the staller sends itself SIGKILL
    sigterm     the staller sends itself SIGTERM
    train       every rank trains until interrupted (at most 600 s), printing "training" after
                its first step; the test interrupts mpiexec, so "done" must never come
    loader      the staller's DataLoader worker raises
"""

import os
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402


class Failing(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if fm.local_rank() == fm.total_workers() - 1 and i >= 8:
            raise OSError(f"deliberate failure in a DataLoader worker reading item {i}")
        return torch.randn(8), torch.randn(2)


def stalled_in_user_code(seconds):
    time.sleep(seconds)


STALL_SECONDS = [0.0]  # set on the staller for one backward pass


class StallInBackward(torch.autograd.Function):
    """Identity whose backward sleeps STALL_SECONDS[0]: user code inside backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if STALL_SECONDS[0]:
            stalled_in_user_code(STALL_SECONDS[0])
            STALL_SECONDS[0] = 0.0
        return grad


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(8, 16)
        self.outer = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.outer(StallInBackward.apply(torch.relu(self.inner(x))))


def main(mode):
    torch.set_num_threads(1)
    if mode == "sleep":
        fm.Init(stall_warning=2, timeout=None)
    else:
        fm.Init()
    r, n = fm.local_rank(), fm.total_workers()
    staller = n - 1
    if mode == "other_group":  # rank 0 on a group of every rank, the others on the world
        group = fm.new_group(list(range(n)))
        if r == 0:
            fm.allreduce_(torch.ones(2), group=group)
        else:
            fm.allreduce_(torch.ones(3))  # the world's call under the same number
        return
    if mode == "outside_group":  # 3 ranks: rank 0 on group [0, 1], rank 1 in user code after
        group = fm.new_group([0, 1])  # a world call, rank 2 (not a member) in a world call
        if r == 0:
            fm.allreduce_(torch.ones(2), group=group)
        elif r == 1:
            time.sleep(30)
        else:
            fm.allreduce_(torch.ones(3))
        return
    model = Net()
    fm.synchronize_(model)
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    data = fm.DistributedDataContainer(Failing()) if mode == "loader" else None
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=1) if data else None
    batches = iter(loader) if loader else None
    t_start = time.monotonic()
    t_end = t_start + 600  # a safety bound only: the test ends the job long before
    step = 0
    while step < 6 or (mode == "train" and time.monotonic() < t_end):
        if r == staller and step == 3:
            if mode in ("sleep", "timeout"):
                STALL_SECONDS[0] = 7.0 if mode == "sleep" else 120.0
            elif mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif mode == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
        x, y = next(batches) if batches else (torch.randn(4, 8), torch.randn(4, 2))
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()  # the others wait here for the staller
        if mode == "train" and step == 0:
            print(f"rank {r} training", flush=True)
        step += 1
    print(f"rank {r} done: {step} steps in {time.monotonic() - t_start:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
