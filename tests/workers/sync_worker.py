"""synchronize_ on every kind of object, at any world size and for every root.

On rank r every value is a closed form of r (e.g. ``arange(n) + 10 * r``), so after a
synchronize_ from root R each rank checks that it holds exactly the form of R; before, the
non-root ranks check that they held something else. Mismatches must raise on every rank and
leave every rank's values as they were.
"""

import collections
import copy
import dataclasses
import functools
import os
import sys

import numpy
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises as expect_raise  # noqa: E402

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


def case_relocation_then_in_place_broadcasts():
    # The first call moves the small parameters into one flat storage (with >1 rank); later
    # calls broadcast it in place. The objects, values, leaf-ness and autograd stay intact.
    m = Net()
    fill(m, R())
    before = [id(p) for p in m.parameters()]
    fm.synchronize_(m, root_rank=0)
    params = list(m.parameters())
    assert [id(p) for p in params] == before
    assert_like(m, 0)
    if W() > 1:
        assert shares_one_storage(params), "small parameters were not relocated"
    assert not shares_one_storage(list(m.buffers())[:2])  # buffers never move
    assert all(p.is_leaf and p.requires_grad for p in params)
    for root in roots():
        fill(m, R() + 7)  # in place, into the relocated storage
        fm.synchronize_(m, root_rank=root)
        ref = Net()
        fill(ref, root + 7)
        for (n, a), (_, b) in zip(m.state_dict().items(), ref.state_dict().items()):
            assert torch.equal(a, b), (n, root)
    # Gradients and an optimizer step still work on relocated parameters.
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.ones(4, 4)).sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in m.parameters())
    opt.step()
    for p in m.parameters():
        identical_everywhere(p)


def case_relocated_model_broadcasts_without_copies():
    # A model of small parameters only: after the first call nothing is copied, even though a
    # Python storage object was made for every parameter beforehand (as torch.save does).
    from fluxmpi_py._core import C

    m = nn.Sequential(*[nn.Linear(16, 16) for _ in range(30)])
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(R())
    storages = [p.untyped_storage() for p in m.parameters()]
    del storages
    fm.synchronize_(m, root_rank=0)
    if W() > 1:
        assert shares_one_storage(list(m.parameters()))
    for root in roots():
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(R() + 3)
        copied, in_place = C.sync_copy_counters()
        fm.synchronize_(m, root_rank=root)
        copied2, in_place2 = C.sync_copy_counters()
        assert all(bool((p == root + 3).all()) for p in m.parameters())
        if W() > 1:
            assert copied2 == copied, f"{copied2 - copied} bytes copied"
            assert in_place2 - in_place >= sum(p.numel() * 4 for p in m.parameters())
    # A storage object someone holds is a holder: the home is then left alone (copies again).
    held = m[0].weight.untyped_storage()
    copied, _ = C.sync_copy_counters()
    fm.synchronize_(m, root_rank=0)
    assert held.data_ptr() == m[0].weight.untyped_storage().data_ptr()
    if W() > 1:
        assert C.sync_copy_counters()[0] > copied


def all_identical(model):
    # In a function: a tensor of the state_dict left in a caller's variable would hold the
    # flat storage, which rightly stops in-place broadcasts.
    for t in model.state_dict().values():
        identical_everywhere(t)


