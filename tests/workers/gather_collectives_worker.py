"""allgather, gather, scatter, reduce_scatter, alltoall against closed forms at any world size;
bad input and mismatches across ranks raise on every rank. Their grouped and async forms and
grouped allreduce_/bcast_ are in gather_grouped_worker.py; their differentiable forms,
broadcast_object and allgather_object in gather_gradients_worker.py.

Run by tests/test_gather_collectives.py under mpiexec at 1, 2 and 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py import _C as C  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
          torch.int64, torch.uint8, torch.bool]  # fmt: skip


def rank():
    return fm.local_rank()


def world():
    return fm.total_workers()


def rows_of(r, dtype=torch.float32, cols=3):
    """Rank r's tensor: r rows (rank 0 has none), row i of rank r holds 10 * r + i."""
    vals = torch.tensor([10 * r + i for i in range(r)], dtype=torch.float64)
    return vals.unsqueeze(1).expand(r, cols).to(dtype)


def check_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got, want)
    assert torch.equal(got, want), f"{what}: got {got.tolist()}, want {want.tolist()}"


def table(n, cols=4):
    """The same table on every rank: n * 2 rows, row i is i."""
    return torch.arange(2 * n, dtype=torch.float32).unsqueeze(1).repeat(1, cols)


# ---------------------------------------------------------------- closed forms


def case_allgather_equal_shapes_every_dtype():
    n, r = world(), rank()
    for dtype in DTYPES:
        t = torch.full((2, 3), r % 2 if dtype == torch.bool else r, dtype=dtype)
        want = torch.cat([torch.full((2, 3), s % 2 if dtype == torch.bool else s, dtype=dtype)
                          for s in range(n)])  # fmt: skip
        check_equal(fm.allgather(t), want, f"allgather {dtype}")


def case_allgather_first_dim_differs_by_rank():
    n, r = world(), rank()
    for dtype in (torch.float32, torch.int64, torch.float16):
        got = fm.allgather(rows_of(r, dtype))
        check_equal(got, torch.cat([rows_of(s, dtype) for s in range(n)]), f"allgather {dtype}")
    # non-contiguous input, 1-d, empty everywhere
    t = torch.arange(6.0).reshape(2, 3).t() + r  # shape (3, 2), transposed
    check_equal(fm.allgather(t), torch.cat([torch.arange(6.0).reshape(2, 3).t() + s
                                            for s in range(n)]), "transposed")  # fmt: skip
    check_equal(fm.allgather(torch.tensor([float(r)])), torch.arange(float(n)), "1-d")
    check_equal(fm.allgather(torch.zeros(0, 5)), torch.zeros(0, 5), "empty")


