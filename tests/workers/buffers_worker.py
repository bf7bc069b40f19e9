"""BatchNorm buffers on N ranks that each see different data: DistributedOptimizer(module=...)
and synchronize_buffers_ keep them equal; "average" equals one process that saw every rank's
batch (running_mean), "broadcast" gives rank 0's, None leaves each rank its own."""

import functools
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import labelled, raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

B = 6  # per-rank batch
STEPS = 3
MOMENTUM = 0.1


def train_closure(opt, model, x, y):
    """A step's closure: zero the grads, then forward and backward on (x, y)."""
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss


def make_model():
    # The first BatchNorm sees the raw inputs, so its running statistics depend on the data
    # alone and have a closed form; the second sees trained features.
    torch.manual_seed(3)
    return nn.Sequential(
        nn.BatchNorm1d(5), nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)
    )


def rank_batch(step, r):
    """Rank r's batch at a step: each rank's data has its own mean, so statistics drift."""
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(B, 5, generator=g) * (1 + r) + 3.0 * r, torch.randn(B, 2, generator=g)


def own_running_mean(r, steps=STEPS):
    """The first BatchNorm's running_mean after training on rank r's batches alone."""
    m = torch.zeros(5)
    for s in range(steps):
        m = (1 - MOMENTUM) * m + MOMENTUM * rank_batch(s, r)[0].mean(0)
    return m


def buffers_equal_across_ranks(model):
    for name, b in model.named_buffers():
        t = b.detach().double()
        if not torch.equal(fm.allreduce_(t.clone(), "max"), fm.allreduce_(t.clone(), "min")):
            return False, name
    return True, None


def assert_buffers_equal_across_ranks(model, what):
    same, name = buffers_equal_across_ranks(model)
    assert same, f"{what}: buffer {name} differs across ranks (rank {fm.local_rank()})"


def train(steps=STEPS, **wrap):
    """DistributedOptimizer(module=model, **wrap) on this rank's batches."""
    r = fm.local_rank()
    model = make_model()
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model, **wrap)
    for s in range(steps):
        x, y = rank_batch(s, r)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        if wrap.get("buffers", "average") is not None:
            assert_buffers_equal_across_ranks(model, f"{wrap}, step {s}")
    return model


def eval_outputs_identical(model):
    model.eval()
    with torch.no_grad():
        out = model(torch.linspace(-2, 2, 20).reshape(4, 5)).double()
    model.train()
    return torch.equal(fm.allreduce_(out.clone(), "max"), fm.allreduce_(out.clone(), "min"))


def case_average_is_the_default_and_equals_one_process():
    n = fm.total_workers()
    model = train()
    # One process that saw every rank's batch at each step: the union's mean is the mean of
    # the ranks' means (equal batches).
    ref = torch.zeros(5)
    for s in range(STEPS):
        union = torch.cat([rank_batch(s, q)[0] for q in range(n)])
        ref = (1 - MOMENTUM) * ref + MOMENTUM * union.mean(0)
    torch.testing.assert_close(model[0].running_mean, ref, rtol=1e-5, atol=1e-6)
    # running_var: the ranks' average of their unbiased batch variances
    var = torch.ones(5)
    for s in range(STEPS):
        var = (1 - MOMENTUM) * var + MOMENTUM * torch.stack(
            [rank_batch(s, q)[0].var(0) for q in range(n)]
        ).mean(0)
    torch.testing.assert_close(model[0].running_var, var, rtol=1e-5, atol=1e-6)
    assert int(model[0].num_batches_tracked) == STEPS
    assert eval_outputs_identical(model), "eval outputs differ across ranks"


def case_broadcast_gives_rank_0s_buffers():
    model = train(buffers="broadcast")
    torch.testing.assert_close(model[0].running_mean, own_running_mean(0), rtol=1e-5, atol=1e-6)
    assert eval_outputs_identical(model), "eval outputs differ across ranks"
    # without the module there is nothing to broadcast: say so instead of doing nothing
    raises(
        ValueError,
        lambda: fm.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), buffers="broadcast"
        ),
        "module=model",
    )


def case_none_leaves_each_rank_its_own():
    n, r = fm.total_workers(), fm.local_rank()
    model = train(buffers=None)
    torch.testing.assert_close(model[0].running_mean, own_running_mean(r), rtol=1e-5, atol=1e-6)
    if n > 1:
        assert not buffers_equal_across_ranks(model)[0]


