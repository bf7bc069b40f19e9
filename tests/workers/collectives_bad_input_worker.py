"""The in-place collectives on bad input: complex tensors as pairs of reals, and what raises on
every rank (bad input on all ranks or on one, mismatches across ranks) (the rest:
collectives_worker.py, collectives_layouts_worker.py).
"""

import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collectives_worker import check_equal, rank, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_complex_allreduce_bcast_reduce_as_pairs():
    n, r = world(), rank()
    for dtype in (torch.complex64, torch.complex128):
        t = torch.tensor([1 + 2j, -3j], dtype=dtype) * (r + 1)
        check_equal(fm.allreduce_(t.clone()), t / (r + 1) * (n * (n + 1) / 2), f"sum {dtype}")
        got = fm.allreduce_(t.clone(), "average")
        torch.testing.assert_close(got, t / (r + 1) * ((n + 1) / 2))
        check_equal(fm.bcast_(t.clone(), root_rank=n - 1), t / (r + 1) * n, f"bcast {dtype}")
        got = fm.reduce_(t.clone(), root_rank=0)
        if r == 0:
            check_equal(got, t * (n * (n + 1) / 2), f"reduce {dtype}")
        check_equal(fm.Iallreduce(t.clone()).wait(), t / (r + 1) * (n * (n + 1) / 2), "async")
        # grouped, with real tensors of the pairs' dtype between them and a 0-dim one
        real = torch.arange(3.0, dtype=torch.float64) * (r + 1)
        zero_dim = torch.tensor(2 - 1j, dtype=dtype) * (r + 1)
        group = [t.clone(), real.clone(), zero_dim.clone()]
        fm.grouped_allreduce_(group, op="sum")
        check_equal(group[0], t / (r + 1) * (n * (n + 1) / 2), f"grouped {dtype}")
        check_equal(group[1], real / (r + 1) * (n * (n + 1) / 2), "grouped real")
        check_equal(group[2], zero_dim / (r + 1) * (n * (n + 1) / 2), "grouped 0-dim")
        group = [t.clone(), real.clone()]
        fm.grouped_allreduce_(group, op="average")
        torch.testing.assert_close(group[0], t / (r + 1) * ((n + 1) / 2))
    # non-contiguous: the real view writes through
    base = torch.ones(4, 4, dtype=torch.complex64)
    fm.allreduce_(base[:, 1])
    assert base[:, 1].eq(n).all() and base[:, 0].eq(1).all(), base
    if n > 1:
        # a complex tensor on one rank and its pairs as reals on another: ranks disagree
        t = torch.ones(3, dtype=torch.complex64) if r == 0 else torch.ones(3, 2)
        raises(RuntimeError, lambda: fm.allreduce_(t), "dtype", "torch.complex64")
        raises(RuntimeError, lambda: fm.grouped_allreduce_([t]), "dtype", "torch.complex64")


