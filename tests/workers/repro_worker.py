"""The same bits at any world size (issue 34), over sub-groups of one launch of 4 ranks: the
CNN and the MLP of tests/workers/reproduce_script.py (BatchNorm, AdamW, gradient accumulation)
trained with deterministic=True at once over the groups [0, 1, 2] and [3] (3 and 1 ranks):
equal per-step digests and torch.equal parameters, buffers and optimizer state. Overflow and
a wrong pass count raise on every rank. Separate launches at 1, 2, 3, 4 ranks, and the
default's differences, are tests/test_reproducible.py's, through python -m fluxmpi_py.reproduce.
"""

import hashlib
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
from harness import raises, run_cases  # noqa: E402
from reproduce_script import STEPS, trainer  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


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


def train(kind, group, steps):
    """deterministic=True; returns (per-step digests, final tensors)."""
    digests = []
    for model, opt in trainer(kind, True, group, steps):
        digests.append(digest(model, opt))
    assert len(digests) == steps
    return digests, list(model.state_dict().values()) + state_tensors(opt)


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def case_sub_groups_train_as_one_process():
    # groups of 3 and 1 ranks, training at once inside one world: the same bits (the
    # separate launches at 1, 2, 3, 4 ranks run the full 30 steps)
    groups = [fm.new_group([0, 1, 2]), fm.new_group([3])]
    g = next(g for g in groups if fm.local_rank() in g)
    mine = {kind: train(kind, g, STEPS // 3) for kind in ("cnn", "mlp")}
    runs = fm.allgather_object(mine if g.rank == 0 else None)
    for kind in ("cnn", "mlp"):
        (three_digests, three), (one_digests, one) = runs[0][kind], runs[3][kind]
        if three_digests != one_digests:
            step = next(i for i, (a, b) in enumerate(zip(three_digests, one_digests)) if a != b)
            raise AssertionError(f"{kind}: a group of 3 and one of 1 differ from step {step + 1}")
        assert _same(three, one), f"{kind}: the final state differs"


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
    ran = "ran 1 of its 2" if fm.local_rank() == 0 else "ran 2 of its 2"
    raises(ValueError, opt.step, "backward_passes_per_step", ran, "up to 1 fewer than their own")


if __name__ == "__main__":
    run_cases(globals())
