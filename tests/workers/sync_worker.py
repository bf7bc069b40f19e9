"""synchronize_ on tensors, modules and optimizers, at any world size and for every root (the
relocation into flat storages: sync_relocation_worker.py; containers, values and what it
refuses: sync_values_worker.py).

On rank r every value is a closed form of r (e.g. ``arange(n) + 10 * r``), so after a
synchronize_ from root R each rank checks that it holds exactly the form of R; before, the
non-root ranks check that they held something else. Mismatches must raise on every rank and
leave every rank's values as they were.
"""

import collections
import copy
import dataclasses
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fluxmpi_py as fm  # noqa: E402

R = lambda: fm.local_rank()  # noqa: E731
W = lambda: fm.total_workers()  # noqa: E731

# Small caps so that a few tensors exercise packed buckets, several buckets and direct sends.
SMALL = dict(bucket_bytes=256, direct_bytes=128)

Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass
class Box:
    w: torch.Tensor
    n: int
    tag: str = "box"


@dataclasses.dataclass(frozen=True)
class Frozen:
    w: torch.Tensor
    k: float


def form(r, n=5, dtype=torch.float32):
    """The closed-form value of a tensor of n elements on rank r."""
    if dtype == torch.bool:
        return (torch.arange(n) + r) % 2 == 0
    return (torch.arange(n) + 10 * r).to(dtype)


def differs_before(before, root):
    if R() != root:
        assert not torch.equal(before, form(root, before.numel(), before.dtype).view_as(before))


def roots():
    return range(W())


# --- tensors -----------------------------------------------------------------------------


def case_tensor_in_place_every_dtype_and_size():
    dtypes = [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    ]
    for root in roots():
        for dt in dtypes:
            for n in (0, 1, 7, 300):
                t = form(R(), n, dt)
                if n and dt != torch.bool:
                    differs_before(t, root)
                out = fm.synchronize_(t, root_rank=root, **SMALL)
                assert out is t
                assert torch.equal(t, form(root, n, dt)), (dt, n, t)


def case_noncontiguous_and_complex_tensors():
    for root in roots():
        base = form(R(), 12).view(3, 4)
        t = base.t()  # a transposed view: written through to base
        fm.synchronize_(t, root_rank=root)
        assert torch.equal(base, form(root, 12).view(3, 4))
        z = torch.complex(form(R(), 3), form(R(), 3) + 1)
        fm.synchronize_(z, root_rank=root)
        assert torch.equal(z, torch.complex(form(root, 3), form(root, 3) + 1))


def case_many_tensors_across_buckets_and_direct_sends():
    sizes = [1, 3, 16, 17, 40, 64, 65, 2, 100, 5, 0, 33]
    for root in roots():
        for opts in (SMALL, dict(bucket_bytes=64, direct_bytes=1 << 20), {}):
            ts = [form(R(), n) * (i + 1) for i, n in enumerate(sizes)]
            ids = [id(t) for t in ts]
            out = fm.synchronize_(ts, root_rank=root, **opts)
            assert out is ts and [id(t) for t in out] == ids
            for i, (t, n) in enumerate(zip(ts, sizes)):
                assert torch.equal(t, form(root, n) * (i + 1))


def case_rng_state_tensor_and_generator():
    for root in roots():
        torch.manual_seed(100 + R())
        state = fm.synchronize_(torch.get_rng_state(), root_rank=root)
        torch.set_rng_state(state)
        got = torch.rand(4)
        ref = torch.Generator().manual_seed(100 + root)
        assert torch.equal(got, torch.rand(4, generator=ref))
        g = torch.Generator().manual_seed(7 + R())
        torch.rand(R() + 1, generator=g)  # advance differently per rank
        assert fm.synchronize_(g, root_rank=root) is g
        ref = torch.Generator().manual_seed(7 + root)
        torch.rand(root + 1, generator=ref)
        assert torch.equal(torch.rand(5, generator=g), torch.rand(5, generator=ref))


# --- modules -----------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self, hidden=6):
        super().__init__()
        self.fc = nn.Linear(4, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.head = nn.Linear(hidden, 3)
        self.tied = self.head  # a shared submodule: its parameters travel once

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.fc(x))))


def fill(model, r):
    with torch.no_grad():
        for i, t in enumerate(list(model.parameters()) + list(model.buffers())):
            t.copy_(
                form(r, t.numel(), t.dtype).view_as(t) * (i + 1)
                if t.dtype.is_floating_point
                else torch.full_like(t, 3 + r)
            )


def case_module_parameters_and_buffers_in_place():
    for root in roots():
        for opts in (SMALL, {}):
            m, ref = Net(), Net()
            fill(m, R())
            fill(ref, root)
            params = [id(p) for p in m.parameters()]
            assert fm.synchronize_(m, root_rank=root, **opts) is m
            assert [id(p) for p in m.parameters()] == params
            for (n, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()):
                assert torch.equal(a, b), n
            assert all(p.requires_grad for p in m.parameters())


def shares_one_storage(params):
    return len({p.untyped_storage().data_ptr() for p in params}) == 1