def case_large_parameters_travel_packed_once_relocated():
    # A 256 KiB weight is over direct_bytes (64 KiB). Relocated with the small parameters into
    # one flat storage, it then travels in the same in-place broadcast as they do.
    from fluxmpi_py._core import C

    m = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4))
    fill(m, R())
    fm.synchronize_(m, root_rank=0)
    params = list(m.parameters())
    if W() > 1:
        assert shares_one_storage(params), "the large parameter was not relocated"
    for root in roots():
        fill(m, R() + 3)
        copied, in_place = C.sync_copy_counters()
        fm.synchronize_(m, root_rank=root)
        all_identical(m)
        copied2, in_place2 = C.sync_copy_counters()
        if W() > 1:
            assert copied2 == copied, f"{copied2 - copied} bytes copied"
            assert in_place2 - in_place >= sum(p.numel() * 4 for p in params), "not packed"
    # One rank holds an alias of the large weight's storage: it cannot take that step in
    # place, so it vetoes packing and every rank sends the large weight alone. No hang, the
    # values are the root's, and the alias still aliases.
    m2 = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4))
    fill(m2, R())
    alias = m2[0].weight.detach() if R() == W() - 1 else None
    for _ in range(2):
        fm.synchronize_(m2, root_rank=0)
        all_identical(m2)
    if alias is not None:
        assert alias.data_ptr() == m2[0].weight.data_ptr()
        assert torch.equal(alias, m2[0].weight.detach())
    del alias  # released: the next calls may relocate and pack again
    # relocate differs between ranks (each rank's own argument): the ranks that would pack see
    # the others' veto, and every rank sends the large weight alone. No hang, right values.
    m3 = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 4))
    for i in range(3):
        fill(m3, R() + i)
        fm.synchronize_(m3, root_rank=i % W(), relocate=(R() == 0))
        all_identical(m3)
    for root in roots():
        fill(m2, R() + 5)
        fm.synchronize_(m2, root_rank=root)
        all_identical(m2)


def case_replaced_layer_is_rehomed():
    # After relocation a layer is replaced (as when fine-tuning a new head). The old flat
    # storage is then held only by the remaining parameters: the next call moves them and the
    # new layer into a new flat storage, and later calls broadcast in place again.
    from fluxmpi_py._core import C

    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 3))
    fill(m, R())
    fm.synchronize_(m, root_rank=0)
    m[2] = nn.Linear(8, 5)
    fill(m, R() + 1)
    fm.synchronize_(m, root_rank=W() - 1)
    all_identical(m)
    if W() > 1:
        assert shares_one_storage(list(m.parameters())), "not moved into one new flat storage"
    fill(m, R() + 2)
    copied = C.sync_copy_counters()[0]
    fm.synchronize_(m, root_rank=0)
    all_identical(m)
    assert C.sync_copy_counters()[0] == copied, "copies after the move"


def case_parameter_moved_inside_its_flat_storage():
    # On one rank, a relocated parameter is re-pointed into the padding after its own slot: same
    # storage, same shape, another address. That rank's storage no longer has the plan's layout,
    # so it copies out of a packed buffer instead of receiving in place; every value is the
    # root's. bn.bias is not the parameter whose address anchors the layout (fc.weight is).
    from fluxmpi_py._core import C

    m = Net()
    fill(m, R())
    fm.synchronize_(m, root_rank=0)
    p = m.bn.bias  # 6 floats in a 64-byte slot: floats 8..13 of the slot are padding
    moved = R() == 1 and W() > 1
    if moved:
        assert shares_one_storage(list(m.parameters())), "not relocated"
        flat = torch.empty(0).set_(p.untyped_storage())
        k = p.storage_offset()
        p.data = flat[k + 8 : k + 14]
        del flat
    fill(m, R() + 9)
    copied = C.sync_copy_counters()[0]
    fm.synchronize_(m, root_rank=0)
    for t in m.state_dict().values():
        identical_everywhere(t)
    if moved:
        assert C.sync_copy_counters()[0] > copied, "the moved parameter was not copied"