def case_bad_input_raises_on_every_rank():
    n, r = world(), rank()
    raises(
        TypeError,
        lambda: fm.allreduce_(torch.ones(3, dtype=torch.uint32)),
        "rank 0",
        "torch.uint32",
        "not supported",
    )
    # complex values reduce as pairs of reals only where that is right: sum and average
    raises(
        TypeError,
        lambda: fm.allreduce_(torch.ones(3, dtype=torch.complex64), op="max"),
        "rank 0",
        "torch.complex64",
        "not supported",
        "op 'sum' or 'average' only",
    )
    raises(
        TypeError,
        lambda: fm.grouped_allreduce_([torch.ones(2), torch.ones(3, dtype=torch.complex64)], "min"),
        "rank 0",
        "tensor 1",
        "op 'sum' or 'average' only",
    )
    raises(TypeError, lambda: fm.allreduce_(torch.ones(2, dtype=torch.complex64).conj()),
           "resolve_conj()")  # fmt: skip
    raises(TypeError, lambda: fm.bcast_(torch.ones(2, 2).to_sparse()), "layout", "rank 0")
    raises(
        ValueError, lambda: fm.allreduce_(torch.ones(3), op="median"), "'median'", "sum, average"
    )
    raises(ValueError, lambda: fm.reduce_(torch.ones(3), op="avg!", root_rank=0), "'avg!'")
    for bad_root in (n, -1):
        raises(
            ValueError,
            functools.partial(fm.bcast_, torch.ones(3), root_rank=bad_root),
            f"root_rank {bad_root} is out of range",
            f"< {n}",
        )
        raises(
            ValueError,
            functools.partial(fm.reduce_, torch.ones(3), root_rank=bad_root),
            f"root_rank {bad_root} is out of range",
        )
    raises(TypeError, lambda: fm.bcast_(torch.ones(3), root_rank="0"), "root_rank must be an int")
    raises(TypeError, lambda: fm.allreduce_([1.0, 2.0]), "must be a torch.Tensor, got list")
    raises(ValueError, lambda: fm.allreduce_(torch.zeros(1).expand(4)), "share memory")
    # a tensor left as it was by a failed call
    t = torch.full((3,), float(r))
    raises(ValueError, lambda: fm.allreduce_(t, op="nope"))
    check_equal(t, torch.full((3,), float(r)), "untouched after an error")


def case_bad_input_on_one_rank_only():
    n, r = world(), rank()
    bad = n - 1
    t = torch.ones(3, dtype=torch.uint32) if r == bad else torch.ones(3)
    raises(TypeError, lambda: fm.allreduce_(t), f"rank {bad}", "torch.uint32")
    t = [1] if r == bad else torch.ones(3)
    raises(TypeError, lambda: fm.bcast_(t), f"rank {bad}", "got list")
    op = "bogus" if r == bad else "sum"
    raises(ValueError, lambda: fm.reduce_(torch.ones(3), op=op), f"rank {bad}", "'bogus'")
    root = 99 if r == bad else 0
    raises(
        ValueError, lambda: fm.bcast_(torch.ones(3), root_rank=root), f"rank {bad}", "root_rank 99"
    )


def case_mismatch_across_ranks():
    n, r = world(), rank()
    if n == 1:
        return
    raises(
        RuntimeError,
        lambda: fm.allreduce_(torch.ones(r + 1)),
        "disagree on numel",
        "rank 0 has 1",
        "rank 1 has 2",
    )
    dt = torch.float32 if r == 0 else torch.float64
    raises(
        RuntimeError,
        lambda: fm.allreduce_(torch.ones(4, dtype=dt)),
        "disagree on dtype",
        "rank 0 has torch.float32",
        "rank 1 has torch.float64",
    )
    shape = (2, 3) if r == 0 else (3, 2)
    raises(
        RuntimeError, lambda: fm.bcast_(torch.ones(shape)), "disagree on shape", "[2, 3]", "[3, 2]"
    )
    op = "sum" if r == 0 else "max"
    raises(
        RuntimeError,
        lambda: fm.allreduce_(torch.ones(3), op=op),
        "disagree on op",
        "rank 1 has max",
    )
    raises(
        RuntimeError,
        lambda: fm.bcast_(torch.ones(3), root_rank=r % 2),
        "disagree on root_rank",
        "rank 0 has 0",
        "rank 1 has 1",
    )
    # different collectives at the same point
    call = (lambda: fm.bcast_(torch.ones(3))) if r == 0 else (lambda: fm.allreduce_(torch.ones(3)))
    raises(
        RuntimeError,
        call,
        "ranks are in different calls",
        "rank 0 is in bcast_()",
        "rank 1 is in allreduce_()",
    )
    req = fm.Iallreduce(torch.ones(r + 2))
    raises(RuntimeError, req.wait, "disagree on numel")
    # and the ranks are still in step afterwards
    t = torch.full((2,), float(r + 1))
    fm.allreduce_(t)
    check_equal(t, torch.full((2,), n * (n + 1) / 2), "after mismatches")


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
