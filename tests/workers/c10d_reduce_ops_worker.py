"""The "fluxmpi" torch.distributed backend's bitwise reductions (BAND, BOR, BXOR on integer and
bool tensors) and PREMUL_SUM (torch.distributed._make_nccl_premul_sum: each rank's tensor
times the factor, then summed), in all_reduce, reduce and the reduce_scatter forms, against
closed forms; floats with a bitwise op, integers with PREMUL_SUM, and PREMUL_SUM on one rank
against SUM on another raise on every rank.

Run by tests/test_c10d.py at 1, 2 and 3 ranks.
"""

import functools
import operator
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from c10d_worker import check_equal, rank, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402

INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BITWISE = {
    dist.ReduceOp.BAND: operator.and_,
    dist.ReduceOp.BOR: operator.or_,
    dist.ReduceOp.BXOR: operator.xor,
}


def bits(r, dtype):
    """Rank r's input: bit patterns that differ across ranks (and fit every integer dtype)."""
    if dtype == torch.bool:
        return torch.tensor([r % 2 == 0, True, False, r == 0, r % 3 == 1])
    return torch.tensor([1 << (r % 7), 0b1010 + r, 127 - r, 3 * r + 5, 0], dtype=dtype)


def combined(fn, dtype, ranks):
    """The closed form: fn folded over the inputs of `ranks`, element by element."""
    return functools.reduce(fn, [bits(r, dtype) for r in ranks])


def case_bitwise_all_reduce_every_integer_dtype_and_bool():
    n = world()
    for dtype in INTS + [torch.bool]:
        for op, fn in BITWISE.items():
            t = bits(rank(), dtype)
            dist.all_reduce(t, op=op)
            check_equal(t, combined(fn, dtype, range(n)), f"all_reduce {op} {dtype}")


def case_bitwise_reduce_to_every_root():
    n = world()
    for root in range(n):
        for op, fn in BITWISE.items():
            t = bits(rank(), torch.int32)
            dist.reduce(t, dst=root, op=op)
            want = (
                combined(fn, torch.int32, range(n)) if rank() == root else bits(rank(), torch.int32)
            )
            check_equal(t, want, f"reduce {op} to {root}")


def case_bitwise_reduce_scatter_forms():
    n = world()
    for op, fn in BITWISE.items():
        # rank r's input: part p is bits(r) shifted by p, so each part has its own closed form
        def part(r, p):
            return bits(r, torch.int64) << p

        inp = torch.cat([part(rank(), p) for p in range(n)])
        out = torch.empty(5, dtype=torch.int64)
        dist.reduce_scatter_tensor(out, inp, op=op)
        want = functools.reduce(fn, [part(r, rank()) for r in range(n)])
        check_equal(out, want, f"reduce_scatter_tensor {op}")
        out2 = torch.empty(5, dtype=torch.int64)
        dist.reduce_scatter(out2, [part(rank(), p) for p in range(n)], op=op)
        check_equal(out2, want, f"reduce_scatter {op}")


def case_bitwise_on_floats_raises_on_every_rank():
    for dtype in FLOATS:
        for op in BITWISE:
            t = torch.ones(3, dtype=dtype)
            raises(
                RuntimeError, lambda t=t, op=op: dist.all_reduce(t, op=op), "is bitwise", str(dtype)
            )
    raises(RuntimeError, lambda: dist.reduce(torch.ones(2), dst=0, op=dist.ReduceOp.BOR),
           "is bitwise", "torch.float32")  # fmt: skip
    out = torch.empty(2)
    raises(RuntimeError, lambda: dist.reduce_scatter_tensor(out, torch.ones(2 * world()),
                                                            op=dist.ReduceOp.BXOR), "is bitwise")  # fmt: skip
    if world() > 1:  # one rank's float is every rank's error
        t = torch.ones(2, dtype=torch.float32 if rank() == 1 else torch.int32)
        raises(RuntimeError, lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), "rank 1")
    ok = torch.full((2,), 6, dtype=torch.int32)  # every rank left the failed calls together
    dist.all_reduce(ok, op=dist.ReduceOp.BAND)
    check_equal(ok, torch.full((2,), 6, dtype=torch.int32), "after the errors")