def case_relocation_skips_shared_storage_and_can_be_turned_off():
    m = Net()
    fill(m, R())
    alias = m.fc.weight.detach()  # another tensor on fc.weight's storage
    view = m.head.bias.detach().numpy()  # numpy shares head.bias's memory through a detach
    fm.synchronize_(m, root_rank=0)
    assert_like(m, 0)
    assert alias.data_ptr() == m.fc.weight.data_ptr(), "a shared parameter was moved"
    assert view.ctypes.data == m.head.bias.data_ptr()
    assert float(view[0]) == float(m.head.bias.detach()[0])
    # Memory that others can see stays where it is: shared memory (share_memory_(), read by
    # other processes) and numpy's memory (from_numpy).
    sh = Net()
    fill(sh, R())
    sh.share_memory()
    arr = numpy.full(6, float(R()), dtype=numpy.float32)
    sh.fc.bias = nn.Parameter(torch.from_numpy(arr))
    ptrs = [p.data_ptr() for p in sh.parameters()]
    fm.synchronize_(sh, root_rank=0)
    assert [p.data_ptr() for p in sh.parameters()] == ptrs, "shared or numpy memory was moved"
    assert all(p.is_shared() for n_, p in sh.named_parameters() if n_ != "fc.bias")
    assert float(arr[0]) == float(sh.fc.bias.detach()[0])  # still numpy's memory
    all_identical(sh)
    n = Net()
    fill(n, R())
    ptrs = [p.data_ptr() for p in n.parameters()]
    fm.synchronize_(n, root_rank=W() - 1, relocate=False)
    assert [p.data_ptr() for p in n.parameters()] == ptrs
    assert_like(n, W() - 1)


def case_cached_walk_sees_modules_change():
    # synchronize_ caches a module's walk; every change to what the module holds must show.
    m = Net()
    fill(m, R())
    fm.synchronize_(m)
    m.fc = nn.Linear(4, 6)  # a new submodule, different values on every rank
    with torch.no_grad():
        m.fc.weight.fill_(R() + 1.0)
    m.register_buffer("extra", torch.full((3,), float(R())))
    old_bias = m.head.bias  # relocated, and still held here (as an optimizer would)
    old_value = old_bias.detach().clone()
    m.head.bias = nn.Parameter(torch.full((3,), 10.0 + R()))
    m.bn.running_mean.fill_(float(R()))
    fm.synchronize_(m, root_rank=W() - 1)
    assert torch.equal(m.fc.weight.detach(), torch.full((6, 4), float(W())))
    assert torch.equal(m.extra, torch.full((3,), float(W() - 1)))
    assert torch.equal(m.head.bias.detach(), torch.full((3,), 10.0 + W() - 1))
    assert torch.equal(m.bn.running_mean, torch.full((6,), float(W() - 1)))
    assert torch.equal(old_bias.detach(), old_value), "a parameter no longer in the module changed"
    # .data replaced after relocation: a new storage, still synchronized
    m.head.weight.data = torch.full((3, 6), float(R()))
    fm.synchronize_(m, root_rank=0)
    assert torch.equal(m.head.weight.detach(), torch.zeros(3, 6))
    # A parameter removed and put back: its dict was modified (a new version tag) but holds the
    # same objects in the same order, so the cached walk still serves, with the right values.
    bias = m.head.bias
    del m.head.bias
    m.head.bias = bias
    fill(m, R() + 5)
    fm.synchronize_(m, root_rank=W() - 1)
    for t in m.state_dict().values():
        identical_everywhere(t)
    # The same bytes seen in another shape on one rank (same storage, same offset): the data
    # could land, but the shapes disagree with the root's, so it raises everywhere.
    fm.synchronize_(m, root_rank=0)
    if R() == 1:
        m.head.weight.data = m.head.weight.data.view(6, 3)
    keep = [t.detach().clone() for t in m.state_dict().values()]
    if W() > 1:
        expect_raise(ValueError, lambda: fm.synchronize_(m, root_rank=0), "head.weight")
        assert all(torch.equal(a, b) for a, b in zip(keep, m.state_dict().values()))
    if R() == 1:
        m.head.weight.data = m.head.weight.data.view(3, 6)
    # A shape that differs from the root's after relocation: raises everywhere, changes nothing
    if R() == 1:
        m.head.bias.data = torch.zeros(4)
    keep = [t.detach().clone() for t in m.state_dict().values()]
    if W() > 1:
        expect_raise(ValueError, lambda: fm.synchronize_(m, root_rank=0), "head.bias")
        assert all(torch.equal(a, b) for a, b in zip(keep, m.state_dict().values()))


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


