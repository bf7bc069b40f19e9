"""check_consistency and DistributedOptimizer(check_every=N) on every rank; run by
tests/test_consistency.py. Each case makes one rank (the last) diverge and checks that every
rank raises, naming the entry and the ranks."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402


def last():
    return fm.total_workers() - 1


def diverges():
    """Whether this world can diverge (a world of one cannot)."""
    return fm.total_workers() > 1


def trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1)
    )
    opt = fm.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), module=model)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def case_tensor_digests_see_every_bit():
    a = torch.randn(1000)
    b = a.clone()
    b.view(torch.int32)[777] ^= 1  # one bit of one float
    (da, db, dc) = C.tensor_digests([a, b, a.clone()])
    assert da == dc and da != db
    t = torch.randn(6, 5)
    assert C.tensor_digests([t.t()]) == C.tensor_digests([t.t().contiguous()])
    assert C.tensor_digests([t])[0] != C.tensor_digests([t.reshape(5, 6)])[0]
    assert C.tensor_digests([t])[0] != C.tensor_digests([t.view(torch.int32)])[0]
    assert all(0 <= d < 2**63 for d in C.tensor_digests([t, torch.zeros(0), torch.ones(33)]))


def case_agreeing_ranks_pass():
    model, opt = trained()
    fm.check_consistency({"model": model, "optimizer": opt})
    fm.check_consistency([model, opt.optimizer, torch.arange(3), {"epoch": 1, "tag": "x"}])
    fm.check_consistency(model.state_dict())


def case_a_parameter_differs():
    model, opt = trained()
    if fm.local_rank() == last():
        with torch.no_grad():
            model[2].weight[0, 1] += 0.25
    check = lambda: fm.check_consistency({"model": model, "optimizer": opt})  # noqa: E731
    if not diverges():
        return check()
    raises(
        ValueError,
        check,
        "check_consistency(): the ranks have diverged",
        "'model.2.weight'",
        f"rank {last()} differs from rank 0",
        "largest difference from rank 0's values: 0.25",
    )


def case_optimizer_state_differs_named_by_parameter():
    model, opt = trained()
    if fm.local_rank() == last():
        opt.state[model[0].bias]["exp_avg"][1] += 1.0
    check = lambda: fm.check_consistency((model, opt))  # noqa: E731
    if not diverges():
        return check()
    raises(ValueError, check, "'[1].state[[0].0.bias].exp_avg'", f"rank {last()} differ")


def case_a_setting_differs():
    model, opt = trained()
    if fm.local_rank() == last():
        opt.param_groups[0]["lr"] = 0.5
    check = lambda: fm.check_consistency({"optimizer": opt})  # noqa: E731
    if not diverges():
        return check()
    raises(
        ValueError,
        check,
        "'optimizer.param_groups[0].lr'",
        f"rank {last()} has 0.5, rank 0 has 0.1",
    )


def case_different_structures_named():
    model, _ = trained()
    extra = {"extra": torch.zeros(2)} if fm.local_rank() == last() else {}
    check = lambda: fm.check_consistency({"model": model, **extra})  # noqa: E731
    if not diverges():
        return check()
    raises(ValueError, check, "the entries differ across ranks", f"rank {last()} has extra")


def case_check_every_raises_at_the_checked_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), check_every=2,
                                  named_parameters=model.named_parameters())  # fmt: skip

    def step():
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()

    step()  # step 1: not checked
    if fm.local_rank() == last():
        with torch.no_grad():
            model.bias[0] += 1.0  # an update outside the optimizer
    if not diverges():
        return step()
    raises(
        ValueError,
        step,
        "DistributedOptimizer(check_every=2) after step 2: the ranks have diverged",
        "'parameters.bias'",
        f"rank {last()} differ",
    )


def case_check_every_zero_is_off_and_validated():
    def diverged_step(**kw):
        model = fm.synchronize_(torch.nn.Linear(2, 1))
        opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kw)
        if fm.local_rank() == last():
            with torch.no_grad():
                model.bias += 1.0
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        return model

    diverged_step(check_every=0)  # no check at all: the divergence goes unnoticed
    if fm.total_workers() > 1:  # by default the first step checks the parameters
        raises(ValueError, diverged_step, "the same parameters", "param_groups[0][1]")
    else:
        diverged_step()
    sgd = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    for bad in (-1, 1.5, True):
        raises(ValueError, lambda b=bad: fm.DistributedOptimizer(sgd, check_every=b), "check_every")


if __name__ == "__main__":
    run_cases(globals())
