"""A training script for ``python -m fluxmpi_py.reproduce`` (tests/test_reproducible.py): a
small CNN and an MLP, both with BatchNorm, trained side by side with AdamW and gradient
accumulation (12 micro-batches of 2 samples a step, dealt by the global-batch sampler) for 30
steps, with ``fm.record_step`` after each. ``--default``: deterministic=False, the loss divided
by the rank's micro-batches as usual. tests/workers/repro_worker.py trains the same models
over sub-groups.

    python -m fluxmpi_py.reproduce tests/workers/reproduce_script.py --ranks 1,2 --steps 30
"""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import fluxmpi_py as fm

STEPS = 30
MICRO = 2  # samples per micro-batch
GLOBAL = 24  # samples per step: 12 micro-batches, for 1, 2, 3, 4 (and 6, 12) ranks
N = STEPS * GLOBAL


def dataset():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, 1, 6, 6, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long() + (x[:, 0, 0, 0] > 0.5).long()
    return torch.utils.data.TensorDataset(x, y)


def make_model(kind):
    torch.manual_seed(3)
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 4, 3),
            nn.BatchNorm2d(4),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 3),
        )
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(36, 16),
        nn.BatchNorm1d(16, momentum=None),  # the cumulative average, too
        nn.ReLU(),
        nn.Linear(16, 3),
    )


def trainer(kind, deterministic, group=None, steps=STEPS, global_batch=GLOBAL):
    """`steps` steps over the world (or `group`) of `global_batch` samples (micro-batches of
    MICRO, dealt by the sampler, unevenly where the world size does not divide them); yields
    (model, optimizer) after each."""
    rank = fm.local_rank() if group is None else group.rank
    world = fm.total_workers() if group is None else group.size
    model = make_model(kind)
    sampler = fm.DistributedSampler(
        N,
        num_replicas=world,
        rank=rank,
        seed=5,
        global_batch_size=global_batch,
        micro_batch_size=MICRO,
    )
    k = sampler.micro_batches_per_rank
    opt = fm.DistributedOptimizer(
        torch.optim.AdamW(model.parameters(), lr=0.02),
        named_parameters=model.named_parameters(),
        module=model,
        backward_passes_per_step=k,
        deterministic=deterministic,
        group=group,
    )
    loader = torch.utils.data.DataLoader(dataset(), batch_size=MICRO, sampler=sampler)
    for i, (x, y) in enumerate(loader):
        if i == steps * k:
            return
        loss = F.cross_entropy(model(x), y)
        # the default's accumulation: the mean over the rank's micro-batches, then averaged
        (loss if deterministic else loss / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
            yield model, opt


if __name__ == "__main__":
    fm.Init()
    deterministic = "--default" not in sys.argv
    runs = {kind: trainer(kind, deterministic) for kind in ("cnn", "mlp")}
    for (cnn, cnn_opt), (mlp, mlp_opt) in zip(runs["cnn"], runs["mlp"]):
        fm.record_step({"cnn": cnn, "cnn_opt": cnn_opt, "mlp": mlp, "mlp_opt": mlp_opt})