def case_nested_containers_and_values():
    for root in roots():
        t, u, v, w = form(R(), 3), form(R(), 4), form(R(), 2), form(R(), 6)
        inner = [u, R(), None]
        obj = {
            "t": t,
            "list": inner,
            "tuple": (v, f"s{R()}", b"b" * R()),
            "point": Point(w, R() * 1.5),
            "box": Box(form(R(), 2) + 1, R()),
            "frozen": Frozen(form(R(), 2) + 2, float(R())),
            "ordered": collections.OrderedDict(a=R(), b=form(R(), 1)),
            "default": collections.defaultdict(list, {"k": [R()]}),
            "set": {R(), 100},
            ("key", 1): complex(R(), 1),
            "none": None if R() == root else R(),
        }
        box = obj["box"]
        out = fm.synchronize_(obj, root_rank=root)
        assert out is obj
        assert out["t"] is t and torch.equal(t, form(root, 3))
        assert out["list"] is inner and inner[0] is u and torch.equal(u, form(root, 4))
        assert inner[1:] == [root, None]
        tup = out["tuple"]
        assert (
            tup[0] is v and torch.equal(v, form(root, 2)) and tup[1:] == (f"s{root}", b"b" * root)
        )
        p = out["point"]
        assert type(p) is Point and p.x is w and torch.equal(w, form(root, 6)) and p.y == root * 1.5
        assert out["box"] is box and box.n == root and torch.equal(box.w, form(root, 2) + 1)
        f = out["frozen"]
        assert type(f) is Frozen and f.k == float(root) and torch.equal(f.w, form(root, 2) + 2)
        assert list(out["ordered"]) == ["a", "b"] and out["ordered"]["a"] == root
        assert torch.equal(out["ordered"]["b"], form(root, 1))
        assert out["default"]["k"] == [root] and out["default"]["new"] == []
        assert out["set"] == {root, 100} and out[("key", 1)] == complex(root, 1)
        assert out["none"] is None


def case_values_and_local_rank():
    for root in roots():
        assert fm.synchronize_(fm.local_rank(), root_rank=root) == root
        assert fm.synchronize_(f"rank{R()}", root_rank=root) == f"rank{root}"
        assert fm.synchronize_(None, root_rank=root) is None
        assert fm.synchronize_(2.5 * R(), root_rank=root) == 2.5 * root
        assert fm.synchronize_((R(), [R()]), root_rank=root) == (root, [root])


def case_tensors_the_root_has_and_others_lack_are_created():
    for root in roots():
        if R() == root:
            obj = {"a": form(root, 4), "p": nn.Parameter(form(root, 2)), "l": [form(root, 3)]}
        else:
            obj = {"a": None, "l": [], "extra": form(R(), 9)}
        out = fm.synchronize_(obj, root_rank=root, **SMALL)
        assert sorted(out) == ["a", "l", "p"]
        assert torch.equal(out["a"], form(root, 4)) and torch.equal(out["l"][0], form(root, 3))
        assert isinstance(out["p"], nn.Parameter) and torch.equal(out["p"].detach(), form(root, 2))
        # a whole tensor where others had a number, and a number where others had a tensor
        x = fm.synchronize_(form(R(), 2) if R() == root else R(), root_rank=root)
        assert torch.equal(x, form(root, 2))
        y = fm.synchronize_(7 if R() == root else form(R(), 2), root_rank=root)
        assert y == 7


# --- errors ------------------------------------------------------------------------------


def snapshot(ts):
    return [t.detach().clone() for t in ts]


