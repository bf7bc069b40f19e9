"""Freezing and unfreezing parameters after DistributedOptimizer (or allreduce_gradients) was
built: every rank re-plans together, and training still equals one process with N times the
batch; ranks that change different parameters raise on every rank, naming the parameter."""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import labelled, raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

B = 4  # per-rank batch
STEPS = 6
UNFREEZE_AT, FREEZE_AT = 2, 4


def make_model():
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    model[0].requires_grad_(False)  # frozen when the optimizer is built
    return model


def make_data(n):
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 6, generator=g), torch.randn(n, 3, generator=g)


def assert_identical_across_ranks(model, what):
    for name, p in model.named_parameters():
        hi = fm.allreduce_(p.detach().clone(), "max")
        lo = fm.allreduce_(p.detach().clone(), "min")
        assert torch.equal(hi, lo), f"{what}: {name} differs across ranks (rank {fm.local_rank()})"


def planned(opt):
    return sum(len(b["members"]) for b in opt.buckets)


def train(distributed, path="step", set_to_none=True, wrap=None):
    """Layer 0 is unfrozen before step UNFREEZE_AT, layer 2 frozen before step FREEZE_AT."""
    n, r = fm.total_workers(), fm.local_rank()
    model = make_model()
    x, y = make_data(n * B)
    if distributed:
        x, y = x[r * B : (r + 1) * B], y[r * B : (r + 1) * B]
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    opt = (
        fm.DistributedOptimizer(base, named_parameters=model.named_parameters(), **(wrap or {}))
        if distributed
        else base
    )
    for step in range(STEPS):
        if step == UNFREEZE_AT:
            model[0].requires_grad_(True)
        if step == FREEZE_AT:
            model[2].requires_grad_(False)
        opt.zero_grad(set_to_none=set_to_none)
        if path == "closure":

            def closure():
                opt.zero_grad(set_to_none=set_to_none)
                loss = F.mse_loss(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
        else:
            F.mse_loss(model(x), y).backward()
            if path == "synchronize":
                if distributed:
                    opt.synchronize()
                nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                if distributed:
                    with opt.skip_synchronize():
                        opt.step()
                else:
                    opt.step()
            else:
                opt.step()
        if distributed:
            what = f"{path}, step {step}"
            assert_identical_across_ranks(model, what)
            trainable = sum(p.requires_grad for p in model.parameters())
            assert planned(opt) == trainable, (
                f"{what}: {planned(opt)} parameters planned, {trainable} trainable"
            )
    return model


def check_equivalent(**kw):
    dist = train(True, **kw)
    ref = train(False, **{k: v for k, v in kw.items() if k != "wrap"})
    for (name, a), b in zip(dist.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(f"{kw} {name}"))
    # the unfrozen layer did train
    assert not torch.equal(dist[0].weight, make_model()[0].weight)


def case_unfreeze_and_freeze_at_step():
    for set_to_none in (True, False):
        check_equivalent(set_to_none=set_to_none)
    # every gradient in its own direct bucket, and tiny fused buckets
    check_equivalent(wrap=dict(direct_min_bytes=64, bucket_cap_mb=0.0002))


def case_unfreeze_and_freeze_at_synchronize():
    check_equivalent(path="synchronize")


def case_unfreeze_and_freeze_in_closure():
    check_equivalent(path="closure")


def case_unfreeze_inside_accumulation():
    # Unfrozen between the two micro-batches of one step: only the second one's gradient
    # exists for it; the step still reduces it.
    n, r = fm.total_workers(), fm.local_rank()
    x, y = make_data(2 * n * B)
    results = []
    for distributed in (True, False):
        model = make_model()
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = fm.DistributedOptimizer(base, backward_passes_per_step=2) if distributed else base
        for step in range(3):
            opt.zero_grad()
            for half in range(2):
                if step == 1 and half == 1:
                    model[0].requires_grad_(True)
                if distributed:
                    sl = slice((2 * r + half) * B, (2 * r + half + 1) * B)
                else:  # the same micro-batches, every rank's at once
                    sl = torch.cat(
                        [torch.arange((2 * q + half) * B, (2 * q + half + 1) * B) for q in range(n)]
                    )
                (F.mse_loss(model(x[sl]), y[sl]) / 2).backward()
            opt.step()
        results.append(model)
    for (name, a), b in zip(results[0].named_parameters(), results[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(name))


def case_add_param_group_joins_at_next_step():
    n, r = fm.total_workers(), fm.local_rank()
    x, y = make_data(n * B)
    results = []
    for distributed in (True, False):
        model = make_model()
        model[0].requires_grad_(True)
        base = torch.optim.SGD(list(model[2:].parameters()), lr=0.1, momentum=0.9)
        opt = fm.DistributedOptimizer(base) if distributed else base
        xs, ys = (x[r * B : (r + 1) * B], y[r * B : (r + 1) * B]) if distributed else (x, y)
        for step in range(4):
            opt.zero_grad()
            F.mse_loss(model(xs), ys).backward()
            if step == 1:  # after this step's backward: its gradient is reduced by this step
                opt.add_param_group({"params": list(model[0].parameters()), "lr": 0.05})
            opt.step()
        if distributed:
            assert planned(opt) == 6, opt.buckets
        results.append(model)
    for (name, a), b in zip(results[0].named_parameters(), results[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(name))


def case_ranks_that_change_different_parameters_raise():
    n, r = fm.total_workers(), fm.local_rank()
    if n == 1:
        return
    x, y = make_data(B)
    for named in (True, False):
        # Rank 0 unfreezes layer 0; the other ranks do nothing: rank 0's change alone makes
        # every rank re-plan, and the plan's check names the parameter.
        model = make_model()
        kw = dict(named_parameters=model.named_parameters()) if named else {}
        opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kw)
        if r == 0:
            model[0].requires_grad_(True)
        F.mse_loss(model(x), y).backward()
        name = "0.weight" if named else "param_groups[0][0]"
        raises(
            ValueError,
            opt.step,
            "differ across ranks",
            f"has {name}: shape (8, 6)",
            "requires_grad=",
        )
    # Only the last rank unfreezes, and in synchronize(): rank 0, which changed nothing, raises too.
    model = make_model()
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    if r == n - 1:
        model[0].requires_grad_(True)
    F.mse_loss(model(x), y).backward()
    raises(ValueError, opt.synchronize, f"rank {n - 1} has 0.weight", "requires_grad=True")


def case_allreduce_gradients_after_requires_grad_changes():
    n, r = fm.total_workers(), fm.local_rank()
    x, y = make_data(n * B)
    model, ref = make_model(), make_model()
    for step in range(3):
        if step == 1:
            model[0].requires_grad_(True)
            ref[0].requires_grad_(True)
        if step == 2:
            model[2].requires_grad_(False)
            ref[2].requires_grad_(False)
        for m in (model, ref):
            m.zero_grad()
        F.mse_loss(model(x[r * B : (r + 1) * B]), y[r * B : (r + 1) * B]).backward()
        fm.allreduce_gradients(model)
        F.mse_loss(ref(x), y).backward()
        for (name, a), b in zip(model.named_parameters(), ref.parameters()):
            if b.grad is None:
                assert a.grad is None, f"step {step} {name}"
            else:
                torch.testing.assert_close(
                    a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=labelled(f"step {step} {name}")
                )
    if n > 1:  # a change on one rank only raises on every rank, naming the parameter
        model = make_model()
        F.mse_loss(model(x[:B]), y[:B]).backward()
        fm.allreduce_gradients(model)
        if r == 1:
            model[4].requires_grad_(False)
        raises(
            ValueError,
            lambda: fm.allreduce_gradients(model),
            "allreduce_gradients",
            "has 4.weight: shape (3, 8)",
            "requires_grad=",
        )


if __name__ == "__main__":
    run_cases(globals())
