"""reduce_scatter through shared memory (one host, 128 KiB and more: every rank writes its
parts of the others' chunks into their windows and reduces its own chunk) against closed
forms, against MPI_Reduce_scatter (RingOptions.list_shared_memory=False) and against the sum in
rank order computed here: every dtype and op it takes, uneven and empty parts, parts past one
window's round, sub-groups, and what it leaves to MPI.

Run by tests/test_shared_reduce_scatter.py under mpiexec at 1, 2 and 3 ranks.
"""

import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py._C as C  # noqa: E402

MIN_BYTES = 128 << 10  # kSharedReduceScatterMinBytes (csrc/backend/mpi_shared_pieces.h)
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
OPS = ["sum", "average", "min", "max"]


def rank():
    return fm.local_rank()


def world():
    return fm.total_workers()


@contextlib.contextmanager
def shared(on):
    """Shared memory (on) or MPI_Reduce_scatter (off), set alike on every rank."""
    saved = C.ring_options()
    o = C.ring_options()
    o.list_shared_memory = on
    C.set_ring_options(o)
    try:
        yield
    finally:
        C.set_ring_options(saved)


def values(r, numel, dtype):
    """Rank r's input: small integers, exact in every dtype and in sums in any order."""
    e = torch.arange(numel, dtype=torch.int64)
    return ((e * 3 + r * 7) % 11 - 5).to(dtype)


def reduced(parts, op, dtype, n):
    """The closed form of `op` over every rank's input, in float64, then as the backends cast."""
    allr = torch.stack([p.to(torch.float64) for p in parts])
    if op == "min":
        return allr.amin(0).to(dtype)
    if op == "max":
        return allr.amax(0).to(dtype)
    total = allr.sum(0)
    if op == "sum":
        return total.to(dtype)
    if dtype.is_floating_point:
        return total.to(dtype) / n
    return torch.div(total, n, rounding_mode="floor").to(dtype)


def my_part(full, splits, r):
    start = sum(splits[:r])
    return full[start : start + splits[r]]


def run(t, op, on, splits=None, group=None):
    """reduce_scatter through the chosen path; returns its result and whether it went shared."""
    before = C.shared_reduce_scatter_calls()
    with shared(on):
        out = fm.reduce_scatter(t, op=op, splits=splits, group=group)
    return out, C.shared_reduce_scatter_calls() - before