def case_bitwise_ops_of_fluxmpi_py_itself():
    t = bits(rank(), torch.int16)
    fm.allreduce_(t, op="bxor")
    check_equal(t, combined(operator.xor, torch.int16, range(world())), "fm.allreduce_ bxor")
    raises(TypeError, lambda: fm.allreduce_(torch.ones(2), op="band"), "is bitwise")
    raises(ValueError, lambda: C.ReducerOptions(op="bor"), "gradients")


def case_premul_sum_all_reduce_and_reduce_every_float_dtype():
    n = world()
    total = n * (n + 1) // 2  # the sum of rank + 1
    for dtype in FLOATS:
        for factor in (0.5, torch.tensor(2.0), 3.0):
            f = float(factor)
            op = dist._make_nccl_premul_sum(factor)
            t = torch.tensor([1.0, 2.0, -4.0], dtype=dtype) * (rank() + 1)
            dist.all_reduce(t, op=op)
            want = torch.tensor([1.0, 2.0, -4.0], dtype=dtype) * (f * total)
            check_equal(t, want, f"all_reduce premul {f} {dtype}")
            for root in range(n):
                t = torch.tensor([1.0, 2.0, -4.0], dtype=dtype) * (rank() + 1)
                mine = t.clone()
                dist.reduce(t, dst=root, op=op)
                check_equal(t, want if rank() == root else mine, f"reduce premul {f} to {root}")


def case_premul_sum_reduce_scatter_forms():
    n = world()
    op = dist._make_nccl_premul_sum(0.25)
    inp = torch.arange(2.0 * n) * (rank() + 1)  # part p: [2p, 2p + 1] * (rank + 1)
    before = inp.clone()
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, inp, op=op)
    want = torch.tensor([2.0 * rank(), 2.0 * rank() + 1]) * 0.25 * (n * (n + 1) / 2)
    check_equal(out, want, "reduce_scatter_tensor premul")
    check_equal(inp, before, "the input is not scaled in place")
    out2 = torch.empty(2)
    dist.reduce_scatter(out2, list(inp.chunk(n)), op=op)
    check_equal(out2, want, "reduce_scatter premul")


def case_premul_sum_on_one_rank_and_sum_on_the_others_raises_on_every_rank():
    """Both run a sum of rank-local tensors underneath; only the agreement can tell them apart."""
    if world() == 1:
        return
    n = world()
    op = dist._make_nccl_premul_sum(0.5) if rank() == 0 else dist.ReduceOp.SUM
    t = torch.ones(4)
    raises(RuntimeError, lambda: dist.all_reduce(t, op=op), "op", "premul_sum", "sum")
    check_equal(t, torch.ones(4), "all_reduce left the tensor as it was")
    raises(RuntimeError, lambda: dist.reduce(t, dst=n - 1, op=op), "premul_sum")
    out = torch.empty(2)
    raises(
        RuntimeError,
        lambda: dist.reduce_scatter_tensor(out, torch.ones(2 * n), op=op),
        "premul_sum",
    )
    same = dist._make_nccl_premul_sum(0.5 + rank())  # factors may differ: each rank scales its own
    t = torch.ones(4)
    dist.all_reduce(t, op=same)
    check_equal(t, torch.full((4,), sum(0.5 + r for r in range(n))), "per-rank factors")


def case_premul_sum_of_integers_raises_on_every_rank():
    op = dist._make_nccl_premul_sum(2.0)
    t = torch.ones(3, dtype=torch.int32)
    raises(RuntimeError, lambda: dist.all_reduce(t, op=op), "PREMUL_SUM", "torch.int32")
    check_equal(t, torch.ones(3, dtype=torch.int32), "left as it was")


if __name__ == "__main__":
    run_cases(globals())
    dist.destroy_process_group()
