"""Small in-place calls that carry their data in their agreement's message (ops/carried.h):
the same bits as an uncarried call, and every mismatch still raised on every rank (the rest:
collectives_worker.py, collectives_layouts_worker.py, collectives_bad_input_worker.py).
"""

import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collectives_worker import check_equal, rank, world  # noqa: E402
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402


def case_small_calls_carry_their_data():
    """A loop of small calls of one size rides in the agreement's message (ops/carried.h) from
    its second call on, with the bits of the first (which moved its data after the check); a
    mismatch or a bad argument after such a loop still raises on every rank and leaves every
    tensor as it was."""
    n, r = world(), rank()
    if n == 1:
        return
    g = torch.Generator().manual_seed(r)
    x = torch.randn(1000, generator=g) * 1e3 ** torch.rand(1000, generator=g)
    ints = (x * 100).to(torch.int64)
    calls = [  # (call, input, carried at this world size)
        (lambda t: fm.allreduce_(t), x, n == 2),  # floats: the same bits on 2 ranks only
        (lambda t: fm.allreduce_(t, op="average"), x.double(), n == 2),
        (lambda t: fm.allreduce_(t, op="max"), ints, True),
        (lambda t: fm.allreduce_(t, op="average"), ints.to(torch.int16), True),
        (lambda t: fm.allreduce_(t, op="bxor"), ints.to(torch.int32), True),
        (lambda t: fm.allreduce_(t, op="sum"), ints > 0, True),
        (lambda t: fm.bcast_(t, root_rank=n - 1), x, True),
        (lambda t: fm.bcast_(t, root_rank=0), x.half().view(10, 100).t(), True),
        (lambda t: fm.reduce_(t, op="sum", root_rank=n - 1), x, n == 2),
        (lambda t: fm.reduce_(t, op="min", root_rank=0), ints.to(torch.int8), True),
    ]
    for call, given, carries in calls:
        fm.barrier()  # no room: the first call moves its data after its check
        first = call(given.clone())
        before = C.carried_calls()
        again = [call(given.clone()) for _ in range(3)]
        carried = C.carried_calls() - before
        assert carried == (3 if carries else 0), (carried, carries, given.dtype)
        for t in again:
            assert torch.equal(t, first) and t.stride() == first.stride(), "carried bits differ"
    # After a loop of one size, a mismatch raises on every rank, the tensors untouched.
    bad = [
        (lambda t: fm.allreduce_(t if r == 0 else t[:-1]), RuntimeError, "disagree on numel"),
        (lambda t: fm.allreduce_(t, op="sum" if r == 0 else "prod"), RuntimeError, "on op"),
        (lambda t: fm.bcast_(t, root_rank=r % 2), RuntimeError, "disagree on root_rank"),
        (lambda t: fm.reduce_(t, "max", 0 if r == 0 else n), ValueError, "out of range"),
        (lambda t: fm.allreduce_(t if r == 0 else t.int()), RuntimeError, "disagree on dtype"),
        (lambda t: fm.allreduce_(t, name="a" if r == 0 else "b"), RuntimeError, "different"),
    ]
    for call, error, text in bad:
        for _ in range(2):
            fm.allreduce_(ints.clone(), op="max")
        t = ints.clone()
        before = C.carried_calls()
        raises(error, functools.partial(call, t), text)
        assert torch.equal(t, ints), f"a failed check changed the tensor ({text})"
        assert C.carried_calls() == before, text
    # and the ranks are still in step
    t = torch.full((2,), float(r + 1))
    fm.allreduce_(t)
    check_equal(t, torch.full((2,), n * (n + 1) / 2), "after carried mismatches")


# ---------------------------------------------------------------- runtime


if __name__ == "__main__":
    run_cases(globals())
