"""grouped_allreduce_ reduced where the tensors lie (no pack, no unpack; RingOptions.list_min_bytes),
through shared memory and through the ring over MPI datatypes (list_shared_memory=False),
against closed forms and against the pack path, at any world size:
uneven sizes, tensors smaller than a segment and across segment boundaries, non-contiguous
and overlapping tensors, every op and dtype the ring takes; results equal bit for bit on every
rank.

Run by tests/test_grouped_ring.py under mpiexec at 1, 2 and 3 ranks.
"""

import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py._C as C  # noqa: E402
import fluxmpi_py.horovod as hvd  # noqa: E402

NEVER = 1 << 62
# Element counts: smaller than a segment, across segment boundaries, odd, empty, and a total
# that no world size of 2 or 3 divides.
SIZES = [1, 2, 3, 5, 7, 64, 1001, 0, 13, 6, 250]
RING_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
OPS = ["sum", "average", "min", "max"]


def rank():
    return fm.local_rank()


def world():
    return fm.total_workers()


MODES = ["shared", "datatypes", "pack"]  # the in-place paths, then packing into one buffer


@contextlib.contextmanager
def path(mode, segment_bytes=24):
    """RingOptions that send a grouped list through shared memory, the ring over datatypes or
    the pack path (`mode`), set alike on every rank; flat buffers never take the ring, so
    C.ring_calls() counts the list paths only. The ring's segments of `segment_bytes` cut
    every list into many."""
    saved = C.ring_options()
    C.set_ring_options(
        C.RingOptions(
            sum_min_bytes=NEVER,
            average_min_bytes=NEVER,
            min_segment_bytes=segment_bytes,
            max_segment_bytes=segment_bytes,
            list_min_bytes=NEVER if mode == "pack" else 1,
            list_shared_memory=mode == "shared",
        )
    )
    try:
        yield
    finally:
        C.set_ring_options(saved)


def values(r, j, numel, dtype):
    """Rank r's tensor j: small integers (exact in every dtype, sums exact in any order),
    different on every rank, negative ones included."""
    e = torch.arange(numel, dtype=torch.int64)
    return ((e * 3 + j * 5 + r * 7) % 11 - 5).to(dtype)


def expected(op, j, numel, dtype, n):
    """The reduction of every rank's tensor j, computed here in float64 then cast."""
    allr = torch.stack([values(r, j, numel, torch.float64) for r in range(n)])
    if op == "sum":
        want = allr.sum(0)
    elif op == "min":
        want = allr.amin(0)
    elif op == "max":
        want = allr.amax(0)
    elif dtype.is_floating_point:
        return (allr.sum(0).to(dtype) / n).to(dtype)  # as the backends: a sum, then divided
    else:
        want = torch.div(allr.sum(0), n, rounding_mode="floor")
    return want.to(dtype)


def same_on_every_rank(ts, what):
    for i, t in enumerate(ts):
        first = t.clone()
        fm.bcast_(first, root_rank=0)
        assert torch.equal(first, t), f"{what}: tensor {i} differs from rank 0's"


def same_as_pack(results, what):
    """Every in-place path's tensors equal the pack path's, bit for bit."""
    for mode in MODES[:-1]:
        for a, b in zip(results[mode], results["pack"]):
            assert torch.equal(a, b), f"{what}: {mode} and the pack path differ"


def run_grouped(ts, op, mode, fn=None, **kw):
    """One grouped call on `ts` through the chosen path; returns how many ring calls it made."""
    before = C.ring_calls()
    with path(mode, **kw):
        (fn or (lambda x: fm.grouped_allreduce_(x, op=op)))(ts)
    return C.ring_calls() - before


def ring_expected(mode, groups):
    """Ring calls a grouped call makes: one per dtype of two or more tensors, none on one rank
    or on the pack path."""
    return groups if mode != "pack" and world() > 1 else 0