def case_shape_mismatch_raises_everywhere_and_changes_nothing():
    if W() == 1:
        return
    bad = W() - 1
    for root in range(W() - 1):
        model = nn.Sequential(
            collections.OrderedDict(a=nn.Linear(3, 3), fc=nn.Linear(5, 10 if R() != bad else 9))
        )
        fill(model, R())
        before = snapshot(model.state_dict().values())
        msg = expect_raise(
            ValueError,
            functools.partial(fm.synchronize_, {"model": model}, root_rank=root),
            f"model.fc.weight: shape (9, 5) on rank {bad}, (10, 5) on root {root}",
        )
        assert f"rank {bad}" in msg
        for a, b in zip(model.state_dict().values(), before):
            assert torch.equal(a, b)
        # a mismatch at the very end of a container: the tensors before it stay untouched too
        ts = [form(R(), 3), form(R(), 4), form(R(), 5 if R() != bad else 6)]
        before = snapshot(ts)
        expect_raise(
            ValueError,
            functools.partial(fm.synchronize_, ts, root_rank=root, **SMALL),
            f"[2]: shape (6,) on rank {bad}, (5,) on root {root}",
        )
        assert all(torch.equal(a, b) for a, b in zip(ts, before))
        d = {"x": form(R(), 3, torch.float32 if R() != bad else torch.float64)}
        expect_raise(
            ValueError,
            functools.partial(fm.synchronize_, d, root_rank=root),
            f"x: dtype torch.float64 on rank {bad}, torch.float32 on root {root}",
        )


def case_module_structure_mismatch_raises():
    if W() == 1:
        return
    bad = W() - 1
    root = 0
    m = Net()
    if R() == bad:
        m.extra = nn.Linear(1, 1)
    expect_raise(
        ValueError,
        lambda: fm.synchronize_(m, root_rank=root),
        f"extra.weight: present on rank {bad} but not on root {root}",
    )
    m = Net()
    if R() == bad:
        del m.head.bias
        m.head.register_parameter("bias", None)
    expect_raise(
        ValueError, lambda: fm.synchronize_(m, root_rank=root), f"head.bias: missing on rank {bad}"
    )
    expect_raise(
        TypeError,
        lambda: fm.synchronize_(Net() if R() != bad else 3, root_rank=root),
        f"obj: int on rank {bad}, nn.Module on root {root}",
    )
    opt = torch.optim.SGD([nn.Parameter(torch.ones(2 if R() != bad else 3))], lr=0.1)
    expect_raise(
        ValueError,
        lambda: fm.synchronize_(opt, root_rank=root),
        f"param_groups[0].params[0]: shape (3,) on rank {bad}, (2,) on root {root}",
    )
    g = torch.amp.GradScaler("cpu", enabled=R() != bad)
    expect_raise(
        ValueError,
        lambda: fm.synchronize_(g, root_rank=root),
        f"GradScaler(enabled=False) on rank {bad}, GradScaler(enabled=True) on root",
    )


def case_unsupported_type_and_bad_root():
    expect_raise(TypeError, lambda: fm.synchronize_({"cb": [lambda: 1]}), "cb[0]", "function")
    expect_raise(TypeError, lambda: fm.synchronize_(torch.ones(2).to_sparse()), "obj", "sparse")
    expect_raise(
        ValueError,
        lambda: fm.synchronize_(torch.ones(2), root_rank=W()),
        "root_rank",
        "out of range",
    )
    expect_raise(ValueError, lambda: fm.synchronize_(1, root_rank=-1), "out of range")
    expect_raise(TypeError, lambda: fm.synchronize_(1, root_rank="0"), "root_rank must be an int")
    cyc = []
    cyc.append(cyc)
    expect_raise(TypeError, lambda: fm.synchronize_(cyc), "contains itself")
    # the job is still usable afterwards
    assert fm.synchronize_(R()) == 0


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
