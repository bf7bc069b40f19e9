"""Micro-batches dealt unevenly (issue 51): 8 micro-batches a step at 3 ranks are 3, 3 and 2.
With deterministic=True the CNN and the MLP of tests/workers/reproduce_script.py (AdamW,
BatchNorm, accumulation) train to the same bits on the world of 3 as on the groups [0] and
[1, 2] of the same launch (1 and 2 ranks, 8 and 4 + 4 micro-batches): equal per-step digests
and torch.equal tensors. Without it, each rank dividing its losses by its own count, the
reduced gradient is the mean over the 8 micro-batches (each rank weighed by its share), as one
process computes it. Each rank's passes are checked against its own count; more ranks than
micro-batches raise on every rank. Run at 3 ranks by
tests/test_reproducible.py.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import only_at, raises, run_cases  # noqa: E402
from repro_worker import _same, digest, state_tensors  # noqa: E402
from reproduce_script import MICRO, N, dataset, make_model, trainer  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py.training.exact_sum import ExactGradientSum  # noqa: E402

GLOBAL = 16  # 8 micro-batches of 2: 3, 3 and 2 at 3 ranks
STEPS = 8


def train(kind, group):
    digests = []
    for model, opt in trainer(kind, True, group, STEPS, global_batch=GLOBAL):
        digests.append(digest(model, opt))
    assert len(digests) == STEPS
    return digests, list(model.state_dict().values()) + state_tensors(opt)


@only_at(3)
def case_uneven_shares_keep_the_bits_of_one_and_two_ranks():
    sampler = fm.DistributedSampler(N, global_batch_size=GLOBAL, micro_batch_size=MICRO)
    assert sampler.micro_batches_per_rank == [3, 3, 2][fm.local_rank()]
    on_three = {kind: train(kind, None) for kind in ("cnn", "mlp")}
    groups = [fm.new_group([0]), fm.new_group([1, 2])]
    g = next(g for g in groups if fm.local_rank() in g)
    on_groups = {kind: train(kind, g) for kind in ("cnn", "mlp")}
    runs = fm.allgather_object((on_three, on_groups if g.rank == 0 else None))
    three, one, two = runs[0][0], runs[0][1], runs[1][1]
    for kind in ("cnn", "mlp"):
        for label, other in (("1 rank", one), ("2 ranks", two)):
            if three[kind][0] != other[kind][0]:
                step = next(
                    i for i, (a, b) in enumerate(zip(three[kind][0], other[kind][0])) if a != b
                )
                raise AssertionError(f"{kind}: 3 ranks and {label} differ from step {step + 1}")
            assert _same(three[kind][1], other[kind][1]), f"{kind}: {label}: the end differs"


def micro_batches_of_step_0():
    """Every micro-batch of step 0, in global order, as one process sees them."""
    one = fm.DistributedSampler(N, num_replicas=1, rank=0, seed=5, global_batch_size=GLOBAL,
                                micro_batch_size=MICRO)  # fmt: skip
    idx = list(one)[:GLOBAL]
    x, y = dataset().tensors
    return [(x[idx[i : i + MICRO]], y[idx[i : i + MICRO]]) for i in range(0, GLOBAL, MICRO)]


@only_at(3)
def case_the_default_weighs_every_micro_batch_alike():
    # deterministic=False: each rank divides its losses by its own k (3, 3 or 2) and the
    # optimizer weighs the ranks by k * W / M, so the reduced gradient is the mean over all 8
    # micro-batches, not the mean of the ranks' means (which weighs rank 2's micro-batches 4/3)
    model = make_model("mlp").eval()  # BatchNorm's running statistics stay still
    want = [torch.zeros_like(p) for p in model.parameters()]
    batches = micro_batches_of_step_0()
    for x, y in batches:
        grads = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
        for w, g in zip(want, grads):
            w += g / len(batches)
    sampler = fm.DistributedSampler(N, seed=5, global_batch_size=GLOBAL, micro_batch_size=MICRO)
    k = sampler.micro_batches_per_rank
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        named_parameters=model.named_parameters(),
        backward_passes_per_step=k,
        check_every=0,
    )
    first = sampler.micro_batch(0)[1]  # this rank's run of step 0's micro-batches
    for x, y in batches[first : first + k]:
        (F.cross_entropy(model(x), y) / k).backward()
    opt.synchronize()
    for (name, p), w in zip(model.named_parameters(), want):
        torch.testing.assert_close(
            p.grad, w, rtol=1e-5, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}"
        )
    with opt.skip_synchronize():
        opt.step()


def exact_linear(k):
    """A Linear(3, 1) and its DistributedOptimizer(deterministic=True) at k passes a step."""
    model = torch.nn.Linear(3, 1)
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        deterministic=True,
        backward_passes_per_step=k,
        check_every=0,
    )
    return model, opt


@only_at(3)
def case_each_rank_runs_its_own_count_or_every_rank_raises():
    # backward_passes_per_step 3, 3 and 2: each rank is checked against its own count, and
    # rank 2 running 3 passes (as the others) raises on every rank at step()
    k = [3, 3, 2][fm.local_rank()]
    model, opt = exact_linear(k)
    assert opt._exact.micro_batches == 8
    for _ in range(k):
        model(torch.ones(1, 3)).sum().backward()
    opt.synchronize()  # the right counts: M = 8, the mean of 8 equal gradients
    assert torch.equal(model.bias.grad, torch.ones(1))
    with opt.skip_synchronize():
        opt.step()
    for _ in range(3):
        model(torch.ones(1, 3)).sum().backward()
    raises(ValueError, opt.step, f"ran 3 of its {k}", "up to 1 more than their own")


@only_at(3)
def case_counts_that_differ_but_divide_take_one_path_on_every_rank():
    # backward_passes_per_step 2, 1 and 3: M = 6 divides among 3 ranks, but the ranks' passes
    # differ, so the per-pass sharded exchange cannot pair: every rank takes the int64 path
    k = [2, 1, 3][fm.local_rank()]
    model, opt = exact_linear(k)
    assert opt._exact.micro_batches == 6
    assert isinstance(opt._exact, ExactGradientSum), type(opt._exact).__name__
    for _ in range(k):
        model(torch.ones(1, 3)).sum().backward()
    opt.synchronize()  # the mean of 6 equal gradients
    assert torch.equal(model.bias.grad, torch.ones(1))


@only_at(3)
def case_more_ranks_than_micro_batches_raise_on_every_rank():
    # 2 micro-batches a step cannot give each of 3 ranks one: every rank raises, naming it
    for make in (
        lambda: fm.DistributedSampler(N, global_batch_size=4, micro_batch_size=MICRO),
        lambda: fm.DistributedDataContainer(
            list(range(N)), global_batch_size=4, micro_batch_size=MICRO
        ),
    ):
        raises(ValueError, make, "2 micro-batches", "fewer than the 3 ranks", "at most 2 ranks")


if __name__ == "__main__":
    run_cases(globals())
