"""torch.distributed on the fluxmpi backend, training: DDP (with its comm hooks, PowerSGD's
among them, and gloo's sum order, bit for bit), ZeroRedundancyOptimizer, SyncBatchNorm under
DDP and FSDP's fully_shard, each against gloo or one process (the collectives:
c10d_worker.py, c10d_async_worker.py).
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from c10d_worker import check_equal, gloo, rank, setup, world  # noqa: E402
from harness import labelled, raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_ddp_powersgd_hook_equals_gloo():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    setup()

    def hook(group):
        state = ps.PowerSGDState(
            process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2
        )
        return lambda _state, bucket: ps.powerSGD_hook(state, bucket)

    same_params(train_ddp(None, steps=5, hook=hook(None)),
                train_ddp(gloo(), steps=5, hook=hook(gloo())), "powerSGD_hook",
                rtol=1e-4, atol=1e-5)  # fmt: skip


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 32)
        self.b = nn.Linear(32, 4)
        self.unused = nn.Linear(4, 4)  # no gradient when `skip` is set

    def forward(self, x, skip=False):
        y = self.b(torch.relu(self.a(x)))
        return y if skip else self.unused(y)


def train_ddp(group, steps=4, hook=None, no_sync=False, skip_unused=False, **ddp_kwargs):
    """Parameters after `steps` SGD steps of DDP over `group` (None: the default, fluxmpi)."""
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model, process_group=group, **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(group if group is not None else dist.group.WORLD, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank())
    for step in range(steps):
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        if no_sync and step % 2 == 0:
            with ddp.no_sync():
                nn.functional.mse_loss(ddp(x, skip_unused), y).backward()
            x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        nn.functional.mse_loss(ddp(x, skip_unused), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def same_params(got, want, label, rtol=1e-5, atol=1e-6):
    """Bit for bit at 1 and 2 ranks. At 3 ranks gloo and MPI add the three contributions in
    different orders, so the sums may differ in the last bit (of fp16 under the fp16 hook:
    gloo rounds each partial sum to fp16, fluxmpi sums in fp32 and rounds once)."""
    for i, (a, b) in enumerate(zip(got, want)):
        if world() <= 2:
            assert torch.equal(a, b), f"{label}: parameter {i} differs: {(a - b).abs().max()}"
        else:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=labelled(f"{label} {i}"))


DDP_VARIANTS = {
    "plain": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "find_unused_parameters": {"find_unused_parameters": True, "skip_unused": True},
    "no_sync": {"no_sync": True},
    "static_graph": {"static_graph": True},
    "small buckets": {"bucket_cap_mb": 0.001},
}


def case_ddp_equals_ddp_on_gloo():
    for label, kw in DDP_VARIANTS.items():
        same_params(train_ddp(None, **kw), train_ddp(gloo(), **kw), label)


class gloo_order:
    """fluxmpi_py.set_sum_order("gloo") inside the block, "fastest" after it."""

    def __enter__(self):
        fm.set_sum_order("gloo")

    def __exit__(self, *exc):
        fm.set_sum_order("fastest")


def case_ddp_in_gloo_order_equals_ddp_on_gloo_bit_for_bit():
    """With the sum order "gloo", DDP on fluxmpi equals DDP on gloo bit for bit at every world
    size, every variant and the fp16 hook; over 3 ranks and more the sums took gloo's order."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    from fluxmpi_py._core import C

    setup()
    before = C.gloo_order_calls()
    with gloo_order():
        for label, kw in DDP_VARIANTS.items():
            got, want = train_ddp(None, **kw), train_ddp(gloo(), **kw)
            for i, (a, b) in enumerate(zip(got, want)):
                assert torch.equal(a, b), f"{label}: parameter {i} differs: {(a - b).abs().max()}"
        got = train_ddp(None, hook=fp16_compress_hook)
        want = train_ddp(gloo(), hook=fp16_compress_hook)
        for i, (a, b) in enumerate(zip(got, want)):
            assert torch.equal(a, b), f"fp16 hook: parameter {i} differs: {(a - b).abs().max()}"
    assert (C.gloo_order_calls() > before) == (world() >= 3), (before, C.gloo_order_calls())