def case_integer_buffers_come_from_rank_0():
    # Rank 1 runs an extra forward: its num_batches_tracked is one ahead until the sync.
    r = fm.local_rank()
    model = make_model()
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model)
    x, y = rank_batch(0, r)
    if r == 1:
        model(x)
    F.mse_loss(model(x), y).backward()
    opt.step()
    assert int(model[0].num_batches_tracked) == 1, int(model[0].num_batches_tracked)
    assert_buffers_equal_across_ranks(model, "extra forward on rank 1")


def case_replaced_buffer_is_synced():
    # A module that assigns a new tensor to a buffer: the sync follows the new one.
    r = fm.local_rank()
    model = make_model()
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model)
    for s in range(2):
        model[2].running_var = model[2].running_var.clone() + r
        x, y = rank_batch(s, r)
        F.mse_loss(model(x), y).backward()
        opt.step()
        assert_buffers_equal_across_ranks(model, f"replaced buffer, step {s}")


def case_closure_and_accumulation_sync_buffers():
    n, r = fm.total_workers(), fm.local_rank()
    for mode in ("closure", "accumulate"):
        model = make_model()
        kw = {"backward_passes_per_step": 2} if mode == "accumulate" else {}
        opt = fm.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), module=model, **kw
        )
        ref = torch.zeros(5)
        for s in range(2):
            if mode == "closure":
                opt.step(functools.partial(train_closure, opt, model, *rank_batch(s, r)))
                ref = (1 - MOMENTUM) * ref + MOMENTUM * torch.cat(
                    [rank_batch(s, q)[0] for q in range(n)]
                ).mean(0)
            else:
                opt.zero_grad()
                for half in range(2):
                    x, y = rank_batch(10 * s + half, r)
                    (F.mse_loss(model(x), y) / 2).backward()
                    ref = (1 - MOMENTUM) * ref + MOMENTUM * torch.cat(
                        [rank_batch(10 * s + half, q)[0] for q in range(n)]
                    ).mean(0)
                opt.step()
            assert_buffers_equal_across_ranks(model, f"{mode}, step {s}")
        torch.testing.assert_close(
            model[0].running_mean, ref, rtol=1e-5, atol=1e-6, msg=labelled(mode)
        )


def case_synchronize_buffers_without_optimizer():
    n, r = fm.total_workers(), fm.local_rank()
    for mode, expected in (("average", None), ("broadcast", own_running_mean(0, 1))):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = rank_batch(0, r)
        F.mse_loss(model(x), y).backward()
        fm.allreduce_gradients(model)
        opt.step()
        assert fm.synchronize_buffers_(model, mode) is model
        assert_buffers_equal_across_ranks(model, f"synchronize_buffers_({mode!r})")
        if expected is None:
            expected = MOMENTUM * torch.stack([rank_batch(0, q)[0].mean(0) for q in range(n)]).mean(
                0
            )
        torch.testing.assert_close(model[0].running_mean, expected, rtol=1e-5, atol=1e-6)
        assert eval_outputs_identical(model)
    raises(ValueError, lambda: fm.synchronize_buffers_(model, "sum"), "'average' or 'broadcast'")


def case_different_buffers_raise_everywhere():
    n, r = fm.total_workers(), fm.local_rank()
    if n == 1:
        return
    # No parameters differ (affine=False): only the buffers do.
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4 if r == 0 else 3, affine=False))
    raises(
        ValueError,
        lambda: fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), module=model),
        "DistributedOptimizer(module=...)",
        "buffers differ across ranks",
        "1.running_mean: shape (3,)",
    )
    raises(
        ValueError, lambda: fm.synchronize_buffers_(model), "synchronize_buffers_", "1.running_mean"
    )


def case_warns_once_when_buffers_change_unsynced():
    r = fm.local_rank()
    x, y = rank_batch(0, r)
    for model, expect in ((make_model(), True), (nn.Linear(5, 2), False)):
        if not expect:
            model.register_buffer("constant", torch.arange(3.0))  # never changes: no warning
        fm.synchronize_(model)
        opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
        mine = [str(w.message) for w in caught if "fluxmpi_py" in str(w.message)]
        if expect and r == 0 and fm.total_workers() > 1:
            assert len(mine) == 1 and "BatchNorm1d" in mine[0] and "module=model" in mine[0], mine
        else:
            assert not mine, mine


if __name__ == "__main__":
    run_cases(globals())
