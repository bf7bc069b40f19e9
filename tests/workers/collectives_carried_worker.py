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
from fluxmpi_py.collectives import inplace  # noqa: E402
from fluxmpi_py.runtime.agreement import debug_box  # noqa: E402

# Groups of at most this many ranks agree point to point (backend/direct.h kDirectMaxRanks):
# there every small call carries its data, its first call too.
DIRECT_MAX_RANKS = 4


def _expected(kind, op, root, inputs, mine):
    """What a call gives on this rank, in closed form from every rank's input (a sum of floats
    only on 2 ranks: there a + b is MPI's bits in any algorithm)."""
    r = rank()
    if kind == "bcast":
        return inputs[root]
    if kind == "reduce" and r != root:
        return mine
    stack = torch.stack([t.contiguous() for t in inputs])
    if op == "max":
        return stack.amax(0)
    if op == "min":
        return stack.amin(0)
    if op == "bxor":
        out = stack[0].clone()
        for t in stack[1:]:
            out ^= t
        return out
    if mine.dtype == torch.bool:  # sum of bools: "or"
        return stack.any(0)
    if op == "average" and not mine.is_floating_point():
        return stack.long().sum(0).div(len(inputs), rounding_mode="floor").to(mine.dtype)
    total = stack[0] + stack[1] if len(inputs) == 2 else stack.sum(0)
    return total / len(inputs) if op == "average" else total


