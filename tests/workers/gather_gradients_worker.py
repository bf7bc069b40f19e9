"""The row collectives' gradients (closed forms, and gather and scatter) and the object
collectives (the rest: gather_collectives_worker.py, gather_grouped_worker.py).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gather_collectives_worker import check_equal, rank, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_gradients_closed_forms():
    n, r = world(), rank()
    total = n * (n + 1) / 2
    # allreduce: loss_r = (r + 1) * sum(y); every rank's x gets the sum of all weights
    x = torch.ones(3, requires_grad=True)
    ((r + 1) * fm.allreduce(x)).sum().backward()
    check_equal(x.grad, torch.full((3,), total), "allreduce sum grad")
    x = torch.ones(3, requires_grad=True)
    ((r + 1) * fm.allreduce(x, op="average")).sum().backward()
    check_equal(x.grad, torch.full((3,), total / n), "allreduce average grad")
    # broadcast: the root gets the sum of all weights, the others zero
    x = torch.ones(2, requires_grad=True)
    ((r + 1) * fm.broadcast(x, root_rank=n - 1)).sum().backward()
    check_equal(x.grad, torch.full((2,), total if r == n - 1 else 0.0), "broadcast grad")
    # allgather with uneven rows: loss_s = sum(y * w), w the row index, on every rank alike
    x = torch.ones(r + 1, 2, requires_grad=True)
    y = fm.allgather(x)
    w = torch.arange(float(y.shape[0])).unsqueeze(1)
    (y * w).sum().backward()
    first = r * (r + 1) // 2
    want = n * torch.arange(float(first), float(first + r + 1)).unsqueeze(1).expand(r + 1, 2)
    check_equal(x.grad, want, "allgather grad")
    # reduce_scatter: rank s weighs its part by s + 1, so rows of part s get s + 1
    x = torch.ones(2 * n, 1, requires_grad=True)
    ((r + 1) * fm.reduce_scatter(x)).sum().backward()
    check_equal(x.grad, torch.arange(1.0, n + 1).repeat_interleave(2).unsqueeze(1), "rs grad")
    x = torch.ones(2 * n, 1, requires_grad=True)
    ((r + 1) * fm.reduce_scatter(x, op="average")).sum().backward()
    check_equal(x.grad, torch.arange(1.0, n + 1).repeat_interleave(2).unsqueeze(1) / n, "rs avg")
    # alltoall with uneven splits: the rows sent to rank j get j + 1
    splits = [(r + j) % 3 for j in range(n)]
    x = torch.ones(sum(splits), requires_grad=True)
    ((r + 1) * fm.alltoall(x, splits=splits)).sum().backward()
    want = torch.cat([torch.full((splits[j],), j + 1.0) for j in range(n)])
    check_equal(x.grad, want, "alltoall grad")
    # an op without a gradient raises on every rank
    raises(
        TypeError, lambda: fm.allreduce(torch.ones(2, requires_grad=True), op="max"), "no gradient"
    )
    raises(
        TypeError,
        lambda: fm.reduce_scatter(torch.ones(n, requires_grad=True), op="min"),
        "no gradient",
    )


def case_gather_scatter_gradients():
    n, r = world(), rank()
    root = n - 1
    # gather, uneven rows: loss_s = sum(y * w), w the row index; only the root's y is data,
    # so rank r's rows get their row indices once (the others' zeros are not read)
    x = torch.ones(r + 1, 2, requires_grad=True)
    y = fm.gather(x, root_rank=root)
    total = n * (n + 1) // 2
    assert y.shape == (total, 2) and y.requires_grad, (y.shape, y.requires_grad)
    if r != root:
        check_equal(y, torch.zeros(total, 2), "gather's zeros off the root")
    (y * torch.arange(float(total)).unsqueeze(1)).sum().backward()
    first = r * (r + 1) // 2
    want = torch.arange(float(first), float(first + r + 1)).unsqueeze(1).expand(r + 1, 2)
    check_equal(x.grad, want, "gather grad")
    # scatter, uneven splits from root 0: loss_r = (r + 1) * sum(y); the root's input gets
    # j + 1 on the rows it sent to rank j, the others' inputs (never read) zero
    splits = [j + 1 for j in range(n)]
    x = (torch.arange(float(total)) if r == 0 else torch.empty(total)).requires_grad_()
    y = fm.scatter(x, root_rank=0, splits=splits)
    check_equal(y.detach(), torch.arange(float(first), float(first + r + 1)), "scatter value")
    ((r + 1) * y).sum().backward()
    want = torch.cat([torch.full((j + 1,), j + 1.0) for j in range(n)])
    check_equal(x.grad, want if r == 0 else torch.zeros(total), "scatter grad")
    # on a group of the first and last rank: ranks, roots and splits are the group's
    members = sorted({0, n - 1})
    g = fm.new_group(members)
    if r in members:
        me = members.index(r)
        x = torch.full((me + 1,), 1.0 + me, requires_grad=True)
        y = fm.gather(x, root_rank=0, group=g)
        (y * y).sum().backward()  # d/dx of the root's sum of squares: 2x on every member
        check_equal(x.grad, 2 * x.detach(), "gather grad on a group")
        x = torch.ones(2 * len(members), requires_grad=True)
        ((me + 1) * fm.scatter(x, root_rank=len(members) - 1, group=g)).sum().backward()
        root_grad = torch.arange(1.0, len(members) + 1).repeat_interleave(2)
        want = root_grad if me == len(members) - 1 else torch.zeros(2 * len(members))
        check_equal(x.grad, want, "scatter grad on a group")
    if n == 1:
        return
    # a rank whose input does not require grad would skip the backward's collective and hang
    # the others there: every rank raises at the forward, naming that rank
    bad = n - 1
    x = torch.ones(2, requires_grad=r != bad)
    msg = raises(RuntimeError, lambda: fm.gather(x, root_rank=0), "disagree on requires_grad",
                 f"rank {bad} has tensor")  # fmt: skip
    assert msg.count("not requiring grad") == 1 and "its backward is a collective" in msg, msg
    x = torch.ones(2 * n, requires_grad=r != bad)
    msg = raises(RuntimeError, lambda: fm.scatter(x, root_rank=0), f"rank {bad} has tensor")
    assert msg.count("not requiring grad") == 1, msg
    # the same for the other row collectives; the rank without grad takes the fast path
    for call in (fm.allgather, fm.reduce_scatter, fm.alltoall):
        x = torch.ones(2 * n, requires_grad=r != bad)
        msg = raises(RuntimeError, lambda c=call, t=x: c(t), "disagree on requires_grad",
                     f"rank {bad} has tensor")  # fmt: skip
        assert msg.count("not requiring grad") == 1, (call.__name__, msg)
    with torch.no_grad():  # no grad wanted anywhere: the plain calls, None off the root
        out = fm.gather(torch.ones(1, requires_grad=True), root_rank=0)
        assert (out is None) == (r != 0) and (out is None or not out.requires_grad)
    assert fm.allgather_object(r) == list(range(n))  # still in step


def case_object_collectives():
    n, r = world(), rank()
    for root in range(n):
        obj = {"rank": r, "list": list(range(r)), "tensor": torch.full((2,), float(r))}
        got = fm.broadcast_object(obj, root_rank=root)
        assert got["rank"] == root and got["list"] == list(range(root)), got
        assert torch.equal(got["tensor"], torch.full((2,), float(root)))
    assert fm.broadcast_object(None if r else "x" * 100000) == "x" * 100000
    got = fm.allgather_object({"r": r, "pad": "y" * (r * 1000)})
    assert got == [{"r": s, "pad": "y" * (s * 1000)} for s in range(n)], got
    bad = n - 1
    obj = (lambda: 0) if r == bad else 1  # a lambda does not pickle
    raises(ValueError, lambda: fm.allgather_object(obj), f"rank {bad}", "does not pickle")
    raises(
        ValueError,
        lambda: fm.broadcast_object(obj, root_rank=bad),
        f"rank {bad}",
        "does not pickle",
    )
    raises(ValueError, lambda: fm.broadcast_object(1, root_rank=n), "root_rank", "out of range")
    assert fm.allgather_object(r) == list(range(n))  # still in step


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
