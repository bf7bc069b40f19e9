"""Same-bits training through lost ranks (tests/test_elastic.py): a small CNN with BatchNorm
and AdamW, deterministic=True, 12 micro-batches of 2 samples a step dealt by the global-batch
sampler, 40 steps, each run by fm.elastic_step. Usage:

    elastic_train_worker.py OUT VICTIMS [default] [global=G] [steps=S]
        VICTIMS: "rank@step,..." (world ranks of the first world, each SIGKILLs itself as that
        step begins), or "none"; default: deterministic=False, each micro-batch's loss divided
        by the rank's micro-batches as usual (the same global batch, not the same bits);
        global=G: G samples a step instead of 24 (global=32: 16 micro-batches, which 3
        survivors of 4 share unevenly, 6, 5 and 5); steps=S: S steps instead of 40
The survivors recover, deal the global batch among themselves (rebuild the optimizer with
their new share of micro-batches), redo the step and go on. Rank 0 saves the model's and the
optimizer's state to OUT at the end; each rank prints its world and its share at the end.
"""

import os
import signal
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import fluxmpi_py as fm  # noqa: E402

out, victims, more = sys.argv[1], sys.argv[2], sys.argv[3:]
deterministic = "default" not in more
given = dict(a.split("=") for a in more if "=" in a)
STEPS, MICRO = int(given.get("steps", 40)), 2
GLOBAL = int(given.get("global", 24))  # 12 micro-batches a step: 4, 3 or 2 ranks share them evenly
N = STEPS * GLOBAL

kills = (
    {}
    if victims == "none"
    else {int(v.split("@")[0]): int(v.split("@")[1]) for v in victims.split(",")}
)

fm.Init(on_failure="shrink")
me = fm.local_rank()
g = torch.Generator().manual_seed(11)
xs = torch.randn(N, 1, 6, 6, generator=g)
ys = (xs.mean((1, 2, 3)) > 0).long() + (xs[:, 0, 0, 0] > 0.5).long()
torch.manual_seed(3)
model = nn.Sequential(
    # no bias before BatchNorm (as in ResNet): its gradient is rounding noise, which AdamW
    # turns into full steps, so that deterministic=False could not agree within a tolerance
    nn.Conv2d(1, 4, 3, bias=False),
    nn.BatchNorm2d(4),
    nn.ReLU(),
    nn.Flatten(),
    nn.Linear(64, 3),
)
share = {}


def deal():
    """This rank's samples for every step, and its micro-batches per step, at today's world."""
    sampler = fm.DistributedSampler(
        N,
        num_replicas=fm.total_workers(),
        rank=fm.local_rank(),
        seed=5,
        global_batch_size=GLOBAL,
        micro_batch_size=MICRO,
    )
    share["indices"], share["k"] = list(sampler), sampler.micro_batches_per_rank


deal()
opt = fm.DistributedOptimizer(
    torch.optim.AdamW(model.parameters(), lr=0.02),
    named_parameters=model.named_parameters(),
    module=model,
    backward_passes_per_step=share["k"],
    deterministic=deterministic,
)


def train(step):
    if kills.get(me) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    k = share["k"]
    mine = share["indices"][step * k * MICRO : (step + 1) * k * MICRO]
    for j in range(k):
        idx = mine[j * MICRO : (j + 1) * MICRO]
        loss = F.cross_entropy(model(xs[idx]), ys[idx])
        (loss if deterministic else loss / k).backward()
    opt.step()
    opt.zero_grad()


def rebuilt(info):
    deal()
    opt.rebuild(backward_passes_per_step=share["k"])


for step in range(STEPS):
    fm.elastic_step(train, step, module=model, optimizer=opt, on_recover=rebuilt)
print(
    f"rank {me} finished on a world of {fm.total_workers()}, {share['k']} micro-batches a step",
    flush=True,
)
if fm.local_rank() == 0:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, out)
