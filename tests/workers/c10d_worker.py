"""torch.distributed on the "fluxmpi" backend: collectives against closed forms and agreement
errors on every rank. Work and futures, point-to-point and object collectives are in
c10d_async_worker.py; DDP / ZeroRedundancyOptimizer / FSDP against gloo or a single process in
c10d_ddp_worker.py; sub-groups and DeviceMesh in c10d_groups_worker.py, bitwise ops and
PREMUL_SUM in c10d_reduce_ops_worker.py.

Run by tests/test_c10d.py at 1, 2 and 3 ranks (and without mpiexec).
"""

import math
import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

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


# ---------------------------------------------------------------- errors on every rank


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


if __name__ == "__main__":
    run_cases(globals())
    dist.destroy_process_group()
