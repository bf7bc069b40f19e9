"""The same bits at any world size (issue 34), in one launch of 4 ranks: a small CNN and an
MLP, both with BatchNorm, trained with AdamW and gradient accumulation for 30 steps over the
world (4 ranks), then concurrently over the groups [0, 1, 2] and [3] (3 and 1), then over
[0, 1] and [2, 3] (2, twice). deterministic=True: every run has equal per-step digests and
torch.equal parameters, buffers and optimizer state; deterministic=False: they differ.

With REPRO_OUT set, rank 0 writes the world's results there (digests.json, final.pt), which
tests/test_reproducible.py compares with a world of one trained in the pytest process.
"""

import hashlib
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

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


def digest(model, opt):
    h = hashlib.sha256()
    for t in list(model.state_dict().values()) + state_tensors(opt):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def state_tensors(opt):
    out = []
    for s in opt.state_dict()["state"].values():
        out += [v if isinstance(v, torch.Tensor) else torch.tensor(v) for _, v in sorted(s.items())]
    return out


def train(kind, deterministic, group=None, rank=None, world=None):
    """30 steps; returns (per-step digests, final tensors)."""
    if rank is None:
        rank = fm.local_rank() if group is None else group.rank
        world = fm.total_workers() if group is None else group.size
    model = make_model(kind)
    sampler = fm.DistributedSampler(
        N, num_replicas=world, rank=rank, seed=5, global_batch_size=GLOBAL, micro_batch_size=MICRO
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
    digests = []
    for i, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y)
        # the default's accumulation: the mean over the rank's micro-batches, then averaged
        (loss if deterministic else loss / k).backward()
        if (i + 1) % k == 0:
            opt.step()
            opt.zero_grad()
            digests.append(digest(model, opt))
    assert len(digests) == STEPS
    final = list(model.state_dict().values()) + state_tensors(opt)
    return digests, final


def _runs(deterministic):
    """Every run of the three phases: [(label, digests, final)] from each group's rank 0,
    gathered on every rank."""
    world = fm.total_workers()
    mine = []
    for kind in ("cnn", "mlp"):
        mine.append((f"{kind} world of {world}", *train(kind, deterministic)))
    if world == 4:
        for split in ([[0, 1, 2], [3]], [[0, 1], [2, 3]]):
            groups = [fm.new_group(ranks) for ranks in split]
            g = next(g for g in groups if fm.local_rank() in g)
            for kind in ("cnn", "mlp"):
                digests, final = train(kind, deterministic, group=g)
                if g.rank == 0:
                    mine.append((f"{kind} group {list(g.ranks)}", digests, final))
    gathered = fm.allgather_object(mine)
    return [run for runs in gathered for run in runs]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def case_deterministic_is_the_same_at_any_world_size():
    runs = _runs(True)
    for kind in ("cnn", "mlp"):
        mine = [r for r in runs if r[0].startswith(kind)]
        ref_label, ref_digests, ref_final = mine[0]
        for label, digests, final in mine[1:]:
            if digests != ref_digests:
                step = next(i for i, (a, b) in enumerate(zip(digests, ref_digests)) if a != b)
                raise AssertionError(f"{label} differs from {ref_label} from step {step + 1}")
            assert _same(final, ref_final), f"{label}: final state differs from {ref_label}"
    out = os.environ.get("REPRO_OUT")
    if out and fm.local_rank() == 0:
        world = [r for r in runs if "world" in r[0]]
        with open(os.path.join(out, f"digests-np{fm.total_workers()}.json"), "w") as f:
            json.dump({label: d for label, d, _ in world}, f)
        torch.save(
            {label: fin for label, _, fin in world},
            os.path.join(out, f"final-np{fm.total_workers()}.pt"),
        )


def case_default_differs_across_world_sizes():
    if fm.total_workers() < 4:  # one world size alone: nothing to compare
        return
    runs = _runs(False)
    for kind in ("cnn", "mlp"):
        finals = [(label, final) for label, _, final in runs if label.startswith(kind)]
        # the default is not reproducible across world sizes: 4 ranks vs 3 vs 1 vs 2
        distinct = {
            hashlib.sha256(b"".join(t.numpy().tobytes() for t in f)).hexdigest() for _, f in finals
        }
        assert len(distinct) > 1, f"{kind}: the default gave the same bits at every world size"


def case_overflow_raises_on_every_rank():
    model = nn.Linear(3, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        named_parameters=model.named_parameters(),
        deterministic=True,
        check_every=0,
    )
    scale = 1e6 if fm.local_rank() == fm.total_workers() - 1 else 1.0  # one rank's batch
    (model(torch.ones(1, 3)) * scale).sum().backward()
    raises(fm.GridOverflowError, opt.step, "weight", "|g| = 1e+06", "2**16")
    (model(torch.ones(1, 3)) * scale).sum().backward()  # the grid now covers it
    opt.synchronize()
    mean = (fm.total_workers() - 1 + 1e6) / fm.total_workers()
    assert torch.allclose(model.weight.grad, torch.full((1, 3), mean), rtol=1e-6)
    assert opt.exact_grid()["weight"][0] == 20 + 16  # 1e6 < 2**20, 16 bits of headroom
    with opt.skip_synchronize():
        opt.step()


def case_wrong_pass_count_raises_on_every_rank():
    model = nn.Linear(3, 1)
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        deterministic=True,
        backward_passes_per_step=2,
        check_every=0,
    )
    for _ in range(1 if fm.local_rank() == 0 else 2):
        model(torch.ones(1, 3)).sum().backward()
    raises(ValueError, opt.step, "backward_passes_per_step=2", "ran 1 to 2")


if __name__ == "__main__":
    run_cases(globals())