def assert_like(m, root):
    ref = Net()
    fill(ref, root)
    for (n, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), (n, R(), root)


# --- optimizers --------------------------------------------------------------------------


class Wrapped:
    """A duck-typed optimizer wrapper, like fluxmpi_py's DistributedOptimizer."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    param_groups = property(lambda self: self.optimizer.param_groups)
    state = property(lambda self: self.optimizer.state)

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, sd):
        self.optimizer.load_state_dict(sd)

    def step(self):
        self.optimizer.step()


def train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad() if hasattr(opt, "zero_grad") else model.zero_grad()
        model(torch.randn(8, 4, generator=g)).pow(2).mean().backward()
        opt.step()


def make_adam(model, r, wrap):
    opt = torch.optim.Adam(
        model.parameters(), lr=1e-2 * (r + 1), betas=(0.9, 0.99 - 0.01 * r), weight_decay=0.1 * r
    )
    return wrap(opt)


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"], (sa["param_groups"], sb["param_groups"])
    assert sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        for name, v in sa["state"][k].items():
            w = sb["state"][k][name]
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(w)), (k, name)


def wrappers():
    out = [lambda o: o, Wrapped]
    if hasattr(fm, "DistributedOptimizer"):
        out.append(fm.DistributedOptimizer)
    return out


def identical_everywhere(t):
    hi, lo = t.detach().clone(), t.detach().clone()
    fm.allreduce_(hi, "max")
    fm.allreduce_(lo, "min")
    assert torch.equal(hi, lo) and torch.equal(hi, t.detach())


def case_adam_trained_on_root_fresh_elsewhere():
    for root in roots():
        for wrap in wrappers():
            # What the root holds: a model and an Adam trained for 3 steps (as if loaded from
            # a checkpoint); every rank computes it, only the root adopts it.
            torch.manual_seed(0)
            ref_model = Net()
            ref_opt = make_adam(ref_model, root, lambda o: o)
            train(ref_model, ref_opt, 3, seed=1)
            torch.manual_seed(0)
            model = Net()
            fill(model, R())
            opt = make_adam(model, R(), wrap)
            if R() == root:
                model.load_state_dict(ref_model.state_dict())
                opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))  # no shared tensors
            else:
                assert len(opt.state_dict()["state"]) == 0

            fm.synchronize_(model, root_rank=root)
            params_before = [p.detach().clone() for p in model.parameters()]
            assert fm.synchronize_(opt, root_rank=root) is opt
            # no dummy step: parameters and step counts are the root's, untouched
            for p, q, r in zip(model.parameters(), params_before, ref_model.parameters()):
                assert torch.equal(p, q) and torch.equal(p, r)
            assert_same_state(opt, ref_opt)
            assert all(float(s["step"]) == 3 for s in opt.state_dict()["state"].values())
            # a following step gives identical parameters on every rank, and the root's result
            train(model, opt, 1, seed=2)
            train(ref_model, ref_opt, 1, seed=2)
            for p, q in zip(model.parameters(), ref_model.parameters()):
                identical_everywhere(p)
                assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
                if wrap is not getattr(fm, "DistributedOptimizer", None):  # it averages grads
                    assert torch.equal(p, q)


def case_optimizer_state_only_on_other_ranks_is_dropped():
    for root in roots():
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (R() + 1), momentum=0.9)
        if R() != root:
            train(model, opt, 1, seed=3)
        fm.synchronize_(opt, root_rank=root)
        sd = opt.state_dict()
        assert sd["state"] == {} or all(
            v.get("momentum_buffer") is None for v in sd["state"].values()
        )
        assert sd["param_groups"][0]["lr"] == 0.1 * (root + 1)


def case_step_zero_adam_hyperparameters():
    for root in roots():
        model = Net()
        opt = make_adam(model, R(), lambda o: o)
        fm.synchronize_(opt, root_rank=root)
        g = opt.param_groups[0]
        assert g["lr"] == 1e-2 * (root + 1) and g["betas"] == (0.9, 0.99 - 0.01 * root)
        assert g["weight_decay"] == 0.1 * root and len(opt.state) == 0


def case_lr_scheduler_and_grad_scaler():
    for root in roots():
        model = nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for _ in range(R() + 1):
            opt.step()
            sched.step()
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (R() + 4), growth_interval=10 + R())
        off = torch.amp.GradScaler("cpu", enabled=False)
        state = {"opt": opt, "sched": sched, "scaler": scaler, "off": off}
        out = fm.synchronize_(state, root_rank=root)
        assert out is state and out["sched"] is sched and out["scaler"] is scaler
        assert sched.last_epoch == root + 1
        assert sched.get_last_lr() == [0.5 ** (root + 1)]
        assert opt.param_groups[0]["lr"] == 0.5 ** (root + 1)
        assert scaler.get_scale() == 2.0 ** (root + 4)
        assert scaler.get_growth_interval() == 10 + root
        assert not off.is_enabled()


# --- containers and values -----------------------------------------------------------------


# --- errors ------------------------------------------------------------------------------


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
