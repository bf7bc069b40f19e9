"""SyncBatchNorm on N ranks with batch B against torch's BatchNorm in one process with batch N*B:
outputs, running statistics, input and parameter gradients, DistributedOptimizer steps; eval
mode; a rank with an empty batch; convert_sync_batchnorm on a nested model; ranks that
disagree raise on every rank.

Run by tests/test_sync_batchnorm.py under mpiexec at 1, 2 and 3 ranks.
"""

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

B = 4
TOL = dict(rtol=1e-4, atol=1e-5)


def rank():
    return fm.local_rank()


def world():
    return fm.total_workers()


def global_batch(rows_per_rank, shape, seed):
    """The same batch on every rank: rank r's rows are shifted by r and scaled by 1 + r, so
    that no rank's statistics are the global ones."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for r, rows in enumerate(rows_per_rank):
        parts.append(torch.randn((rows, *shape), generator=g) * (1 + r) + r)
    return torch.cat(parts)


def my_rows(rows_per_rank):
    start = sum(rows_per_rank[: rank()])
    return slice(start, start + rows_per_rank[rank()])


def close(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    assert torch.allclose(got, want, **TOL), f"{what} on rank {rank()}: max error {err}"


def averaged(t):
    return fm.allreduce_(t.clone(), "average")


def check_against_one_process(bn_cls, shape, momentum, steps=2):
    """Per-rank loss: the mean over the rank's batch of out * w (w fixed); the reference: the
    mean over the whole batch. So the input gradient on a rank is N times the reference's on
    its rows, and the averaged parameter gradients are the reference's."""
    n = world()
    counts = [B] * n
    ref = bn_cls(shape[0], momentum=momentum)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
        ref.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
    sbn = fm.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref))
    assert isinstance(sbn, fm.SyncBatchNorm), type(sbn)
    for step in range(steps):
        x_all = global_batch(counts, shape, seed=10 + step).requires_grad_()
        w_all = global_batch(counts, shape, seed=20 + step)
        mine = my_rows(counts)
        x = x_all.detach()[mine].clone().requires_grad_()
        what = f"{bn_cls.__name__}{(B, *shape)} momentum={momentum} step {step}"

        y_ref = ref(x_all)
        (y_ref * w_all).sum().div(n * B).backward()
        y = sbn(x)
        (y * w_all[mine]).sum().div(B).backward()

        close(y, y_ref.detach()[mine], f"{what}: output")
        close(x.grad, n * x_all.grad[mine], f"{what}: input grad")
        close(averaged(sbn.weight.grad), ref.weight.grad, f"{what}: weight grad")
        close(averaged(sbn.bias.grad), ref.bias.grad, f"{what}: bias grad")
        close(sbn.running_mean, ref.running_mean, f"{what}: running_mean")
        close(sbn.running_var, ref.running_var, f"{what}: running_var")
        assert int(sbn.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
        for m in (ref, sbn):
            m.weight.grad = m.bias.grad = None


def case_batchnorm1d_2d_input_matches_one_process():
    check_against_one_process(torch.nn.BatchNorm1d, (3,), momentum=0.1)


def case_batchnorm1d_3d_input_matches_one_process():
    check_against_one_process(torch.nn.BatchNorm1d, (3, 5), momentum=0.1)


def case_batchnorm2d_matches_one_process():
    check_against_one_process(torch.nn.BatchNorm2d, (2, 3, 4), momentum=0.3)


def case_large_mean_small_spread_keeps_the_variance():
    """Values near 1000 with spread ~1 by rank: fp32 sum-of-squares minus squared mean would
    lose the variance to cancellation (~0.1 absolute); the per-rank mean and squared deviations
    keep it."""
    n = world()
    x_all = global_batch([B] * n, (3, 8), seed=70) + 1000.0
    ref = torch.nn.BatchNorm1d(3, momentum=1.0)
    sbn = fm.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref))
    ref(x_all)
    sbn(x_all[my_rows([B] * n)])
    err = (sbn.running_var - ref.running_var).abs().max().item()
    assert err < 1e-3, f"running_var {sbn.running_var.tolist()} vs {ref.running_var.tolist()}"
    assert torch.allclose(sbn.running_mean, ref.running_mean, rtol=1e-6, atol=0)


def case_momentum_none_is_a_cumulative_average():
    check_against_one_process(torch.nn.BatchNorm1d, (3, 2), momentum=None, steps=3)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 2)
    )


def case_distributed_optimizer_steps_match_one_process():
    n = world()
    counts = [B] * n
    ref = make_model()
    model = fm.SyncBatchNorm.convert_sync_batchnorm(make_model())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    for step in range(3):
        x_all = global_batch(counts, (4,), seed=30 + step)
        t_all = global_batch(counts, (2,), seed=40 + step)
        mine = my_rows(counts)
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x_all), t_all).backward()
        ref_opt.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x_all[mine]), t_all[mine]).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        close(p.detach(), q.detach(), f"after 3 steps: {name}")
    close(model[1].running_mean, ref[1].running_mean, "after 3 steps: running_mean")
    close(model[1].running_var, ref[1].running_var, "after 3 steps: running_var")


