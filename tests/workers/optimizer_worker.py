"""DistributedOptimizer on N ranks equals one process with N times the batch (its checks and
gradient paths: optimizer_checks_worker.py)."""

import contextlib
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import labelled, only_at, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

B = 4  # per-rank batch
STEPS = 4


class Net(nn.Module):
    """Conv, linear and embedding layers, an fp64 parameter, a branch no rank uses and a
    branch only samples flagged 1 reach (all of them live on rank 0)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)
        self.emb = nn.Embedding(10, 6)
        self.fc = nn.Linear(4 * 4 + 6, 64)
        self.head = nn.Linear(64, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3, dtype=torch.float64))
        self.only_flagged = nn.Linear(64, 3)
        self.unused = nn.Linear(5, 5)
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)

    def forward(self, x, tok, flag):
        h = torch.cat([self.conv(x).flatten(1), self.emb(tok)], 1)
        h = torch.relu(self.fc(h))
        out = self.head(h) * self.scale.float()
        if bool(flag.any()):
            out = out + self.only_flagged(h) * flag[:, None]
        return out


def make_data(n):
    g = torch.Generator().manual_seed(123)
    x = torch.randn(n, 2, 6, generator=g)
    tok = torch.randint(0, 10, (n,), generator=g)
    y = torch.randn(n, 3, generator=g)
    flag = torch.zeros(n)
    flag[: B // 2] = 1.0  # the first samples, all inside rank 0's shard
    return x, tok, y, flag


def shard(t, r):
    return t[r * B : (r + 1) * B]


def make_model():
    torch.manual_seed(7)
    return Net()


def assert_identical_across_ranks(model):
    for name, p in model.named_parameters():
        hi = fm.allreduce_(p.detach().clone(), "max")
        lo = fm.allreduce_(p.detach().clone(), "min")
        assert torch.equal(hi, lo), f"{name} differs across ranks on rank {fm.local_rank()}"


def train(opt_factory, distributed, steps=STEPS, set_to_none=True, wrap=None, closure=False):
    n, r = fm.total_workers(), fm.local_rank()
    model = make_model()
    x, tok, y, flag = make_data(n * B)
    if distributed:
        x, tok, y, flag = (shard(t, r) for t in (x, tok, y, flag))
    base = opt_factory(model.parameters())
    opt = fm.DistributedOptimizer(base, **(wrap or {})) if distributed else base
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        if closure:

            def f():
                opt.zero_grad()
                loss = F.mse_loss(model(x, tok, flag), y)
                loss.backward()
                return loss

            opt.step(f)
        else:
            F.mse_loss(model(x, tok, flag), y).backward()
            opt.step()
        if distributed:
            assert_identical_across_ranks(model)
    return model, opt


def check_equivalent(opt_factory, rtol=1e-5, atol=1e-6, **kw):
    dist, _ = train(opt_factory, True, **kw)
    ref, _ = train(opt_factory, False, **{k: v for k, v in kw.items() if k != "wrap"})
    for (name, a), b in zip(dist.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=labelled(name))
    # the branch nobody uses kept grad None, so weight decay never touched it
    assert dist.unused.weight.grad is None
    torch.testing.assert_close(dist.unused.weight, make_model().unused.weight, rtol=0, atol=0)
    return dist


SGD = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-2)  # noqa: E731
ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=1e-2)  # noqa: E731


def case_sgd_equivalence():
    check_equivalent(SGD)


def case_adamw_equivalence():
    check_equivalent(ADAMW)


def case_small_buckets_and_direct_paths():
    # tiny caps: many fused buckets, every tensor >= 256 bytes direct
    check_equivalent(SGD, wrap=dict(bucket_cap_mb=0.0005, direct_min_bytes=256))
    check_equivalent(ADAMW, wrap=dict(bucket_cap_mb=1000, direct_min_bytes=1 << 40))


@only_at(2)  # inductor's compile costs ~6 s a launch; 2 ranks make the point
def case_torch_compile_matches_one_process():
    # A torch.compile'd model (inductor, the default backend): its backward still fires the
    # parameters' post-accumulate hooks, so N ranks equal one process with the whole batch.
    n, r = fm.total_workers(), fm.local_rank()
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(n * B, 8, generator=g), torch.randn(n * B, 2, generator=g)

    def run(distributed):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt = fm.DistributedOptimizer(base) if distributed else base
        forward = torch.compile(model) if distributed else model
        xs, ys = (shard(x, r), shard(y, r)) if distributed else (x, y)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(forward(xs), ys).backward()
            opt.step()
        return model

    dist, ref = run(True), run(False)
    assert_identical_across_ranks(dist)
    for (name, a), b in zip(dist.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(name))


def case_large_gradients_reduced_in_place():
    # A 1.2 MB weight takes the default direct path: reduced in autograd's own tensor, with the
    # ring allreduce dividing inside its last step. It must still equal one process with the
    # whole batch, for fresh and for in-place-zeroed gradients, and with accumulation.
    n, r = fm.total_workers(), fm.local_rank()
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(n * B, 512, generator=g), torch.randn(n * B, 600, generator=g)

    def run(distributed, set_to_none, accumulate):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(512, 600), nn.Tanh(), nn.Linear(600, 600))
        base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        opt = fm.DistributedOptimizer(base) if distributed else base
        xs, ys = (x[r * B : (r + 1) * B], y[r * B : (r + 1) * B]) if distributed else (x, y)
        for _ in range(3):
            opt.zero_grad(set_to_none=set_to_none)
            if accumulate:  # two half batches, the first without communication
                h = xs.shape[0] // 2
                ctx = opt.no_sync() if distributed else contextlib.nullcontext()
                with ctx:
                    (F.mse_loss(model(xs[:h]), ys[:h]) / 2).backward()
                (F.mse_loss(model(xs[h:]), ys[h:]) / 2).backward()
            else:
                F.mse_loss(model(xs), ys).backward()
            if distributed:
                w = model[0].weight
                assert w.grad.untyped_storage().nbytes() == w.grad.nbytes, (
                    "a >= 1 MiB gradient should live in its own storage"
                )
            opt.step()
        return model

    for set_to_none, accumulate in ((True, False), (False, False), (True, True)):
        dist = run(True, set_to_none, accumulate)
        assert_identical_across_ranks(dist)
        ref = run(False, set_to_none, accumulate)
        for (name, a), b in zip(dist.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(name))


def case_complex_parameters_match_one_process():
    # Complex gradients reduce as pairs of reals, in a fused bucket and on the direct path
    # (a 1.2 MB complex weight); the result must equal one process with the whole batch.
    n, r = fm.total_workers(), fm.local_rank()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(n * B, 300, generator=g, dtype=torch.complex64)

    def run(distributed, op="average"):
        torch.manual_seed(4)
        model = nn.Sequential(nn.Linear(300, 500), nn.Linear(500, 3)).to(torch.complex64)
        base = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        opt = fm.DistributedOptimizer(base, op=op) if distributed else base
        xs = x[r * B : (r + 1) * B] if distributed else x
        for _ in range(3):
            opt.zero_grad()
            model(xs).abs().pow(2).mean().backward()
            opt.step()
        return model

    dist = run(True)
    for name, p in dist.named_parameters():
        pairs = torch.view_as_real(p.detach())
        hi, lo = fm.allreduce_(pairs.clone(), "max"), fm.allreduce_(pairs.clone(), "min")
        assert torch.equal(hi, lo), f"{name} differs across ranks on rank {r}"
    ref = run(False)
    for (name, a), b in zip(dist.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=labelled(name))


def case_zero_grad_in_place():
    check_equivalent(SGD, set_to_none=False)


def case_other_optimizers():
    for f in (
        lambda ps: torch.optim.Adam(ps, lr=1e-2),
        lambda ps: torch.optim.RMSprop(ps, lr=1e-3),
        lambda ps: torch.optim.Adagrad(ps, lr=1e-2),
    ):
        check_equivalent(f)


def case_lbfgs_closure():
    check_equivalent(
        lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4),
        steps=2,
        closure=True,
        rtol=1e-4,
        atol=1e-5,
    )


def case_sum_gives_n_times_the_gradient():
    n = fm.total_workers()
    model = make_model()
    x, tok, y, flag = make_data(B)  # the same data on every rank
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op="sum")
    F.mse_loss(model(x, tok, flag), y).backward()
    local = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    opt.synchronize()
    for k, p in model.named_parameters():
        if k in local:
            torch.testing.assert_close(p.grad, local[k] * n, rtol=1e-6, atol=1e-7)


def case_accumulation_equals_double_batch():
    n, r = fm.total_workers(), fm.local_rank()
    for mode in ("passes", "no_sync"):
        model = make_model()
        x, tok, y, flag = make_data(2 * n * B)
        kw = {"backward_passes_per_step": 2} if mode == "passes" else {}
        opt = fm.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), **kw
        )
        ref = make_model()
        ropt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            for half in range(2):  # rank r's two micro-batches
                sl = slice((2 * r + half) * B, (2 * r + half + 1) * B)
                ctx = (
                    opt.no_sync() if (mode == "no_sync" and half == 0) else contextlib.nullcontext()
                )
                with ctx:
                    (F.mse_loss(model(x[sl], tok[sl], flag[sl]), y[sl]) / 2).backward()
            opt.step()
            ropt.zero_grad()
            F.mse_loss(ref(x, tok, flag), y).backward()
            ropt.step()
        for (k, a), b in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=labelled(f"{mode} {k}"))


def case_compression():
    exact, _ = train(SGD, True, steps=2)
    for comp, tol in (("fp16", 2e-3), ("bf16", 2e-2)):
        m, _ = train(SGD, True, steps=2, wrap=dict(compression=comp))
        for (k, a), b in zip(m.named_parameters(), exact.parameters()):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=labelled(f"{comp} {k}"))


def case_clip_after_synchronize_and_scheduler():
    n, r = fm.total_workers(), fm.local_rank()
    results = []
    for distributed in (True, False):
        model = make_model()
        x, tok, y, flag = make_data(n * B)
        if distributed:
            x, tok, y, flag = (shard(t, r) for t in (x, tok, y, flag))
        base = torch.optim.SGD(model.parameters(), lr=0.1)
        opt = fm.DistributedOptimizer(base) if distributed else base
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(x, tok, flag), y).backward()
            if distributed:
                opt.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            if distributed:
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            sched.step()
        assert abs(base.param_groups[0]["lr"] - 0.1 * 0.5**3) < 1e-12
        results.append(model)
    for a, b in zip(results[0].parameters(), results[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def case_state_dict_roundtrip():
    model, opt = train(ADAMW, True, steps=2)
    sd = opt.state_dict()
    fresh = fm.DistributedOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
    )
    fresh.load_state_dict(sd)
    assert fresh.state_dict()["state"].keys() == sd["state"].keys()
    assert len(fresh.param_groups) == 1 and fresh.param_groups is fresh.optimizer.param_groups


if __name__ == "__main__":
    run_cases(globals())
