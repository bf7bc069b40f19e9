"""torch.distributed on the "fluxmpi" backend: collectives against closed forms, Work and
futures, point-to-point, object collectives, agreement errors on every rank, and DDP /
ZeroRedundancyOptimizer / FSDP against gloo or a single process. Sub-groups and DeviceMesh are
in c10d_groups_worker.py, bitwise ops and PREMUL_SUM in c10d_reduce_ops_worker.py.

Run by tests/test_c10d.py at 1, 2 and 3 ranks (and without mpiexec).
"""

import math
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import labelled, raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.uint8]  # fmt: skip
_GLOO = []


def rank():
    setup()
    return dist.get_rank()


def world():
    setup()
    return dist.get_world_size()


def setup():
    """The default group on fluxmpi, made once through torch's env:// rendezvous, whose
    variables fm.Init() (run_cases calls it) set from MPI."""
    if not dist.is_initialized():
        env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
        assert env == {"RANK": str(fm.local_rank()), "WORLD_SIZE": str(fm.total_workers())}, env
        assert os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"), os.environ
        dist.init_process_group("fluxmpi")


def gloo():
    """A gloo group of every rank beside the default fluxmpi one (the same store)."""
    if not _GLOO:
        _GLOO.append(dist.new_group(backend="gloo"))
    return _GLOO[0]


def check_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got, want)
    assert torch.equal(got, want), f"{what}: got {got.tolist()}, want {want.tolist()}"


# ---------------------------------------------------------------- setup


def case_init_takes_rank_and_size_from_mpi():
    setup()
    assert dist.get_backend() == "fluxmpi", dist.get_backend()
    assert (dist.get_rank(), dist.get_world_size()) == (fm.local_rank(), fm.total_workers())


def case_a_groups_timeout_is_not_the_jobs():
    """new_group(timeout=) bounds the members' wait for each other while they make the group;
    the job's timeout stays what Init or init_process_group(timeout=) set
    (test_init_process_group_timeout_ends_a_stalled_job_with_the_report shows that one)."""
    from datetime import timedelta

    from fluxmpi_py._core import C

    setup()
    before = C.stall_settings()
    group = dist.new_group(backend="fluxmpi", timeout=timedelta(seconds=321))
    assert C.stall_settings() == before, (C.stall_settings(), before)
    t = torch.ones(2)
    dist.all_reduce(t, group=group)  # a group of every rank, on a communicator of its own
    check_equal(t, torch.full((2,), float(world())), "all_reduce on the new group")


# ---------------------------------------------------------------- closed forms


def case_all_reduce_every_dtype_and_op():
    n, r = world(), rank()
    ops = {
        dist.ReduceOp.SUM: n * (n + 1) // 2,
        dist.ReduceOp.PRODUCT: math.factorial(n),
        dist.ReduceOp.MIN: 1,
        dist.ReduceOp.MAX: n,
        dist.ReduceOp.AVG: (n + 1) // 2,  # the floor of the mean for integers
    }
    for dtype in DTYPES:
        for op, want in ops.items():
            if op == dist.ReduceOp.AVG and dtype.is_floating_point:
                want = (n + 1) / 2
            t = torch.full((5,), r + 1, dtype=dtype)
            dist.all_reduce(t, op=op)
            check_equal(t, torch.full((5,), want, dtype=dtype), f"all_reduce {op} {dtype}")
    for op, want in ((dist.ReduceOp.MAX, n > 1), (dist.ReduceOp.MIN, False)):
        t = torch.tensor([r % 2 == 1])
        dist.all_reduce(t, op=op)
        check_equal(t, torch.tensor([want]), f"all_reduce {op} bool")