def case_every_ring_dtype_and_op_matches_closed_form_and_pack_path():
    n, r = world(), rank()
    for dtype in RING_DTYPES:
        for op in OPS:
            if op == "average" and not dtype.is_floating_point:
                continue  # integer averages keep the pack path (checked below)
            got = {}
            for mode in MODES:
                ts = [values(r, j, k, dtype) for j, k in enumerate(SIZES)]
                calls = run_grouped(ts, op, mode)
                assert calls == ring_expected(mode, 1), (dtype, op, mode, calls)
                for j, (t, k) in enumerate(zip(ts, SIZES)):
                    want = expected(op, j, k, dtype, n)
                    assert torch.equal(t, want), (dtype, op, mode, j, t.tolist(), want.tolist())
                same_on_every_rank(ts, f"{dtype} {op} {mode}")
                got[mode] = ts
            same_as_pack(got, f"{dtype} {op}")


def case_segments_of_every_size_including_one_element():
    # Segment sizes from one element to more than the whole chunk: the same closed forms.
    n, r = world(), rank()
    for seg in (4, 8, 20, 4096, 1 << 20):
        ts = [values(r, j, k, torch.float32) for j, k in enumerate(SIZES)]
        assert run_grouped(ts, "sum", "datatypes", segment_bytes=seg) == ring_expected(
            "datatypes", 1
        )
        for j, (t, k) in enumerate(zip(ts, SIZES)):
            assert torch.equal(t, expected("sum", j, k, torch.float32, n)), (seg, j)


def case_inexact_average_is_identical_on_every_rank():
    n, r = world(), rank()
    g = torch.Generator().manual_seed(1000 + r)
    for dtype, mode in [(d, m) for d in (torch.float32, torch.float64) for m in MODES[:-1]]:
        ts = [torch.rand(k, generator=g, dtype=dtype) * 3 for k in SIZES]
        mine = [t.to(torch.float64, copy=True) for t in ts]
        assert run_grouped(ts, "average", mode) == ring_expected(mode, 1)
        same_on_every_rank(ts, f"average {dtype} {mode}")
        for t, m in zip(ts, fm.grouped_allreduce_(mine, op="sum")):
            assert torch.allclose(t.to(torch.float64), m / n, rtol=1e-6, atol=1e-6), dtype


def case_dtypes_the_ring_leaves_to_the_pack_path():
    # float16, bfloat16 (reduced in fp32 by the pack path) and integer averages: no ring call,
    # the same closed forms.
    n, r = world(), rank()
    for dtype, op in [(torch.float16, "sum"), (torch.bfloat16, "max"), (torch.int32, "average"),
                      (torch.int64, "average"), (torch.float16, "average")]:  # fmt: skip
        ts = [values(r, j, k, dtype) for j, k in enumerate(SIZES)]
        assert run_grouped(ts, op, "shared") == 0, (dtype, op)
        for j, (t, k) in enumerate(zip(ts, SIZES)):
            assert torch.equal(t, expected(op, j, k, dtype, n)), (dtype, op, j)


def case_mixed_dtypes_one_ring_call_per_dtype():
    n, r = world(), rank()
    dtypes = [torch.float32, torch.int64, torch.float64, torch.float32, torch.int64,
              torch.float64, torch.float16, torch.float32]  # fmt: skip
    sizes = [7, 3, 1001, 64, 5, 2, 9, 250]
    for mode in MODES:
        ts = [values(r, j, k, d) for j, (k, d) in enumerate(zip(sizes, dtypes))]
        # float32, int64, float64 groups are reduced in place; the one float16 tensor is not
        assert run_grouped(ts, "sum", mode) == ring_expected(mode, 3), mode
        for j, (t, k, d) in enumerate(zip(ts, sizes, dtypes)):
            assert torch.equal(t, expected("sum", j, k, d, n)), (mode, j, d)


