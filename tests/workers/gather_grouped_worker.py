"""The row collectives' grouped forms (equal to single calls; allreduce and bcast in place) and
async forms with wait and test (the rest: gather_collectives_worker.py,
gather_gradients_worker.py).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gather_collectives_worker import check_equal, rank, rows_of, table, world  # noqa: E402
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402


def case_grouped_forms_equal_single_calls():
    n, r = world(), rank()
    a, b, c = (
        rows_of(r),
        torch.full((n, 2), r, dtype=torch.int32),
        torch.ones(2 * n, dtype=torch.float16),
    )
    for got, want in zip(fm.grouped_allgather([a, b, c]), [fm.allgather(t) for t in (a, b, c)]):
        check_equal(got, want, "grouped_allgather")
    got = fm.grouped_gather([a, b, c], root_rank=n - 1)
    if r == n - 1:
        for g, t in zip(got, (a, b, c)):
            check_equal(g, fm.allgather(t), "grouped_gather")
    else:
        assert got is None
        [fm.allgather(t) for t in (a, b, c)]  # the same calls as the root
    src = [table(n), torch.arange(n * 3, dtype=torch.int64)]
    for got, want in zip(fm.grouped_scatter(src, root_rank=0, splits=[None, [3] * n]),
                         [fm.scatter(src[0]), fm.scatter(src[1])]):  # fmt: skip
        check_equal(got, want, "grouped_scatter")
    xs = [table(n) * (r + 1), torch.ones(n, dtype=torch.int32) * r, torch.ones(n * 2, 3)]
    for got, want in zip(fm.grouped_reduce_scatter(xs, op="sum"),
                         [fm.reduce_scatter(x, op="sum") for x in xs]):  # fmt: skip
        check_equal(got, want, "grouped_reduce_scatter")
    splits = [(r + j) % 2 for j in range(n)]
    ys = [torch.full((sum(splits), 2), float(r)), torch.arange(n * 2) + 10 * r]
    for got, want in zip(fm.grouped_alltoall(ys, splits=[splits, None]),
                         [fm.alltoall(ys[0], splits), fm.alltoall(ys[1])]):  # fmt: skip
        check_equal(got, want, "grouped_alltoall")
    assert fm.grouped_allgather([]) == []


def case_grouped_allreduce_and_bcast_in_place():
    n, r = world(), rank()
    total = n * (n + 1) // 2
    ts = [torch.full((k,), float(r + 1)) for k in (1, 7, 0, 1023)]
    ts += [
        torch.full((3, 2), r + 1, dtype=torch.int64),
        torch.full((2,), r + 1.0, dtype=torch.float16),
    ]
    ts.append(torch.full((4, 3), float(r + 1)).t())  # non-contiguous
    out = fm.grouped_allreduce_(ts)
    assert all(o is t for o, t in zip(out, ts))
    for t in ts:
        check_equal(t, torch.full_like(t, total), f"grouped sum {t.dtype} {tuple(t.shape)}")
    avg = [torch.full((5,), float(r + 1)), torch.full((2,), r + 1, dtype=torch.int32)]
    fm.grouped_allreduce_(avg, op="average")
    check_equal(avg[0], torch.full((5,), (n + 1) / 2), "average")
    check_equal(avg[1], torch.full((2,), total // n, dtype=torch.int32), "int average")
    bs = [
        torch.full((3,), float(r)),
        torch.full((2, 2), r, dtype=torch.int8),
        torch.full((3, 2), float(r)).t(),
    ]
    fm.grouped_bcast_(bs, root_rank=n - 1)
    for t in bs:
        check_equal(t, torch.full_like(t, n - 1), "grouped_bcast_")


def case_async_forms_wait_and_test():
    n, r = world(), rank()
    reqs = [
        fm.Iallgather(torch.full((1,), float(r))),
        fm.Igather(torch.full((1,), float(r)), root_rank=0),
        fm.Iscatter(torch.arange(float(n))),
        fm.Ireduce_scatter(torch.ones(n)),
        fm.Ialltoall(torch.full((n,), float(r))),
        fm.grouped_allreduce_([torch.ones(2)], async_op=True),
    ]
    assert all(isinstance(q, fm.Request) for q in reqs)
    results = [q.wait() for q in reqs]
    assert all(q.test() for q in reqs)
    check_equal(results[0], torch.arange(float(n)), "Iallgather")
    if r == 0:
        check_equal(results[1], torch.arange(float(n)), "Igather")
    else:
        assert results[1] is None
    check_equal(results[2], torch.tensor([float(r)]), "Iscatter")
    check_equal(results[3], torch.tensor([float(n)]), "Ireduce_scatter")
    check_equal(results[4], torch.arange(float(n)), "Ialltoall")
    check_equal(results[5][0], torch.full((2,), float(n)), "grouped async")
    # the blocking single-tensor calls take a shorter path than the async ones: the same
    # collective all the same, so ranks may mix them
    x = torch.full((2,), float(r))
    got = fm.Iallgather(x).wait() if r == 0 else fm.allgather(x)
    check_equal(got, torch.arange(float(n)).repeat_interleave(2), "allgather, mixed paths")
    got = fm.Ialltoall(x.repeat(n)).wait() if r == 0 else fm.alltoall(x.repeat(n))
    check_equal(got, torch.arange(float(n)).repeat_interleave(2), "alltoall, mixed paths")
    got = (
        fm.Ireduce_scatter(torch.ones(2 * n)).wait()
        if r == 0
        else fm.reduce_scatter(torch.ones(2 * n))
    )
    check_equal(got, torch.full((2,), float(n)), "reduce_scatter, mixed paths")
    ts = (torch.ones(3), torch.ones(1, dtype=torch.int64))
    out = fm.grouped_allreduce_(ts, async_op=True).wait()
    assert [o is t for o, t in zip(out, ts)] == [True, True] and isinstance(out, list)
    check_equal(ts[1], torch.full((1,), n, dtype=torch.int64), "grouped tuple")


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