def case_small_calls_carry_their_data():
    """Small calls ride in their agreement (ops/carried.h), on a group of up to
    DIRECT_MAX_RANKS from the first call on (point to point: backend/direct.h), with the bits
    of the closed form (MPI's); a mismatch or a bad argument after such a loop still raises on
    every rank and leaves every tensor as it was."""
    n, r = world(), rank()
    if n == 1:
        return
    g = torch.Generator().manual_seed(r)
    x = torch.randn(1000, generator=g) * 1e3 ** torch.rand(1000, generator=g)
    ints = (x * 100).to(torch.int64)
    big = torch.randn(4096, generator=g)  # 16 KiB: past the header's inline bytes
    calls = [  # (kind, op, root, input, carried at this world size)
        ("allreduce", "sum", -1, x, n == 2),  # floats: the same bits on 2 ranks only
        ("allreduce", "sum", -1, big, n == 2),
        ("allreduce", "average", -1, x.double(), n == 2),
        ("allreduce", "max", -1, ints, True),
        ("allreduce", "max", -1, (big * 1e6).int(), True),
        ("allreduce", "average", -1, ints.to(torch.int16), True),
        ("allreduce", "bxor", -1, ints.to(torch.int32), True),
        ("allreduce", "sum", -1, ints > 0, True),
        ("bcast", None, n - 1, x, True),
        ("bcast", None, 0, big, True),
        ("bcast", None, 0, x.half().view(10, 100).t(), True),
        ("reduce", "sum", n - 1, x, n == 2),
        ("reduce", "sum", 0, big, n == 2),
        ("reduce", "min", 0, ints.to(torch.int8), True),
        ("reduce", "max", n - 1, (big * 1e6).int(), True),
    ]
    direct = n <= DIRECT_MAX_RANKS
    for kind, op, root, given, carries in calls:
        if kind == "allreduce":
            call = functools.partial(fm.allreduce_, op=op)
        elif kind == "bcast":
            call = functools.partial(fm.bcast_, root_rank=root)
        else:
            call = functools.partial(fm.reduce_, op=op, root_rank=root)
        inputs = fm.allgather_object(given)
        fm.barrier()  # no room: on a large group the first call moves its data after its check
        before, agreements = C.carried_calls(), C.direct_agreements()
        outs = [call(given.clone()) for _ in range(4)]
        carried = C.carried_calls() - before
        assert carried == (4 if direct else 3) * carries, (carried, carries, kind, given.dtype)
        assert C.direct_agreements() - agreements == (4 if direct else 0), "not point to point"
        want = _expected(kind, op, root, inputs, given)
        for t in outs:
            if carries or kind == "bcast" or not given.is_floating_point():
                assert torch.equal(t, want), f"{kind} {op} {given.dtype}: not the closed form"
            else:  # MPI's own order of the additions
                assert torch.equal(t, outs[0]) and torch.allclose(t, want, rtol=1e-5, atol=1e-2)
            assert t.stride() == given.stride()
    # After a loop of one size, a mismatch raises on every rank, the tensors untouched: in
    # the header's message (1000 elements) and past it (16 KiB).
    one = n - 1  # the rank that differs from the others
    bad = [
        (lambda t: fm.allreduce_(t if r == 0 else t[:-1]), RuntimeError, "disagree on numel"),
        (lambda t: fm.allreduce_(t, op="sum" if r == 0 else "prod"), RuntimeError, "on op"),
        (lambda t: fm.bcast_(t, root_rank=r % 2), RuntimeError, "disagree on root_rank"),
        (lambda t: fm.bcast_(t if r != one else t[:-1], 0), RuntimeError, "disagree on numel"),
        (lambda t: fm.bcast_(t if r != one else t[: t.numel() // 2], one), RuntimeError, "numel"),
        (lambda t: fm.bcast_(t if r != one else t.view(torch.float32), 0), RuntimeError, "dtype"),
        (lambda t: fm.bcast_(t, 0, name="a" if r == one else "b"), RuntimeError, "different"),
        (lambda t: fm.reduce_(t, "max", 0 if r == 0 else n), ValueError, "out of range"),
        (lambda t: fm.reduce_(t, "max", 0 if r != one else 1), RuntimeError, "on root_rank"),
        (lambda t: fm.reduce_(t, "max" if r != one else "min", 0), RuntimeError, "on op"),
        (lambda t: fm.reduce_(t if r != one else t[1:], "max", one), RuntimeError, "numel"),
        (lambda t: fm.allreduce_(t if r == 0 else t.short()), RuntimeError, "disagree on dtype"),
        (lambda t: fm.allreduce_(t, name="a" if r == 0 else "b"), RuntimeError, "different"),
    ]
    for size in (1000, 4096):
        given = (x.repeat(5)[:size] * 100).to(torch.int32 if size == 4096 else torch.int64)
        for call, error, text in bad:
            for _ in range(2):
                fm.allreduce_(given.clone(), op="max")
            t = given.clone()
            before = C.carried_calls()
            raises(error, functools.partial(call, t), text)
            assert torch.equal(t, given), f"a failed check changed the tensor ({text}, {size})"
            assert C.carried_calls() == before, text
    # and the ranks are still in step
    t = torch.full((2,), float(r + 1))
    fm.allreduce_(t)
    check_equal(t, torch.full((2,), n * (n + 1) / 2), "after carried mismatches")


class _Hot:
    """Counts the calls of allreduce_, bcast_ and reduce_ that take their hot path (straight to
    the compiled call: collectives/inplace.py), while in scope."""

    NAMES = ("_allreduce_c", "_bcast_c", "_reduce_c")

    def __enter__(self):
        self.count, self.saved = 0, [getattr(inplace, n) for n in self.NAMES]
        for name, compiled in zip(self.NAMES, self.saved):
            setattr(inplace, name, self._counting(compiled))
        return self

    def _counting(self, compiled):
        def call(*args):
            self.count += 1
            return compiled(*args)

        return call

    def __exit__(self, *exc):
        for name, compiled in zip(self.NAMES, self.saved):
            setattr(inplace, name, compiled)


def case_hot_calls_keep_every_guarantee():
    """allreduce_, bcast_ and reduce_ with no group= and no name= go straight to the compiled
    call (inplace.py's hot path), and keep every guarantee there: a mismatched shape, dtype,
    op or root on one rank raises on every rank, small (carried), at 16 KiB and past the
    carried sizes, with the tensors untouched; an error this rank raises before the call met
    the others is its verdict in their agreement; a name= and the detail debug mode take the
    general form, which checks the names and call sites."""
    n, r = world(), rank()
    one = n - 1  # the rank that differs
    mismatches = [
        (lambda t: fm.allreduce_(t if r != one else t[:-1]), "disagree on numel"),
        (lambda t: fm.allreduce_(t if r != one else t.view(torch.float32)), "on dtype"),
        (lambda t: fm.allreduce_(t, "max" if r != one else "min"), "disagree on op"),
        (lambda t: fm.bcast_(t if r != one else t.view(2, -1), 0), "disagree on shape"),
        (lambda t: fm.bcast_(t, 0 if r != one else n - 1), "disagree on root_rank"),
        (lambda t: fm.reduce_(t if r != one else t[1:], "max", 0), "disagree on numel"),
        (lambda t: fm.reduce_(t, "max", 0 if r != one else n - 1), "disagree on root_rank"),
        (lambda t: fm.reduce_(t, "max" if r != one else "sum", 0), "disagree on op"),
    ]
    with _Hot() as hot:
        for size in (8, 1000, 4096, 1 << 16):  # in the header, past it, past the carry
            given = torch.arange(size, dtype=torch.int32) * (r + 1)
            for call, text in mismatches if n > 1 else []:
                t = given.clone()
                raises(RuntimeError, functools.partial(call, t), text)
                assert torch.equal(t, given), f"a failed check changed the tensor ({text})"
            t = given.clone()
            fm.allreduce_(t, "max")
            check_equal(t, given // (r + 1) * n, f"after the mismatches ({size})")
            before = C.carried_calls()
            fm.reduce_(fm.bcast_(t, 0), "max", n - 1)
            if 1 < n <= DIRECT_MAX_RANKS:  # a bcast_ of up to 1 MiB rides point to point, a
                # reduce_ past 64 KiB where its payload goes through shared memory (one host)
                rides = size < 1 << 16 or C.node_size() == n
                assert C.carried_calls() - before == (2 if rides else 1), size
        assert hot.count == 4 * (3 + len(mismatches) * (n > 1)), f"{hot.count} hot calls"
    # An error raised on one rank before the call met the others: every rank raises it.
    real = inplace._allreduce_c

    def refuse(*args):
        raise OSError("this rank's disk is gone")

    inplace._allreduce_c = refuse if r == one else real
    try:
        raises(OSError, lambda: fm.allreduce_(torch.ones(3)), "disk is gone")
    finally:
        inplace._allreduce_c = real
    # name= and the detail mode: the general form, so names and call sites are checked.
    with _Hot() as hot:
        fm.allreduce_(torch.ones(2), name="hot")
        debug_box[0], saved = "detail", debug_box[0]
        try:
            fm.bcast_(torch.ones(2), 0)
            t = torch.ones(2)
            if n == 1:
                fm.reduce_(t, "sum", 0)
            elif r % 2 == 0:  # two sites, in step by position: the detail mode tells them apart
                msg = raises(RuntimeError, lambda: fm.reduce_(t, "sum", 0), "different calls")
            else:
                msg = raises(RuntimeError, lambda: fm.reduce_(t, "sum", 0), "different calls")
            assert n == 1 or msg.count("collectives_carried_worker.py:") >= 2, msg
        finally:
            debug_box[0] = saved
        assert hot.count == 0, f"{hot.count} calls with a name or in detail mode took the hot path"
    t = torch.full((2,), float(r + 1))
    fm.allreduce_(t)
    check_equal(t, torch.full((2,), n * (n + 1) / 2), "after the hot calls' errors")


def case_payloads_ride_in_shared_slots():
    """On one host, a point-to-point agreement's payload of 8 KiB-1 MiB goes through its sender's
    shared-memory slot (backend/mpi_direct_slots.h), two per rank written in turn: a mixed
    loop of every kind, root and size (each call's values new) gives the closed form on every
    call, so no slot is read stale or overwritten while read; a mismatch between them leaves
    the tensors untouched and the slots' next readers right; no name is left in /dev/shm."""
    n, r = world(), rank()
    if not 1 < n <= DIRECT_MAX_RANKS:
        return
    before, expect = C.direct_slot_writes(), 0
    sizes = (2049, 4096, 16384, 1 << 18)  # int32 elements: 8 KiB + 4 bytes, 16, 64 KiB, 1 MiB
    for i in range(60):
        size, root = sizes[i % 4], (i // 3) % n
        base = torch.arange(size, dtype=torch.int32) + 1000 * i
        t = base * (r + 1)
        if i % 3 == 0:
            fm.bcast_(t, root)
            want, expect = base * (root + 1), expect + (r == root)
        elif i % 3 == 1:
            fm.reduce_(t, "sum", root)
            want = base * (n * (n + 1) // 2) if r == root else base * (r + 1)
            expect += r != root
        else:
            fm.allreduce_(t, "max")
            want, expect = base * n, expect + 1
        check_equal(t, want, f"call {i}")
        if i % 7 == 3:  # a mismatch: the slots it wrote are never read
            t = base.clone()
            raises(
                RuntimeError, functools.partial(fm.bcast_, t if r != n - 1 else t[1:], 0), "numel"
            )
            assert torch.equal(t, base), "a failed check changed the tensor"
            expect += r == 0  # the root wrote its payload all the same
    # the root of a bcast_ writes, every other rank of a reduce_, every rank of an allreduce_;
    # the communicator's first agreement makes the slots at its end (one write fewer)
    writes = C.direct_slot_writes() - before
    assert expect - 1 <= writes <= expect, f"{writes} payloads in slots, expected {expect}"
    left = [f for f in os.listdir("/dev/shm") if f.startswith(f"fluxmpi-slots-{os.getpid()}-")]
    assert not left, left


# ---------------------------------------------------------------- runtime


if __name__ == "__main__":
    run_cases(globals())