def case_non_contiguous_and_overlapping_tensors():
    # A transposed matrix, a strided slice, the same tensor twice and two overlapping views of
    # one buffer: each reduced once, as the pack path does.
    n, r = world(), rank()
    results = {}
    for mode in MODES:
        base = values(r, 0, 40, torch.float32)
        mat = values(r, 1, 35, torch.float32).reshape(5, 7).t()  # not contiguous
        strided = values(r, 2, 30, torch.float32)[::3]  # not contiguous
        twice = values(r, 3, 17, torch.float32)
        ts = [mat, base[0:20], twice, strided, base[10:40], twice, values(r, 4, 9, torch.float32)]
        want_mat = expected("sum", 1, 35, torch.float32, n).reshape(5, 7).t()
        want_base = expected("sum", 0, 40, torch.float32, n)
        assert run_grouped(ts, "sum", mode) == ring_expected(mode, 1), mode
        assert torch.equal(mat, want_mat), mode
        assert torch.equal(base, want_base), (mode, base.tolist(), want_base.tolist())
        assert torch.equal(strided, expected("sum", 2, 30, torch.float32, n)[::3]), mode
        assert torch.equal(twice, expected("sum", 3, 17, torch.float32, n)), mode
        assert torch.equal(ts[6], expected("sum", 4, 9, torch.float32, n)), mode
        results[mode] = ts
    same_as_pack(results, "mixed list")


def case_lists_past_the_shared_window_move_in_rounds():
    # 5.2 MB of float32 and 10 MB of float64: more than one 4 MiB window's round, rounds that
    # end inside a tensor; the same closed forms through every path.
    n, r = world(), rank()
    for dtype, sizes in [(torch.float32, [700_001, 3, 600_000]), (torch.float64, [5, 1_250_007])]:
        for mode in MODES:
            ts = [values(r, j, k, dtype) for j, k in enumerate(sizes)]
            assert run_grouped(ts, "max", mode, segment_bytes=1 << 20) == ring_expected(mode, 1)
            for j, (t, k) in enumerate(zip(ts, sizes)):
                assert torch.equal(t, expected("max", j, k, dtype, n)), (dtype, mode, j)


def case_version_counters_move():
    # Autograd must see the in-place write, as for any in-place op.
    r = rank()
    ts = [values(r, j, k, torch.float32) for j, k in enumerate(SIZES)]
    before = [t._version for t in ts]
    run_grouped(ts, "sum", "shared")
    moved = [t._version > v for t, v in zip(ts, before)]
    assert all(m for m, k in zip(moved, SIZES) if k > 0), moved


def case_defaults_take_the_ring_for_the_benchmark_list():
    # 1000 x 1024 float32 (bench_collectives --op grouped): 4 MB, past list_min_bytes' default.
    n, r = world(), rank()
    o = C.ring_options()  # the defaults, unless FLUXMPI_RING_MIN_BYTES is set
    ts = [torch.full((1024,), float(r + j % 3)) for j in range(1000)]
    before = C.ring_calls()
    fm.grouped_allreduce_(ts)
    on = o.enabled and n > 1 and 4096 * 1000 >= o.list_min_bytes
    assert C.ring_calls() - before == int(on), C.ring_calls() - before
    for j, t in enumerate(ts):
        assert torch.equal(t, torch.full((1024,), float(n * (n - 1) // 2 + n * (j % 3)))), j


def case_horovod_grouped_allreduce_takes_the_ring():
    n, r = world(), rank()
    ts = [values(r, j, k, torch.float64) for j, k in enumerate(SIZES)]
    calls = run_grouped(
        ts, "average", "shared", fn=lambda x: hvd.grouped_allreduce_(x, op=hvd.Average)
    )
    assert calls == ring_expected("shared", 1), calls
    for j, (t, k) in enumerate(zip(ts, SIZES)):
        assert torch.equal(t, expected("average", j, k, torch.float64, n)), j


def case_list_min_bytes_is_checked_and_round_trips():
    saved = C.ring_options()
    try:
        o = C.RingOptions(list_min_bytes=12345, list_shared_memory=False)
        C.set_ring_options(o)
        assert C.ring_options() == o and not C.ring_options().list_shared_memory
        assert "list_min_bytes=12345, list_shared_memory=False" in repr(C.ring_options())
        try:
            C.set_ring_options(C.RingOptions(list_min_bytes=-1))
        except ValueError as e:
            assert "list_min_bytes=-1" in str(e), str(e)
        else:
            raise AssertionError("list_min_bytes=-1 was accepted")
    finally:
        C.set_ring_options(saved)


if __name__ == "__main__":
    run_cases(globals())
