"""synchronize_ on containers and plain values, and what it refuses: mismatched shapes and
structures, unsupported types and bad roots raise on every rank and change nothing (the
tensors, modules and optimizers: sync_worker.py, sync_relocation_worker.py).
"""

import collections
import functools
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises as expect_raise  # noqa: E402
from sync_worker import SMALL, Box, Frozen, Net, Point, R, W, fill, form, roots  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


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