def case_outputs_are_ordinary_tensors():
    # Host outputs come from malloc (csrc/ops/row_lists.cpp new_output), not torch's allocator:
    # they must be aligned as torch's, grow, move to shared memory, save and load like any
    # tensor.
    import io

    n, r = world(), rank()
    for numel in (5, 300_000, (4 << 20) // 4 + 1):  # small, large, past the huge-page size
        x = torch.full((numel,), float(r))
        want = torch.cat([torch.full((numel,), float(k)) for k in range(n)])
        for out in (fm.allgather(x), fm.alltoall(torch.cat([x] * n)),
                    fm.reduce_scatter(torch.cat([x] * n))):  # fmt: skip
            assert out.data_ptr() % 64 == 0, out.data_ptr()
            assert out.untyped_storage().resizable()
        g = fm.allgather(x)
        check_equal(g, want, "allgather")
        g.resize_(2 * g.numel())  # grows through our allocator and keeps the values
        check_equal(g[: want.numel()], want, "allgather after resize_")
        s = fm.allgather(x).share_memory_()
        assert s.is_shared()
        check_equal(s, want, "allgather after share_memory_")
        buf = io.BytesIO()
        torch.save(fm.allgather(x), buf)
        buf.seek(0)
        check_equal(torch.load(buf), want, "allgather saved and loaded")
        assert torch.equal(torch.from_numpy(fm.allgather(x).numpy().copy()), want)


def case_gather_every_root():
    n, r = world(), rank()
    for root in range(n):
        got = fm.gather(rows_of(r), root_rank=root)
        if r == root:
            check_equal(got, torch.cat([rows_of(s) for s in range(n)]), f"gather root {root}")
        else:
            assert got is None, got


def case_scatter_equal_and_given_splits():
    n, r = world(), rank()
    for root in range(n):
        src = table(n) + (100 * r if r != root else 0)  # only the root's values count
        check_equal(fm.scatter(src, root_rank=root), table(n)[2 * r : 2 * r + 2], "equal")
        splits = [2 * n - (n - 1)] + [1] * (n - 1)  # uneven: the first rank takes the rest
        start = sum(splits[:r])
        got = fm.scatter(src, root_rank=root, splits=splits)
        check_equal(got, table(n)[start : start + splits[r]], f"splits {splits}")


def case_reduce_scatter_sum_average_max():
    n, r = world(), rank()
    x = table(n) * (r + 1)  # rank r's table times r + 1
    total = n * (n + 1) // 2
    check_equal(fm.reduce_scatter(x), (table(n) * total)[2 * r : 2 * r + 2], "sum")
    check_equal(
        fm.reduce_scatter(x, op="average"),
        (table(n) * total / n)[2 * r : 2 * r + 2],
        "average",
    )
    check_equal(fm.reduce_scatter(x, op="max"), (table(n) * n)[2 * r : 2 * r + 2], "max")
    splits = [0] * (n - 1) + [2 * n]  # the last rank gets all of it
    got = fm.reduce_scatter(x, op="sum", splits=splits)
    want = table(n) * total if r == n - 1 else torch.zeros(0, 4)
    check_equal(got, want, "given splits")
    for dtype in (torch.int8, torch.float16, torch.int64):
        got = fm.reduce_scatter(torch.ones(n, 2, dtype=dtype), op="average")
        check_equal(got, torch.ones(1, 2, dtype=dtype), f"average {dtype}")
    # float16 sums accumulate in fp32 and round once, as allreduce_ does
    big = torch.full((n,), 2048.0 if r == 0 else 1.0, dtype=torch.float16)
    check_equal(
        fm.reduce_scatter(big), torch.full((1,), 2048.0 + n - 1, dtype=torch.float16), "fp16"
    )


def case_alltoall_equal_and_given_splits():
    n, r = world(), rank()
    # equal: row j of rank r (value 100 r + j) goes to rank j
    x = torch.tensor([[100.0 * r + j] for j in range(n)])
    check_equal(fm.alltoall(x), torch.tensor([[100.0 * s + r] for s in range(n)]), "equal")
    # given, different on every rank: rank r sends (r + j) % 3 rows of 100 r + j to rank j
    splits = [(r + j) % 3 for j in range(n)]
    x = torch.cat([torch.full((splits[j], 2), 100.0 * r + j) for j in range(n)])
    want = torch.cat([torch.full(((s + r) % 3, 2), 100.0 * s + r) for s in range(n)])
    check_equal(fm.alltoall(x, splits=splits), want, "given splits")
    i = torch.arange(n * 3, dtype=torch.int64) + 1000 * r
    got = fm.alltoall(i)
    want = torch.cat([torch.arange(3 * r, 3 * r + 3) + 1000 * s for s in range(n)])
    check_equal(got, want, "int64")


def case_alltoall_block_form_only_when_every_rank_sends_equal_parts():
    """Equal parts everywhere go as MPI_Alltoall, anything else as MPI_Alltoallv. The choice
    must be the same on every rank (the two do not match each other): rank 0's own splits are
    equal below while the others' are not, so rank 0 must take Alltoallv too."""
    n, r = world(), rank()
    blocks = C.alltoall_block_calls

    def calls(fn):
        before = blocks()
        out = fn()
        return out, blocks() - before

    x = torch.tensor([[100.0 * r + j] for j in range(n)])
    got, used = calls(lambda: fm.alltoall(x))
    check_equal(got, torch.tensor([[100.0 * s + r] for s in range(n)]), "equal")
    assert used == 1, f"rank {r}: equal parts took MPI_Alltoallv"
    # rank 0 sends one row to everyone; rank s > 0 sends s + j rows to rank j
    mine = [1] * n if r == 0 else [r + j for j in range(n)]
    y = torch.cat([torch.full((mine[j], 2), 100.0 * r + j) for j in range(n)])
    got, used = calls(lambda: fm.alltoall(y, splits=mine))
    want = torch.cat([torch.full((1 if s == 0 else s + r, 2), 100.0 * s + r) for s in range(n)])
    check_equal(got, want, "equal on rank 0 only")
    assert used == (1 if n == 1 else 0), f"rank {r}: took MPI_Alltoall with {mine}"
    # a list: every tensor in equal parts, rows of different lengths and dtypes, one empty
    ts = [
        torch.arange(n * 3, dtype=torch.int64).reshape(n, 3) + 1000 * r,
        torch.full((2 * n,), float(r), dtype=torch.float16),
        torch.zeros(0, 5),
    ]
    got, used = calls(lambda: fm.grouped_alltoall(ts))
    for g, t in zip(got, ts):
        check_equal(g, fm.alltoall(t), "grouped, equal parts")
    assert used == 1, f"rank {r}: a grouped call in equal parts took MPI_Alltoallv"


def case_complex_rows_move_as_bytes():
    n, r = world(), rank()

    def c(v, k=2):
        return torch.full((k,), complex(v, -2 * v), dtype=torch.complex128)

    check_equal(fm.allgather(c(r, r + 1)), torch.cat([c(s, s + 1) for s in range(n)]), "allgather")
    got = fm.gather(c(r), root_rank=n - 1)
    if r == n - 1:
        check_equal(got, torch.cat([c(s) for s in range(n)]), "gather")
    check_equal(fm.scatter(torch.cat([c(s) for s in range(n)]), root_rank=0), c(r), "scatter")
    x = torch.cat([c(10 * r + j, 1) for j in range(n)]).to(torch.complex64)
    want = torch.cat([c(10 * s + r, 1) for s in range(n)]).to(torch.complex64)
    check_equal(fm.alltoall(x), want, "alltoall")
    a, b = fm.grouped_allgather([c(r), torch.full((1,), float(r))])
    check_equal(a, torch.cat([c(s) for s in range(n)]), "grouped, complex")
    check_equal(b, torch.arange(n, dtype=torch.float32), "grouped, real")
    for ts in ([c(r)], [c(r, 3), torch.full((2,), float(r))]):
        fm.grouped_bcast_(ts, root_rank=n - 1)
        check_equal(ts[0], c(n - 1, ts[0].numel()), f"grouped_bcast_ of {len(ts)}")
    # reduce_scatter sums and averages them as pairs of reals, alone or in a list
    x = torch.stack([c(r + j) for j in range(n)])  # row j goes to rank j
    want = c(sum(s + r for s in range(n))).unsqueeze(0)
    check_equal(fm.reduce_scatter(x), want, "reduce_scatter")
    torch.testing.assert_close(fm.reduce_scatter(x, op="average"), want / n)
    a, b = fm.grouped_reduce_scatter([x, torch.ones(n * 3)])
    check_equal(a, want, "grouped_reduce_scatter, complex")
    check_equal(b, torch.full((3,), float(n)), "grouped_reduce_scatter, real")
    # so a differentiable allgather of complex values has its backward (a reduce_scatter)
    t = c(r).to(torch.complex64).requires_grad_()
    (fm.allgather(t).abs() ** 2).sum().backward()
    check_equal(t.grad, 2 * n * t.detach(), "allgather's backward")
    if n > 1:  # a complex tensor against its pairs of reals: the ranks disagree
        t = c(r) if r == 0 else torch.view_as_real(c(r))
        raises(RuntimeError, lambda: fm.allgather(t), "disagree")
        t = x if r == 0 else torch.view_as_real(x)
        raises(RuntimeError, lambda: fm.reduce_scatter(t), "disagree")


# ---------------------------------------------------------------- grouped and async


# ---------------------------------------------------------------- gradients


# ---------------------------------------------------------------- objects


# ---------------------------------------------------------------- errors


def case_bad_input_raises_on_every_rank():
    n, r = world(), rank()
    bad = n - 1
    t = [1.0] if r == bad else torch.ones(2)
    raises(
        TypeError, lambda: fm.allgather(t), "allgather()", f"rank {bad}", "must be a torch.Tensor"
    )
    raises(TypeError, lambda: fm.grouped_allgather([torch.ones(1), "x"]), "tensors[1]")
    # grouped_allreduce_ / grouped_bcast_ check their items in C++: one rank's bad item
    # still raises on every rank, naming it
    items = [torch.ones(1), "x" if r == bad else torch.ones(1)]
    raises(TypeError, lambda: fm.grouped_allreduce_(items), f"rank {bad}", "tensors[1]", "str")
    raises(TypeError, lambda: fm.grouped_bcast_(tuple(items)), f"rank {bad}", "tensors[1]")
    raises(TypeError, lambda: fm.grouped_allreduce_(torch.ones(2)), "must be a list")
    if n > 1:
        raises(
            ValueError, lambda: fm.reduce_scatter(torch.ones(n + 1)), "rows (dim 0)", "equal parts"
        )
    raises(ValueError, lambda: fm.scatter(torch.ones(2 * n), splits=[1] * n), "sum to", f"{2 * n}")
    raises(ValueError, lambda: fm.alltoall(torch.ones(n), splits=[-1] + [1] * n), ">= 0")
    splits = [1] * (n + 1) if r == bad else [1] * n
    raises(
        ValueError,
        lambda: fm.alltoall(torch.ones(len(splits)), splits=splits),
        f"rank {bad}",
        "splits",
    )
    raises(ValueError, lambda: fm.allgather(torch.tensor(1.0)), "0-dim")
    raises(
        ValueError, lambda: fm.gather(torch.ones(1), root_rank=n), f"root_rank {n} is out of range"
    )
    raises(TypeError, lambda: fm.gather(torch.ones(1), root_rank="0"), "root_rank must be an int")
    raises(ValueError, lambda: fm.reduce_scatter(torch.ones(n), op="median"), "'median'")
    raises(TypeError, lambda: fm.allgather(torch.ones(2, dtype=torch.uint32)), "uint32")
    # complex values sum as pairs of reals, but an ordering of them is refused
    raises(TypeError, lambda: fm.reduce_scatter(torch.ones(n, dtype=torch.complex64), op="max"),
           "complex64")  # fmt: skip
    check_equal(fm.allgather(torch.ones(1)), torch.ones(n), "in step after errors")


def case_past_2_gib_raises_on_every_rank():
    # torch.empty does not touch its pages: these cost address space, not memory.
    n = world()
    big = torch.empty(n * (2**31 // n + 1), dtype=torch.uint8)
    for call in (fm.allgather, fm.gather, fm.alltoall, fm.reduce_scatter, fm.scatter):
        raises(ValueError, lambda call=call: call(big), "bytes in one call", "at most 2 GiB")
    check_equal(fm.allgather(torch.ones(1)), torch.ones(n), "in step after errors")


def case_mismatch_across_ranks():
    n, r = world(), rank()
    if n == 1:
        return
    raises(
        RuntimeError,
        lambda: fm.allgather(torch.ones(2, 3 if r == 0 else 4)),
        "allgather()",
        "disagree on shape",
        "rank 0 has tensor of shape [2, 3]",
        "rank 1 has tensor of shape [2, 4]",
    )
    dt = torch.float32 if r == 0 else torch.float64
    raises(
        RuntimeError,
        lambda: fm.alltoall(torch.ones(n, dtype=dt)),
        "alltoall()",
        "disagree on dtype",
        "rank 0 has torch.float32",
        "rank 1 has torch.float64",
    )
    raises(
        RuntimeError,
        lambda: fm.reduce_scatter(torch.ones(n * (r + 1))),
        "reduce_scatter()",
        "disagree on shape",
        f"rank 0 has tensor of shape [{n}]",
    )
    splits = [n] + [0] * (n - 1) if r == 0 else [0] * (n - 1) + [n]
    raises(
        RuntimeError,
        lambda: fm.scatter(torch.ones(n), splits=splits),
        "scatter()",
        "disagree on shape",
        f"splits [{n}, ",
    )
    raises(
        RuntimeError,
        lambda: fm.grouped_allgather([torch.ones(1)] * (r + 1)),
        "disagree on the number of tensors",
        "rank 0 has 1",
        "rank 1 has 2",
    )
    call = (lambda: fm.allgather(torch.ones(1))) if r == 0 else (lambda: fm.alltoall(torch.ones(n)))
    raises(RuntimeError, call, "ranks are in different calls", "rank 0 is in allgather()",
           "rank 1 is in alltoall()")  # fmt: skip
    raises(
        RuntimeError, fm.Iallgather(torch.ones(1, r + 1)).wait, "Iallgather()", "disagree on shape"
    )
    check_equal(fm.allgather(torch.ones(1)), torch.ones(n), "in step after mismatches")


if __name__ == "__main__":
    run_cases(globals())
