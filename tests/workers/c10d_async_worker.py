"""torch.distributed on the fluxmpi backend: point-to-point, async work and futures (and
collectives inside a future's callback), torch.distributed.nn's differentiable gather and
scatter, waits with a timeout and the object collectives (the closed forms: c10d_worker.py;
training: c10d_ddp_worker.py).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from c10d_worker import check_equal, rank, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402


def case_send_recv_ring_and_any_source():
    n, r = world(), rank()
    if n == 1:
        return
    t = torch.full((3,), float(r))
    got = torch.empty(3)
    if r % 2 == 0:
        dist.send(t, dst=(r + 1) % n)
        dist.recv(got, src=(r - 1) % n)
    else:
        dist.recv(got, src=(r - 1) % n)
        dist.send(t, dst=(r + 1) % n)
    check_equal(got, torch.full((3,), float((r - 1) % n)), "ring")
    reqs = [dist.isend(torch.full((2,), float(r)), dst=(r + 1) % n),
            dist.irecv(got[:2], src=(r - 1) % n)]  # fmt: skip
    for q in reqs:
        q.wait()
    check_equal(got[:2], torch.full((2,), float((r - 1) % n)), "isend/irecv")
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            buf = torch.empty(1, dtype=torch.int64)
            src = dist.recv(buf)  # any source
            assert buf.item() == src, (buf, src)
            seen.add(src)
        assert seen == set(range(1, n)), seen
    else:
        dist.send(torch.tensor([r]), dst=0)


def case_async_work_and_future():
    n, r = world(), rank()
    t = torch.full((1000,), float(r))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    assert isinstance(value, list) and value[0] is not None and value[0].data_ptr() == t.data_ptr()
    work.wait()
    assert work.is_completed()
    check_equal(t, torch.full((1000,), float(n * (n - 1) // 2)), "async all_reduce")
    chained = (
        dist.all_reduce(torch.ones(2), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    )
    check_equal(chained.wait(), torch.full((2,), 2.0 * n), "then()")
    works = [dist.broadcast(torch.full((4,), float(r + k)), src=0, async_op=True) for k in range(5)]
    for w in works:
        w.wait()
    dist.barrier()


def case_collectives_inside_a_future_callback_run_there():
    """Callbacks run on the engine thread as a future completes; a collective started there,
    blocking or waited on through its future (torch's PowerSGD hook does this), runs at once
    instead of queueing behind the callback (it hung, or raised, before)."""
    n = world()

    def blocking(fut):
        t = torch.ones(1)
        dist.all_reduce(t)
        return fut.value()[0] + t

    def through_future(fut):
        t = torch.full((2,), 10.0)
        return fut.value()[0] + dist.all_reduce(t, async_op=True).get_future().wait()[0]

    # Rank 0 attaches its callbacks long before the others enter, so that they run on the
    # engine thread there; elsewhere the work may be done first and they run inline.
    for hook, want in ((blocking, n + n), (through_future, n + 10 * n)):
        if rank() != 0:
            time.sleep(0.3)
        chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(hook)
        check_equal(chained.wait(), torch.full((2,), float(want)), hook.__name__)
    dist.barrier()


def case_torch_distributed_nn_gather_and_scatter_have_gradients():
    """fm.gather/fm.scatter record no autograd (the README points to these): torch's
    differentiable gather and scatter run on the fluxmpi backend, gradients included."""
    import torch.distributed.nn.functional as dnn

    n, r = world(), rank()
    x = torch.full((2,), float(r + 1), requires_grad=True)
    outs = dnn.gather(x, dst=n - 1)
    if r == n - 1:
        check_equal(torch.stack(outs), torch.stack([torch.full((2,), s + 1.0) for s in range(n)]),
                    "gather")  # fmt: skip
    # every rank runs backward through its outputs (zeros off the root); the root's weights
    sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    check_equal(x.grad, torch.full((2,), r + 1.0), "gather's gradient")
    y = torch.arange(2.0 * n, requires_grad=True)
    parts = list(y.chunk(n)) if r == 0 else [torch.zeros(2, requires_grad=True)] * n
    part = dnn.scatter(parts, src=0)
    check_equal(part.detach(), torch.tensor([2.0 * r, 2.0 * r + 1]), "scatter")
    (part.sum() * (r + 1)).backward()
    if r == 0:
        want = torch.cat([torch.full((2,), s + 1.0) for s in range(n)])
        check_equal(y.grad, want, "scatter's gradient")


def case_object_collectives():
    n, r = world(), rank()
    got = [None] * n
    dist.all_gather_object(got, {"rank": r, "name": "x" * r})
    assert got == [{"rank": s, "name": "x" * s} for s in range(n)], got
    objs = [r, "hello", {"k": [1, 2]}] if r == 0 else [None, None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [0, "hello", {"k": [1, 2]}], objs


def case_mismatched_shapes_raise_on_every_rank():
    r = rank()
    if world() == 1:
        return
    t = torch.ones(3 + (r == 1))
    raises(RuntimeError, lambda: dist.all_reduce(t), "ranks disagree")
    # the group is still usable: every rank left the failed collective together
    ok = torch.ones(2)
    dist.all_reduce(ok)
    check_equal(ok, torch.full((2,), float(world())), "after the error")


if __name__ == "__main__":
    run_cases(globals())
    dist.destroy_process_group()