def noisy(n, dtype, seed):
    """n values over many magnitudes (sums of three round differently in different orders)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp(
        torch.randn(n, generator=g, dtype=torch.float64) * 3)  # fmt: skip
    return x.to(dtype)


def case_all_reduce_in_gloo_order_has_gloos_bits():
    """all_reduce and fm.allreduce_ sums in gloo's order equal gloo's all_reduce bit for bit:
    every float dtype, sizes from one element to several of gloo's 1 MiB segments per rank, a
    non-contiguous tensor, complex. In the default order the same sums differ from gloo's at
    3 ranks (so this test can fail)."""
    n, r = world(), rank()
    sizes = [1, 2, 7, 1001, 300007 * max(1, n - 1)]
    with gloo_order():
        for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            for size in sizes:
                x = noisy(size, dt, 1000 * r + size)
                want = x.clone()
                dist.all_reduce(want, group=gloo())
                got = x.clone()
                dist.all_reduce(got)
                assert torch.equal(got, want), labelled(f"all_reduce {dt} {size}")
                got = fm.allreduce_(x.clone())
                assert torch.equal(got, want), labelled(f"allreduce_ {dt} {size}")
        x = noisy(60, torch.float32, r).reshape(6, 10)
        want = x.t().contiguous()
        dist.all_reduce(want, group=gloo())
        got = x.t()  # not contiguous
        dist.all_reduce(got)
        assert torch.equal(got, want), labelled("transposed")
        z = torch.complex(noisy(9, torch.float32, r), noisy(9, torch.float32, r + 50))
        want = z.clone()
        dist.all_reduce(want, group=gloo())
        got = z.clone()
        dist.all_reduce(got)
        assert torch.equal(got, want), labelled("complex")
    x = noisy(1001, torch.float32, 1000 * r + 1001)
    want, got = x.clone(), x.clone()
    dist.all_reduce(want, group=gloo())
    dist.all_reduce(got)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if n >= 3:
        assert not torch.equal(got, want), "the default order happened to be gloo's"


def case_ranks_in_different_sum_orders_raise_on_every_rank():
    n, r = world(), rank()
    if n == 1:
        return
    fm.set_sum_order("gloo" if r == 0 else "fastest")
    try:
        raises(RuntimeError, lambda: dist.all_reduce(torch.ones(3)), "ranks disagree on op",
               "rank 0 has sum in gloo's order", "rank 1 has sum")  # fmt: skip
    finally:
        fm.set_sum_order("fastest")
    t = torch.ones(3)
    dist.all_reduce(t)
    check_equal(t, torch.full((3,), float(n)), "after the error")
    raises(ValueError, lambda: fm.set_sum_order("ring"), "'fastest' or 'gloo'", "'ring'")
    raises(TypeError, lambda: fm.set_sum_order(1), "int")
    assert fm.sum_order() == "fastest"


def case_ddp_fp16_compress_hook_equals_gloo():
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    same_params(train_ddp(None, hook=fp16_compress_hook),
                train_ddp(gloo(), hook=fp16_compress_hook), "fp16_compress_hook",
                rtol=2e-3, atol=1e-4)  # fmt: skip


def full_batches(steps, per_rank=6):
    """Every rank's batches for each step (each rank draws its own, as train_ddp does)."""
    gens = [torch.Generator().manual_seed(100 + s) for s in range(world())]
    out = []
    for _ in range(steps):
        xs, ys = [], []
        for g in gens:
            xs.append(torch.randn(per_rank, 8, generator=g))
            ys.append(torch.randn(per_rank, 4, generator=g))
        out.append((xs, ys))
    return out


def single_process(steps, opt_fn):
    """Parameters after `steps` steps on one process over every rank's batch."""
    torch.manual_seed(0)
    model = Net()
    opt = opt_fn(model.parameters())
    for xs, ys in full_batches(steps):
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def case_zero_redundancy_optimizer_equals_single_process():
    from torch.distributed.optim import ZeroRedundancyOptimizer

    steps = 3
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    for xs, ys in full_batches(steps):
        nn.functional.mse_loss(ddp(xs[rank()]), ys[rank()]).backward()
        opt.step()
        opt.zero_grad()
    got = [p.detach() for p in model.parameters()]
    want = single_process(steps, lambda ps: torch.optim.Adam(ps, lr=0.01))
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(f"param {i}"))
    opt.consolidate_state_dict(to=0)
    if rank() == 0:
        assert len(opt.state_dict()["state"]) == len(want)


def case_fluxmpi_sync_batchnorm_under_ddp_equals_single_process():
    # torch's nn.SyncBatchNorm needs CUDA modules under DDP; fm.SyncBatchNorm runs on CPU: the
    # parameters and running statistics equal one process on every rank's batch.
    def bn_net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))

    setup()
    steps = 3
    model = fm.SyncBatchNorm.convert_sync_batchnorm(bn_net())
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    one = bn_net()
    one_opt = torch.optim.SGD(one.parameters(), lr=0.1, momentum=0.9)
    for xs, ys in full_batches(steps):
        nn.functional.mse_loss(ddp(xs[rank()]), ys[rank()]).backward()
        opt.step()
        opt.zero_grad()
        nn.functional.mse_loss(one(torch.cat(xs)), torch.cat(ys)).backward()
        one_opt.step()
        one_opt.zero_grad()
    for (name, a), b in zip(model.state_dict().items(), one.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(name))


def fully_shard_matches_one_process(mesh):
    """fully_shard on ``mesh`` (a replicate dimension too when it is 2-D), 3 SGD steps on each
    rank's batch: the full parameters equal one process on every rank's batch."""
    from torch.distributed.fsdp import fully_shard

    steps = 3
    torch.manual_seed(0)
    model = Net()
    fully_shard(model.a, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xs, ys in full_batches(steps):
        nn.functional.mse_loss(model(xs[rank()]), ys[rank()]).backward()
        opt.step()
        opt.zero_grad()
    got = [p.full_tensor().detach() for p in model.parameters()]
    want = single_process(steps, lambda ps: torch.optim.SGD(ps, lr=0.1))
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(f"param {i}"))


def case_fsdp_fully_shard_equals_single_process():
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard_matches_one_process(init_device_mesh("cpu", (world(),)))


if __name__ == "__main__":
    run_cases(globals())
    dist.destroy_process_group()
