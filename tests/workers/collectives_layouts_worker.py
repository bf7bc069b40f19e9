"""The in-place collectives on other layouts (non-contiguous, zero-dim, requires_grad) and
16-bit accumulation (half averages without overflow, sums rounded once, integer averages)
(the rest: collectives_worker.py, collectives_bad_input_worker.py).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collectives_worker import check_equal, rank, world  # noqa: E402
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_noncontiguous_allreduce():
    n, r = world(), rank()
    base = torch.arange(35, dtype=torch.float32).reshape(5, 7) + r
    view = base.t()  # transposed: 7 x 5, not contiguous
    assert not view.is_contiguous()
    fm.allreduce_(view)
    want = torch.arange(35, dtype=torch.float32).reshape(5, 7) * n + n * (n - 1) / 2
    check_equal(base, want, "transposed view, seen through its base")

    base = torch.full((20,), float(r + 1))
    sl = base[1::3]  # strided slice with a storage offset
    fm.allreduce_(sl, op="sum")
    want = torch.full((20,), float(r + 1))
    want[1::3] = n * (n + 1) / 2
    check_equal(base, want, "strided slice: only the slice changes")

    base = torch.full((4, 6), rank() + 1, dtype=torch.float16)
    col = base[:, 2]
    fm.allreduce_(col, op="average")
    want = torch.full((4, 6), rank() + 1, dtype=torch.float16)
    want[:, 2] = (n + 1) / 2
    check_equal(base, want, "fp16 column average")


def case_noncontiguous_bcast_and_reduce():
    n, r = world(), rank()
    for root in range(n):
        base = torch.arange(24, dtype=torch.int32).reshape(4, 6) * 0 + r
        view = base[:, ::2]
        fm.bcast_(view, root_rank=root)
        want = torch.full((4, 6), r, dtype=torch.int32)
        want[:, ::2] = root
        check_equal(base, want, f"bcast_ strided, root {root}")

        base = torch.full((6, 4), r + 1, dtype=torch.float64)
        view = base.t()
        fm.reduce_(view, op="sum", root_rank=root)
        want = torch.full(
            (6, 4), float(n * (n + 1) // 2 if r == root else r + 1), dtype=torch.float64
        )
        check_equal(base, want, f"reduce_ transposed, root {root}")


def case_zero_dim_and_requires_grad():
    n, r = world(), rank()
    t = torch.tensor(float(r + 1))  # a 0-d tensor: one element
    fm.allreduce_(t)
    assert t.item() == n * (n + 1) / 2
    p = torch.nn.Parameter(torch.full((3,), float(r + 1)))  # a leaf that requires grad
    v0 = p._version
    fm.allreduce_(p, op="average")
    assert p.requires_grad and p._version > v0, "in-place write must bump the version counter"
    check_equal(p.detach(), torch.full((3,), (n + 1) / 2), "parameter average")
    q = torch.nn.Parameter(torch.full((3, 2), float(r + 1)))
    fm.bcast_(q.t(), root_rank=0)  # non-contiguous view of a leaf requiring grad
    check_equal(q.detach(), torch.full((3, 2), 1.0), "bcast_ into a parameter view")


def case_half_average_does_not_overflow():
    n = world()
    for t in (torch.full((9,), 40000.0, dtype=torch.float16),):
        fm.allreduce_(t, op="average")
        check_equal(t, torch.full((9,), 40000.0, dtype=torch.float16), "fp16 average of 40000")
    t = torch.full((9,), 40000.0, dtype=torch.float16)
    fm.reduce_(t, op="average", root_rank=n - 1)
    if rank() == n - 1:
        check_equal(t, torch.full((9,), 40000.0, dtype=torch.float16), "fp16 reduce_ average")
    t = torch.full((9,), 40000.0, dtype=torch.float16)
    fm.Iallreduce(t, op="average").wait()
    check_equal(t, torch.full((9,), 40000.0, dtype=torch.float16), "fp16 Iallreduce average")


def case_half_sum_rounds_once():
    # Rank 0 holds 2048 (fp16) / 256 (bf16), every other rank 1: the fp32 sum rounded once.
    # Rounding after each pairwise add would lose every +1 (2048 + 1 is a tie that rounds
    # back to 2048); with 4 ranks the two results differ (2052 against 2048 or 2050).
    n, r = world(), rank()
    for dtype, big in ((torch.float16, 2048.0), (torch.bfloat16, 256.0)):
        t = torch.full((5,), big if r == 0 else 1.0, dtype=dtype)
        fm.allreduce_(t)
        want = torch.full((5,), big + (n - 1), dtype=torch.float32).to(dtype)
        check_equal(t, want, f"{dtype} sum rounded once")
        t = torch.full((5,), big if r == 0 else 1.0, dtype=dtype)
        fm.reduce_(t, root_rank=0)
        if r == 0:
            check_equal(t, want, f"{dtype} reduce_ sum rounded once")
    if n == 4:
        assert torch.tensor(2051.0).half().item() == 2052.0


def case_integer_average_is_floor_without_wrap():
    n, r = world(), rank()
    t = torch.full((3,), 100 + r, dtype=torch.int8)  # int8 sum would wrap at 4 ranks
    fm.allreduce_(t, op="average")
    check_equal(
        t, torch.full((3,), (sum(100 + k for k in range(n))) // n, dtype=torch.int8), "int8 avg"
    )
    t = torch.full((3,), -1 - r, dtype=torch.int32)
    fm.allreduce_(t, op="average")
    check_equal(
        t,
        torch.full((3,), sum(-1 - k for k in range(n)) // n, dtype=torch.int32),
        "floor of negative mean",
    )


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
