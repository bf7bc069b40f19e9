"""Training on virtual hosts whose link tests/test_multi_host.py cuts mid-training.

Every rank trains a small model with allreduced gradients, step after step, with
``Init(stall_warning=3, timeout=FLUXMPI_TEST_TIMEOUT or 30)`` (a report is printed once the
stall warning has passed and the others had 3 s to answer). Each rank prints one line when it
has taken its first steps, so the test knows when to cut; after the cut the ranks on both sides
wait in an allreduce that cannot complete, until the timeout ends them.
"""

import os
import socket
import time

import torch

import fluxmpi_py as fm

TIMEOUT = float(os.environ.get("FLUXMPI_TEST_TIMEOUT", "30"))


def main():
    fm.Init(stall_warning=3, timeout=TIMEOUT)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 8)
    fm.synchronize_(model)
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    step = 0
    while True:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step == 20:
            host = socket.gethostname()
            print(f"rank {fm.local_rank()} on {host} pid {os.getpid()} training", flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