def case_all_reduce_non_contiguous_and_zero_dim():
    n, r = world(), rank()
    base = torch.full((4, 6), float(r))
    view = base[:, ::2]
    dist.all_reduce(view)
    check_equal(view, torch.full((4, 3), float(n * (n - 1) // 2)), "strided view")
    check_equal(base[:, 1::2], torch.full((4, 3), float(r)), "untouched columns")
    s = torch.tensor(float(r + 1))
    dist.all_reduce(s)
    check_equal(s, torch.tensor(float(n * (n + 1) // 2)), "0-dim")


def case_all_reduce_coalesced():
    n, r = world(), rank()
    ts = [torch.full((3,), float(r)), torch.full((2, 2), float(2 * r))]
    dist.all_reduce_coalesced(ts)
    s = n * (n - 1) // 2
    check_equal(ts[0], torch.full((3,), float(s)), "tensor 0")
    check_equal(ts[1], torch.full((2, 2), float(2 * s)), "tensor 1")


def case_broadcast_and_reduce_from_every_root():
    n, r = world(), rank()
    for root in range(n):
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            t = torch.full((2, 3), r * 10, dtype=dtype)
            dist.broadcast(t, src=root)
            check_equal(t, torch.full((2, 3), root * 10, dtype=dtype), f"broadcast {root}")
        t = torch.full((4,), float(r + 1))
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if r == root:
            check_equal(t, torch.full((4,), float(n * (n + 1) // 2)), f"reduce to {root}")


def case_all_gather_forms():
    n, r = world(), rank()
    for dtype in DTYPES + [torch.bool]:
        t = torch.full((2, 3), r % 2, dtype=dtype)
        out = [torch.empty(2, 3, dtype=dtype) for _ in range(n)]
        dist.all_gather(out, t)
        for s in range(n):
            check_equal(out[s], torch.full((2, 3), s % 2, dtype=dtype), f"all_gather {dtype}")
    flat = torch.empty(n * 4, dtype=torch.int32)
    dist.all_gather_into_tensor(flat, torch.arange(4, dtype=torch.int32) + 4 * r)
    check_equal(flat, torch.arange(4 * n, dtype=torch.int32), "all_gather_into_tensor")
    scalars = [torch.tensor(0.0) for _ in range(n)]
    dist.all_gather(scalars, torch.tensor(float(r)))
    check_equal(torch.stack(scalars), torch.arange(n, dtype=torch.float32), "0-dim all_gather")


def case_all_gather_of_uneven_sizes():
    """torch documents uneven outputs for all_gather (NCCL takes them, gloo refuses): output r
    holds rank r's input, whose size differs by rank; every rank must expect the same sizes."""
    n, r = world(), rank()
    for dtype in (torch.float32, torch.int64, torch.float16):
        t = torch.arange(r + 1, dtype=dtype) + 10 * r
        out = [torch.empty(s + 1, dtype=dtype) for s in range(n)]
        dist.all_gather(out, t)
        for s in range(n):
            check_equal(out[s], torch.arange(s + 1, dtype=dtype) + 10 * s, f"uneven {dtype}")
    # shapes may differ too, as long as each output holds as many elements as its rank sends
    t = torch.full((r + 1, 2), float(r))
    out = [torch.empty(2, s + 1) for s in range(n)]
    dist.all_gather(out, t)
    for s in range(n):
        check_equal(out[s], torch.full((2, s + 1), float(s)), "uneven, reshaped")
    # this rank's input does not fit its own output: every rank raises, before data moves
    t = torch.ones(r + 2 if r == n - 1 else r + 1)
    out = [torch.empty(s + 1) for s in range(n)]
    raises(RuntimeError, lambda: dist.all_gather(out, t), f"rank {n - 1}",
           f"output {n - 1} (this rank's input goes there)", f"expected {n + 1}")  # fmt: skip
    if n > 1:
        # ranks that expect different sizes of some rank: every rank raises
        out = [torch.empty(s + 1 + (1 if r == 0 and s == n - 1 else 0)) for s in range(n)]
        if r == n - 1:
            out[n - 1] = torch.empty(n)
        raises(RuntimeError, lambda: dist.all_gather(out, torch.ones(r + 1)), "disagree")
    out = [torch.empty(s + 1) for s in range(n)]
    dist.all_gather(out, torch.full((r + 1,), 7.0))  # the ranks are still in step
    check_equal(torch.cat(out), torch.full((n * (n + 1) // 2,), 7.0), "after the errors")


def case_complex_tensors_travel_as_pairs_of_reals():
    """gloo and NCCL take complex tensors; DDP broadcasts complex parameters as it starts."""
    n, r = world(), rank()

    def c(v, k=3):
        return torch.full((k,), complex(v, -2 * v), dtype=torch.complex64)

    x = c(r)
    dist.broadcast(x, src=n - 1)
    check_equal(x, c(n - 1), "broadcast")
    x = c(r + 1).to(torch.complex128)
    dist.all_reduce(x)
    check_equal(x, c(n * (n + 1) / 2).to(torch.complex128), "all_reduce")
    outs = [c(0) for _ in range(n)]
    dist.all_gather(outs, c(r))
    check_equal(torch.stack(outs), torch.stack([c(s) for s in range(n)]), "all_gather")
    flat = torch.empty(3 * n, dtype=torch.complex64)
    dist.all_gather_into_tensor(flat, c(r))
    check_equal(flat, torch.cat([c(s) for s in range(n)]), "all_gather_into_tensor")
    o = c(0, 3 * n)
    dist.all_to_all_single(o, torch.cat([c(10 * r + j) for j in range(n)]))
    check_equal(o, torch.cat([c(10 * s + r) for s in range(n)]), "all_to_all_single")
    o = c(0)
    dist.reduce_scatter_tensor(o, torch.cat([c(r + j) for j in range(n)]))
    check_equal(o, c(sum(s + r for s in range(n))), "reduce_scatter_tensor")
    # torch passes complex tensors here as their pairs of reals, and asks for one dtype
    xs = [c(r + 1), torch.full((2,), float(r + 1)), c(r + 1, 1)]
    with warnings.catch_warnings():  # torch: all_reduce_coalesced "will be deprecated"
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced(xs)
    s = n * (n + 1) / 2
    check_equal(xs[0], c(s), "all_reduce_coalesced complex64")
    check_equal(xs[1], torch.full((2,), s), "all_reduce_coalesced float32")
    check_equal(xs[2], c(s, 1), "all_reduce_coalesced complex64, 1 element")
    # an order-based reduction of complex values is refused on every rank, not done on pairs
    raises(RuntimeError, lambda: dist.reduce_scatter_tensor(o, c(r, 3 * n), op=dist.ReduceOp.MAX),
           "complex64")  # fmt: skip
    if n > 1:
        if r == 0:
            dist.send(c(5), dst=n - 1)
        elif r == n - 1:
            y = c(0)
            dist.recv(y, src=0)
            check_equal(y, c(5), "send/recv")
    # DDP on a complex model: rank 0's parameters everywhere, the average of the gradients
    torch.manual_seed(r)
    model = nn.Linear(2, 2).to(torch.complex64)
    ddp = DDP(model)
    first = [p.detach().clone() for p in model.parameters()]
    for p in first:
        dist.all_reduce(p, op=dist.ReduceOp.AVG)
    for p, q in zip(model.parameters(), first):
        assert torch.allclose(p, q, atol=0), "DDP start: ranks differ"
    inp = torch.full((1, 2), complex(r + 1, 1), dtype=torch.complex64)
    ddp(inp).abs().sum().backward()
    local = nn.Linear(2, 2).to(torch.complex64)
    local.load_state_dict(model.state_dict())
    local(inp).abs().sum().backward()
    for p, q in zip(model.parameters(), local.parameters()):
        want = q.grad.clone()
        dist.all_reduce(want, op=dist.ReduceOp.AVG)
        assert torch.allclose(p.grad, want, rtol=1e-5, atol=1e-6), (p.grad, want)


def case_gather_and_scatter_to_every_root():
    n, r = world(), rank()
    for root in range(n):
        t = torch.full((3,), float(r))
        out = [torch.empty(3) for _ in range(n)] if r == root else None
        dist.gather(t, gather_list=out, dst=root)
        if r == root:
            for s in range(n):
                check_equal(out[s], torch.full((3,), float(s)), f"gather to {root}")
        got = torch.empty(2, 2, dtype=torch.int64)
        parts = [torch.full((2, 2), 100 * root + s) for s in range(n)] if r == root else None
        dist.scatter(got, scatter_list=parts, src=root)
        check_equal(got, torch.full((2, 2), 100 * root + r), f"scatter from {root}")


def case_reduce_scatter_forms():
    n, r = world(), rank()
    out = torch.empty(3)
    dist.reduce_scatter(out, [torch.full((3,), float(r * n + s)) for s in range(n)])
    want = float(sum(q * n + r for q in range(n)))
    check_equal(out, torch.full((3,), want), "reduce_scatter")
    out = torch.empty(2, dtype=torch.float64)
    inp = torch.arange(2 * n, dtype=torch.float64) * (r + 1)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
    total = n * (n + 1) // 2
    check_equal(out, torch.arange(2 * r, 2 * r + 2, dtype=torch.float64) * total, "tensor form")
    out = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, torch.full((2 * n,), float(r + 1), dtype=torch.float64),
                               op=dist.ReduceOp.MAX)  # fmt: skip
    check_equal(out, torch.full((2,), float(n), dtype=torch.float64), "max")


def case_all_to_all_forms():
    n, r = world(), rank()
    # Equal parts: element j of rank r's input goes to rank j.
    out = torch.empty(n, dtype=torch.int64)
    dist.all_to_all_single(out, torch.arange(n) + 100 * r)
    check_equal(out, torch.arange(n) * 100 + r, "all_to_all_single equal")
    # Rank r sends s + 1 rows to rank s: receives r + 1 rows from every rank.
    in_splits = [s + 1 for s in range(n)]
    inp = torch.cat([torch.full((s + 1, 2), 10 * r + s) for s in range(n)])
    out = torch.empty(n * (r + 1), 2, dtype=torch.int64)
    dist.all_to_all_single(out, inp, output_split_sizes=[r + 1] * n, input_split_sizes=in_splits)
    want = torch.cat([torch.full((r + 1, 2), 10 * q + r) for q in range(n)])
    check_equal(out, want, "all_to_all_single with splits")
    outs = [torch.empty(q + 1) for q in range(n)]
    dist.all_to_all(outs, [torch.full((r + 1,), float(10 * r + s)) for s in range(n)])
    for q in range(n):
        check_equal(outs[q], torch.full((q + 1,), float(10 * q + r)), f"all_to_all from {q}")


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


def case_wait_with_a_timeout_raises_and_the_work_completes_later():
    from datetime import timedelta

    n, r = world(), rank()
    if n == 1:
        return
    t = torch.ones(2)
    if r == 0:
        work = dist.all_reduce(t, async_op=True)
        raises(RuntimeError, lambda: work.wait(timeout=timedelta(milliseconds=100)), "within")
        assert not work.is_completed()
        dist.barrier(group=gloo())  # now the others join (told over gloo: a fluxmpi message
        work.wait()  # would queue behind the all_reduce, as it would on NCCL)
    else:
        dist.barrier(group=gloo())
        dist.all_reduce(t)
    check_equal(t, torch.full((2,), float(n)), "all_reduce after the timeout")


def case_object_collectives():
    n, r = world(), rank()
    got = [None] * n
    dist.all_gather_object(got, {"rank": r, "name": "x" * r})
    assert got == [{"rank": s, "name": "x" * s} for s in range(n)], got
    objs = [r, "hello", {"k": [1, 2]}] if r == 0 else [None, None, None]
    dist.broadcast_object_list(objs, src=0)
    assert objs == [0, "hello", {"k": [1, 2]}], objs


# ---------------------------------------------------------------- errors on every rank


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


def case_different_collectives_raise_on_every_rank():
    r = rank()
    if world() == 1:
        return
    t = torch.ones(3)
    if r == 0:
        raises(RuntimeError, lambda: dist.broadcast(t, src=0), "different calls", "all_reduce")
    else:
        raises(RuntimeError, lambda: dist.all_reduce(t), "different calls", "broadcast")


# ---------------------------------------------------------------- DDP, ZeRO, FSDP


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
