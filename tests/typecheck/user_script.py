"""A user's script as a type checker reads it: `make lint` runs mypy over this file with the
package, so a public name that the checker cannot see (an `fm.X` filled in at run time) or a
wrong signature fails the lint. Never run; pytest does not collect it."""

from __future__ import annotations

import torch

import fluxmpi_py as fm
import fluxmpi_py.horovod as hvd


def train(dataset: torch.utils.data.Dataset) -> float:
    fm.Init()
    model = torch.nn.Linear(4, 1)
    fm.synchronize_(model, root_rank=0)
    data = fm.DistributedDataContainer(dataset, shuffle=True, seed=0)
    opt = fm.DistributedOptimizer(torch.optim.AdamW(model.parameters()))
    fm.synchronize_(opt)
    loss = torch.zeros(())
    for x, y in torch.utils.data.DataLoader(data, batch_size=8):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    total = fm.allreduce_(loss.detach().clone(), op="average")
    if fm.local_rank() == 0:
        fm.fluxmpi_println(f"{fm.total_workers()} ranks, loss {total.item():.3f}")
    fm.barrier()
    return float(total)


def horovod_face() -> int:
    hvd.init()
    t = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    return hvd.rank() + int(t.sum())