def case_eval_mode_is_plain_batchnorm_without_communication():
    ref = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        ref.running_var.copy_(torch.tensor([1.5, 0.25, 4.0]))
        ref.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
    sbn = fm.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref)).eval()
    ref.eval()
    # Only rank 0 runs eval forwards, with its own batch size: were eval to communicate, the
    # allreduce below would meet it and raise (or hang until the timeout).
    if rank() == 0:
        for rows in (5, 1, 0):
            x = torch.randn(rows, 3, 2, 2) + 1
            close(sbn(x), ref(x), f"eval output, batch {rows}")
        assert int(sbn.num_batches_tracked) == 0
        close(sbn.running_mean, ref.running_mean, "eval leaves running_mean")
    assert fm.allreduce_(torch.ones(1)).item() == world()


def case_rank_with_empty_batch_takes_part():
    n = world()
    if n == 1:  # nothing to take part in: the only rank's empty batch raises
        bn = fm.SyncBatchNorm(3)
        raises(ValueError, lambda: bn(torch.zeros(0, 3)), "more than 1 value per channel", "0")
        return
    counts = [0] + [B + r for r in range(1, n)]  # rank 0 has no rows
    shape = (3, 2)
    ref = torch.nn.BatchNorm1d(3)
    sbn = fm.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref))
    total = sum(counts)
    for step in range(2):
        x_all = global_batch(counts, shape, seed=50 + step).requires_grad_()
        w_all = global_batch(counts, shape, seed=60 + step)
        mine = my_rows(counts)
        x = x_all.detach()[mine].clone().requires_grad_()
        y_ref = ref(x_all)
        (y_ref * w_all).sum().div(total).backward()
        y = sbn(x)
        (y * w_all[mine]).sum().div(total).backward()
        what = f"rank 0 empty, step {step}"
        assert y.shape == (counts[rank()], *shape), (what, y.shape)
        close(y, y_ref.detach()[mine], f"{what}: output")
        close(x.grad, x_all.grad[mine], f"{what}: input grad")
        close(fm.allreduce_(sbn.weight.grad.clone()), ref.weight.grad, f"{what}: weight grad")
        close(sbn.running_mean, ref.running_mean, f"{what}: running_mean")
        close(sbn.running_var, ref.running_var, f"{what}: running_var")
        for m in (ref, sbn):
            m.weight.grad = m.bias.grad = None


def case_every_rank_empty_raises_on_every_rank():
    bn = fm.SyncBatchNorm(2)
    raises(ValueError, lambda: bn(torch.zeros(0, 2, 3)), "more than 1 value per channel")
    assert fm.allreduce_(torch.ones(1)).item() == world()


def case_wrong_channel_count_on_one_rank_raises_on_every_rank():
    bn = fm.SyncBatchNorm(3)
    x = torch.randn(B, 4 if rank() == world() - 1 else 3)
    raises(TypeError, lambda: bn(x), "SyncBatchNorm(3)", "dim 1 must be 3", f"rank {world() - 1}")
    assert fm.allreduce_(torch.ones(1)).item() == world()


def case_one_rank_in_eval_mode_raises_not_hangs():
    if world() == 1:
        return
    bn = fm.SyncBatchNorm(3)
    x = torch.randn(B, 3)
    if rank() == 0:
        bn.eval()
        bn(x)  # no collective in eval: rank 0 goes on to its next one, which meets the forward's
        raises(RuntimeError, lambda: fm.allreduce_(torch.ones(1)), "different calls")
    else:
        raises(RuntimeError, lambda: bn(x), "different calls", "SyncBatchNorm.forward()")
    assert fm.allreduce_(torch.ones(1)).item() == world()


def case_convert_nested_model_keeps_state():
    inner = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 1), torch.nn.BatchNorm2d(4, eps=1e-3, momentum=None)
    )
    model = torch.nn.ModuleDict(
        dict(
            block=torch.nn.Sequential(inner, torch.nn.BatchNorm3d(4, affine=False)),
            head=torch.nn.BatchNorm1d(5, track_running_stats=False),
            plain=torch.nn.Linear(3, 3),
        )
    )
    inner[1].eval()
    with torch.no_grad():
        inner[1].running_mean.fill_(0.25)
        inner[1].num_batches_tracked.fill_(7)
    weight, running_mean = inner[1].weight, inner[1].running_mean
    converted = fm.SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted is model
    bn2 = model["block"][0][1]
    assert type(bn2) is fm.SyncBatchNorm
    assert bn2.weight is weight and bn2.running_mean is running_mean
    assert bn2.eps == 1e-3 and bn2.momentum is None and not bn2.training
    assert int(bn2.num_batches_tracked) == 7
    bn3 = model["block"][1]
    assert type(bn3) is fm.SyncBatchNorm and not bn3.affine and bn3.weight is None
    head = model["head"]
    assert type(head) is fm.SyncBatchNorm and not head.track_running_stats
    assert head.running_mean is None and head.training
    assert type(model["plain"]) is torch.nn.Linear
    again = fm.SyncBatchNorm.convert_sync_batchnorm(model)
    assert again["block"][0][1] is bn2  # already converted: kept
    root = fm.SyncBatchNorm.convert_sync_batchnorm(torch.nn.BatchNorm1d(2))
    assert type(root) is fm.SyncBatchNorm
    # The converted model trains: head (no running stats) syncs, and bn3 does too.
    out = model["head"](torch.randn(B, 5))
    assert out.shape == (B, 5)


if __name__ == "__main__":
    run_cases(globals())
