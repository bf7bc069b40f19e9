"""DistributedOptimizer's checks and gradient paths: mismatched parameters raise everywhere,
reductions launch during backward, allreduce_gradients (in place, fresh and missing
gradients mixed), and the first step checks that the ranks started equal (the equivalences
with one process: optimizer_worker.py).
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import labelled, raises, run_cases  # noqa: E402
from optimizer_worker import B, make_data, make_model, shard  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_mismatched_parameters_raise_everywhere():
    r = fm.local_rank()
    if fm.total_workers() == 1:
        return
    model = nn.Sequential(nn.Linear(4, 5 if r == 0 else 6), nn.Linear(5 if r == 0 else 6, 1))
    try:
        fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    except ValueError as e:
        msg = str(e)
        assert "param_groups[0][" in msg and "shape" in msg and "rank 0 has" in msg, msg
        # Counted from the first parameter, as the optimizer lists them: the first layer's
        # weight, not the last layer that differs.
        assert (
            "first difference at parameter 0: rank 1 has param_groups[0][0]: shape (6, 4)" in msg
        ), msg
    else:
        raise AssertionError(f"rank {r}: no error for mismatched parameters")
    extra = [nn.Parameter(torch.zeros(3)) for _ in range(2 if r == 1 else 1)]
    try:
        fm.DistributedOptimizer(torch.optim.SGD(extra, lr=0.1))
    except ValueError as e:
        assert "differ across ranks" in str(e), str(e)
    else:
        raise AssertionError(f"rank {r}: no error for different parameter counts")


def case_overlap_launches_during_backward():
    model = fm.synchronize_(nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)]))
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), direct_min_bytes=1 << 16
    )
    model(torch.randn(4, 256)).sum().backward()
    early = opt._reducer.launched_early
    opt.step()
    assert early == len(opt.buckets) and early >= 6, (early, opt.buckets)


def case_allreduce_gradients_function():
    n, r = fm.total_workers(), fm.local_rank()
    model = make_model()
    x, tok, y, flag = make_data(n * B)
    F.mse_loss(model(*(shard(t, r) for t in (x, tok, flag))), shard(y, r)).backward()
    fm.allreduce_gradients(model)
    ref = make_model()
    F.mse_loss(ref(x, tok, flag), y).backward()
    for (k, a), b in zip(model.named_parameters(), ref.parameters()):
        if b.grad is None:
            assert a.grad is None, k
        else:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=labelled(k))


def case_allreduce_gradients_in_place_fresh_and_missing_mixed():
    # 300 small parameters in one fused bucket and one direct: steps whose gradients are fresh
    # tensors, accumulated in their slots (views of the bucket after the first step), or
    # missing, differently on different ranks; sum and average against closed forms
    n, r = fm.total_workers(), fm.local_rank()
    ps = [torch.nn.Parameter(torch.zeros(5)) for _ in range(300)]
    ps.append(torch.nn.Parameter(torch.zeros(4096)))  # past direct_min_bytes: its own storage

    def value(step, i, rank):  # fmt: skip
        return float((rank + 1) * (i + 1) + step)

    def expect(step, i, ranks, avg):
        total = sum(value(step, i, q) for q in ranks)
        return total / n if avg else total

    for step, (op, how) in enumerate(
        [("sum", "fresh"), ("sum", "in place"), ("average", "in place"), ("average", "mixed"),
         ("sum", "mixed"), ("average", "rank 0 fresh"), ("sum", "rank 0 fresh")]
    ):  # fmt: skip
        missing = (7 + step) if n > 1 else None  # missing on the last rank only
        for i, p in enumerate(ps):
            v = value(step, i, r)
            fresh = (
                how == "fresh"
                or (how == "mixed" and (i + r) % 2 == 0)
                or (how == "rank 0 fresh" and r == 0)
                or p.grad is None
            )
            if i == missing and r == n - 1:
                p.grad = None
            elif fresh:
                p.grad = torch.full_like(p, v)
            else:
                p.grad.fill_(v)  # in place: in its slot of the bucket from step 2 on
        fm.allreduce_gradients(ps, op=op, direct_min_bytes=8192)
        for i, p in enumerate(ps):
            ranks = [q for q in range(n) if not (i == missing and q == n - 1)]
            want = expect(step, i, ranks, op == "average")
            assert p.grad is not None, (step, i)
            if op == "sum":  # integers in float32: exact
                assert torch.all(p.grad == want), (step, how, i, p.grad, want)
            else:  # each part divided by n before the sum: within rounding
                torch.testing.assert_close(p.grad, torch.full_like(p, want), msg=f"{step} {i}")
        if step == 1:  # gradients now live in the bucket: in place is in place
            assert ps[3].grad.data_ptr() + 20 == ps[2].grad.data_ptr() or (
                ps[2].grad.data_ptr() + 20 == ps[3].grad.data_ptr()
            )


def case_allreduce_gradients_notices_replaced_and_resized_parameters():
    # Its cached plan is reused for the same parameter objects: a parameter replaced in the
    # same list re-plans (its gradient reduced), one resized raises on every rank
    n, r = fm.total_workers(), fm.local_rank()
    ps = [torch.nn.Parameter(torch.zeros(5)) for _ in range(40)]

    def reduce_ones():
        for p in ps:
            p.grad = torch.full_like(p, r + 1.0)
        fm.allreduce_gradients(ps, op="sum")
        for i, p in enumerate(ps):
            assert torch.all(p.grad == n * (n + 1) / 2), (i, p.grad)

    reduce_ones()
    reduce_ones()  # the cached plan
    ps[7] = torch.nn.Parameter(torch.zeros(3, 2))
    reduce_ones()
    for p in ps:
        p.grad.fill_(r + 1.0)  # in place, in the new plan's slots
    fm.allreduce_gradients(ps, op="sum")
    assert torch.all(ps[7].grad == n * (n + 1) / 2), ps[7].grad
    with torch.no_grad():
        if r == 0:  # one rank's error is every rank's
            ps[3].data = torch.zeros(9)
        ps[3].grad = torch.ones_like(ps[3])
    raises(RuntimeError, lambda: fm.allreduce_gradients(ps, op="sum"), "parameter", "resize")
    raises(ValueError, lambda: fm.allreduce_gradients(ps, op=True), "op")  # checked anew


def case_first_step_checks_that_the_ranks_started_equal():
    n, r = fm.total_workers(), fm.local_rank()
    torch.manual_seed(r)  # a different start on each rank, and no synchronize_

    def train(model, **kw):
        opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), **kw)
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
        return model

    if n > 1:  # every rank raises, naming the parameter and the remedy
        raises(
            ValueError,
            lambda: train(nn.Linear(4, 1), module=None, named_parameters=None),
            "the same parameters",
            "synchronize_",
            "rank 0",
        )
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))
        raises(ValueError, lambda: train(model, module=model), "parameters['0.weight']")
        # check_every=0: no check; the replicas stay different
        m = train(nn.Linear(4, 1), check_every=0)
        assert len(set(map(str, fm.allgather_object(m.weight.tolist())))) == n
    if n > 1:  # allreduce_gradients checks at its first call with a parameter list
        raises(ValueError, lambda: fm.allreduce_gradients(nn.Linear(4, 1)), "synchronize_")
    m = fm.synchronize_(nn.Linear(4, 1))
    m(torch.ones(2, 4)).sum().backward()
    fm.allreduce_gradients(m)
    m = train(fm.synchronize_(nn.Linear(4, 1)))  # a good start passes
    assert fm.allgather_object(m.weight.tolist()) == [m.weight.tolist()] * n
    raises(
        ValueError,
        lambda: fm.DistributedOptimizer(torch.optim.SGD(m.parameters()), check_every=-1),
        "check_every",
    )


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