def case_every_dtype_and_op_matches_closed_form_and_mpi():
    n, r = world(), rank()
    for dtype in DTYPES:
        numel = 3 * (MIN_BYTES // dtype.itemsize) // 2 + n  # past the threshold
        numel -= numel % n
        want_full = None
        for op in OPS:
            t = values(r, numel, dtype)
            got, went = run(t, op, True)
            ref, went_mpi = run(t, op, False)
            assert went == int(n > 1) and went_mpi == 0, (dtype, op, went, went_mpi)
            want_full = reduced([values(k, numel, dtype) for k in range(n)], op, dtype, n)
            want = my_part(want_full, [numel // n] * n, r)
            assert got.dtype == dtype and torch.equal(got, want), (dtype, op)
            assert torch.equal(got, ref), (dtype, op, "shared and MPI differ")
            assert torch.equal(t, values(r, numel, dtype)), "the input changed"


def case_random_floats_are_summed_in_rank_order():
    # Each element is x_0 + x_1 + ... in rank order, as a float32 loop here: bit for bit.
    n, r = world(), rank()
    numel = (1 << 20) - (1 << 20) % n

    def rank_input(k):
        return torch.randn(numel, generator=torch.Generator().manual_seed(100 + k))

    got, went = run(rank_input(r), "sum", True)
    want = rank_input(0)
    for k in range(1, n):
        want = want + rank_input(k)
    assert went == int(n > 1)
    assert torch.equal(got, my_part(want, [numel // n] * n, r))


def case_uneven_and_empty_parts_and_rows():
    # Parts of different sizes, one empty, rows of several elements; the same through MPI.
    n, r = world(), rank()
    splits = [40_000 + 13 * k for k in range(n)]
    splits[n // 2] = 0
    for dtype in (torch.float32, torch.int64):
        t = values(r, sum(splits) * 3, dtype).reshape(-1, 3)
        got, went = run(t, "sum", True, splits=splits)
        ref, _ = run(t, "sum", False, splits=splits)
        want_full = reduced([values(k, sum(splits) * 3, dtype) for k in range(n)], "sum", dtype, n)
        want = my_part(want_full.reshape(-1, 3), splits, r)
        assert went == int(n > 1) and got.shape == (splits[r], 3), (got.shape, went)
        assert torch.equal(got, want) and torch.equal(got, ref), dtype


def case_parts_past_one_window_move_in_rounds():
    # float64 parts of 600 001 elements: past a 4 MiB window's round at 2 and 3 ranks, with a
    # last round that ends inside every part.
    n, r = world(), rank()
    splits = [600_001 - k for k in range(n)]
    t = values(r, sum(splits), torch.float64)
    for op in ("sum", "max"):
        got, went = run(t, op, True, splits=splits)
        want_full = reduced([values(k, sum(splits), torch.float64) for k in range(n)], op,
                            torch.float64, n)  # fmt: skip
        assert went == int(n > 1) and torch.equal(got, my_part(want_full, splits, r)), op


def case_what_shared_memory_leaves_to_mpi():
    # Below the threshold, and dtypes it does not reduce (int8, bool): MPI_Reduce_scatter.
    n, r = world(), rank()
    small = values(r, 1000 * n, torch.float32)
    got, went = run(small, "sum", True)
    assert went == 0 and torch.equal(
        got,
        my_part(
            reduced(
                [values(k, 1000 * n, torch.float32) for k in range(n)], "sum", torch.float32, n
            ),
            [1000] * n,
            r,
        ),  # fmt: skip
    )
    big = values(r, MIN_BYTES * n, torch.int8)
    got, went = run(big, "max", True)
    want = reduced([values(k, MIN_BYTES * n, torch.int8) for k in range(n)], "max", torch.int8, n)
    assert went == 0 and torch.equal(got, my_part(want, [MIN_BYTES] * n, r))


def case_half_precision_reduces_in_float32_through_shared_memory():
    # float16 and bfloat16 move as float32 (the wire dtype) and come back in their dtype.
    n, r = world(), rank()
    numel = (MIN_BYTES // 4) * n
    for dtype in (torch.float16, torch.bfloat16):
        t = values(r, numel, dtype)
        got, went = run(t, "average", True)
        ref, _ = run(t, "average", False)
        assert went == int(n > 1) and got.dtype == dtype, (dtype, went)
        assert torch.equal(got, ref), dtype


def case_on_a_sub_group():
    # The group's own window; a rank outside the group makes no call.
    n, r = world(), rank()
    members = [0, n - 1] if n > 2 else list(range(n))
    g = fm.new_group(members)
    if r not in members:
        return
    m = len(members)
    numel = (MIN_BYTES // 4) * m
    got, went = run(values(r, numel, torch.float32), "sum", True, group=g)
    want = reduced([values(k, numel, torch.float32) for k in members], "sum", torch.float32, m)
    assert went == int(m > 1) and torch.equal(
        got, my_part(want, [numel // m] * m, members.index(r))
    )


def case_grouped_allreduce_and_reduce_scatter_share_the_window():
    # Both use the communicator's window: interleaved calls must not overwrite each other.
    n, r = world(), rank()
    numel = (MIN_BYTES // 4) * n
    for i in range(3):
        t = values(r + i, numel, torch.float32)
        got, _ = run(t, "sum", True)
        ts = [values(r + i, 300_000, torch.float32), values(r, 7, torch.float32)]
        fm.grouped_allreduce_(ts)
        want = reduced([values(k + i, numel, torch.float32) for k in range(n)], "sum",
                       torch.float32, n)  # fmt: skip
        assert torch.equal(got, my_part(want, [numel // n] * n, r)), i
        assert torch.equal(ts[0], reduced([values(k + i, 300_000, torch.float32) for k in range(n)],
                                          "sum", torch.float32, n)), i  # fmt: skip


if __name__ == "__main__":
    run_cases(globals())
