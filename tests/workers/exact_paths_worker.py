"""DistributedOptimizer(deterministic=True) at one backward pass a step: the sharded float
path (fluxmpi_py/training/_exact_shards.py) gives the same bits as the int64 path
(training/exact_sum.py), and as one process running the ranks' micro-batches in turn (a group
of one rank, W passes a step, through the int64 path). Run at 1, 2 and 3 ranks
(tests/test_reproducible.py): gradients spread over many exponents, exact ties on the grid,
four dtypes, buckets small enough that shards cross parameters, parameters without a gradient
on some or all ranks, a NaN, and an overflow that raises on every rank; so does a rank
in another collective. The sharded path's two ways between ranks (a shared-memory window on
one host, else an alltoall and an allgather) and its owner's two passes (float64 blocks where
they are exact, else int64) give the same bits too, and backward's own gradient tensors are
reduced where they lie.
"""

import contextlib
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402
from fluxmpi_py.training import _exact_shards  # noqa: E402

# (numel, dtype): odd sizes, one value, sizes below the world size, dtype changes
SHAPES = [(37, torch.float32), (1, torch.float32), (300, torch.float64), (2, torch.float16),
          (129, torch.bfloat16), (61, torch.float32), (5, torch.float64), (400, torch.float32)]  # fmt: skip
UNUSED_ON_ONE_RANK, UNUSED_EVERYWHERE = 1, 5  # indexes into SHAPES


def gradient(numel, dtype, rank, step, top):
    """A rank's gradient of one step: many exponents below 2**top, and at the first step
    exact ties of the grid's rounding (odd multiples of half the quantum)."""
    gen = torch.Generator().manual_seed(1000 * step + 10 * rank + numel)
    exps = torch.randint(top - 30, top, (numel,), generator=gen)
    g = (torch.rand(numel, generator=gen, dtype=torch.float64) * 2 - 1) * torch.pow(2.0, exps)
    g[0] = math.ldexp(-1.5 if rank % 2 else 1.5, top - 1)  # the largest |g|: the next grid
    if step == 0:  # q = 2**(16 - P) at the first step, P = 62 - bit_length(W - 1)
        bits = 62 - (fm.total_workers() - 1).bit_length()
        ties = torch.randint(-50, 50, (numel,), generator=gen).double() * 2 + 1
        g[1::3] = (ties * math.ldexp(1.0, 16 - bits - 1))[1::3]
    return g.to(dtype)


@contextlib.contextmanager
def sharded_way(shared=True, float64=True):
    """The owner's reduction through the shared-memory window (shared) or an alltoall and an
    allgather; the owner's blocks in float64 where exact (float64) or all in int64. Set alike
    on every rank. Yields the calls through the window and the blocks summed in float64 and in
    int64 while inside: a list filled at the exit."""
    saved, o = C.ring_options(), C.ring_options()
    o.list_shared_memory = shared
    C.set_ring_options(o)
    was = C.set_exact_float64_pass(float64)
    before = (C.shared_owner_parts_calls(), *C.exact_sum_block_counts())
    counts: list[int] = []
    try:
        yield counts
    finally:
        C.set_ring_options(saved)
        C.set_exact_float64_pass(was)
        after = (C.shared_owner_parts_calls(), *C.exact_sum_block_counts())
        counts.extend(a - b for a, b in zip(after, before))


def build(shards, group=None, passes=1, shapes=SHAPES):
    _exact_shards.SHARDED = shards
    most = _exact_shards.SHARDED_MAX_PASSES
    _exact_shards.SHARDED_MAX_PASSES = 8  # the sharded path at any k the cases use
    try:
        params = [torch.nn.Parameter(torch.zeros(n, dtype=d)) for n, d in shapes]
        opt = fm.DistributedOptimizer(
            torch.optim.SGD(params, lr=0.0),
            named_parameters=[(f"p{i}", p) for i, p in enumerate(params)],
            deterministic=True,
            backward_passes_per_step=passes,
            bucket_cap_mb=700 / 2**20,  # 700 bytes: several buckets, shards across parameters
            first_bucket_cap_mb=200 / 2**20,  # and a smaller first one per dtype (issue 48)
            direct_min_bytes=2400,  # 300 float64 values go alone (at one pass a step)
            check_every=0,
            group=group,
        )
    finally:
        _exact_shards.SHARDED = True
        _exact_shards.SHARDED_MAX_PASSES = most
    return params, opt


def backward(params, rank, step, top, poison=None):
    """loss = sum of p * g over the parameters (but those left out on this rank), backward;
    ``poison``: {parameter: value} put in the first element of its g."""
    loss = torch.zeros((), dtype=torch.float64)
    for i, p in enumerate(params):
        if i == UNUSED_EVERYWHERE or (i == UNUSED_ON_ONE_RANK and rank == 0):
            continue
        g = gradient(p.numel(), p.dtype, rank, step, top)
        if poison and i in poison:
            g[0] = poison[i]
        loss = loss + (p * g).sum().double()  # d loss / d p = g, exactly
    loss.backward()


def case_sharded_int64_and_one_process_give_the_same_bits():
    rank, world = fm.local_rank(), fm.total_workers()
    solo = [fm.new_group([r]) for r in range(world)]
    sharded, int64 = build(True), build(False)
    one = build(False, group=solo[rank], passes=world)  # all ranks' micro-batches, in turn
    assert type(sharded[1]._exact).__name__ == "ShardedExactSum"
    assert type(int64[1]._exact).__name__ == "ExactGradientSum"
    assert len(sharded[1]._exact.buckets) >= 4
    counts = [0, 0, 0]  # calls through the window, float64 blocks, int64 blocks
    for step, top in enumerate((3, 3, 12, -2, 9)):  # T grows 16 bits a step at most
        for params, opt in (sharded, int64):
            with sharded_way() as moved:
                backward(params, rank, step, top)
                opt.synchronize()
            if opt is sharded[1]:
                counts = [a + b for a, b in zip(counts, moved)]
        for r in range(world):
            backward(one[0], r, step, top)
        one[1].synchronize()
        assert sharded[1].exact_grid() == int64[1].exact_grid() == one[1].exact_grid()
        for i, (a, b, c) in enumerate(zip(sharded[0], int64[0], one[0])):
            if i == UNUSED_EVERYWHERE or (i == UNUSED_ON_ONE_RANK and world == 1):
                assert a.grad is None and b.grad is None and c.grad is None
                continue
            assert a.grad is not None and b.grad is not None and c.grad is not None
            assert torch.equal(a.grad, b.grad), (step, i, (a.grad != b.grad).sum())
            assert torch.equal(a.grad, c.grad), (step, i, (a.grad != c.grad).sum())
        for _, opt in (sharded, int64, one):
            with opt.skip_synchronize():
                opt.step()
    # one window call a bucket a step on one host; step 2's values reach 2**54 on the grid
    # (T was 3 + 16, the values are near 2**12): the owner's int64 blocks, float64 elsewhere
    assert counts[0] == (5 * len(sharded[1]._exact.buckets) if world > 1 else 0), counts
    assert counts[1] > 0 and counts[2] > 0, counts


# BIG's bucket (3 M float32 values, its own: past the cap of 700 bytes) takes several rounds
# of the window (4 MiB a rank), and its shards' segments cross the rounds' edges
BIG = (3_000_001, torch.float32)


def case_the_window_the_alltoall_and_both_owner_passes_give_the_same_bits():
    rank, world = fm.local_rank(), fm.total_workers()
    shapes = [*SHAPES, BIG]
    ways = {
        "window": {},
        "alltoall": {"shared": False},
        "window, int64 only": {"float64": False},
        "alltoall, int64 only": {"shared": False, "float64": False},
    }
    runs = {way: build(True, shapes=shapes) for way in ways}
    int64 = build(False, shapes=shapes)
    for step, top in enumerate((3, 3, 12, -2, 9)):
        backward(int64[0], rank, step, top)
        int64[1].synchronize()
        for way, (params, opt) in runs.items():
            with sharded_way(**ways[way]) as moved:
                backward(params, rank, step, top)
                opt.synchronize()
            window = world > 1 and "alltoall" not in way
            assert (moved[0] > 0) == window, (way, moved)
            assert (moved[1] > 0) == ("int64" not in way), (way, moved)
            for i, (a, b) in enumerate(zip(params, int64[0])):
                assert (a.grad is None) == (b.grad is None), (way, step, i)
                if a.grad is not None:
                    assert torch.equal(a.grad, b.grad), (way, step, i, (a.grad != b.grad).sum())
        for _, opt in (*runs.values(), int64):
            with opt.skip_synchronize():
                opt.step()


def micro_batches(params, rank, k, step, top):
    """This rank's k backward passes of a step: micro-batches rank * k ... rank * k + k - 1."""
    for j in range(k):
        backward(params, rank * k + j, step, top)


def case_k_passes_sharded_int64_and_one_process_give_the_same_bits():
    """k = 2, 3 and 4 passes a step: the k passes' values moved in one exchange at the last pass
    and summed by their owners at once (issue 48), the bits of the int64 path and of one
    process running all W * k micro-batches in turn; some parameters lack a gradient in some
    passes (micro-batch 0 leaves one out)."""
    rank, world = fm.local_rank(), fm.total_workers()
    solo = [fm.new_group([r]) for r in range(world)]
    for k in (2, 3, 4):
        sharded, int64 = build(True, passes=k), build(False, passes=k)
        one = build(False, group=solo[rank], passes=world * k)
        assert type(sharded[1]._exact).__name__ == "ShardedExactSum"
        assert type(int64[1]._exact).__name__ == "ExactGradientSum"
        counts = [0, 0, 0]  # calls through the window, float64 blocks, int64 blocks
        for step, top in enumerate((3, 3, 12, -2, 9)):
            with sharded_way() as moved:
                calls = C.shared_owner_parts_calls()
                for j in range(k - 1):
                    backward(sharded[0], rank * k + j, step, top)
                assert sharded[1]._exact.requests == [], "a pass before the last moved a bucket"
                # their gradients are copied into the buckets' buffers, not held (fresh memory
                # held across passes was paged in anew every step: docs/measurements.md)
                kept = sharded[1]._exact.kept[: k - 1]
                assert all(t is None for pass_ in kept for t in pass_), "held a gradient"
                assert C.shared_owner_parts_calls() == calls
                backward(sharded[0], rank * k + k - 1, step, top)
                sharded[1].synchronize()
            counts = [a + b for a, b in zip(counts, moved)]
            micro_batches(int64[0], rank, k, step, top)
            int64[1].synchronize()
            for r in range(world):
                micro_batches(one[0], r, k, step, top)
            one[1].synchronize()
            assert sharded[1].exact_grid() == int64[1].exact_grid() == one[1].exact_grid()
            for i, (a, b, c) in enumerate(zip(sharded[0], int64[0], one[0])):
                if i == UNUSED_EVERYWHERE:
                    assert a.grad is None and b.grad is None and c.grad is None
                    continue
                assert a.grad is not None and b.grad is not None and c.grad is not None
                assert torch.equal(a.grad, b.grad), (k, step, i, (a.grad != b.grad).sum())
                assert torch.equal(a.grad, c.grad), (k, step, i, (a.grad != c.grad).sum())
            for _, opt in (sharded, int64, one):
                with opt.skip_synchronize():
                    opt.step()
        # one window call a bucket a step on one host, carrying all k passes (none in the
        # passes before the last); float64 blocks, and int64 ones where step 2's values
        # outgrow them
        buckets = len(sharded[1]._exact.buckets)
        assert counts[0] == (5 * buckets if world > 1 else 0), counts
        assert counts[1] > 0 and counts[2] > 0, counts


def case_k_up_to_the_limit_takes_the_sharded_path_by_default():
    """Up to SHARDED_MAX_PASSES passes a step (every rank alike) the sharded path, one more
    the int64 path; both give the bits above."""
    most = _exact_shards.SHARDED_MAX_PASSES
    assert most >= 2
    for k, kind in (
        (1, "ShardedExactSum"),
        (most, "ShardedExactSum"),
        (most + 1, "ExactGradientSum"),
    ):
        p = torch.nn.Parameter(torch.zeros(5))
        opt = fm.DistributedOptimizer(
            torch.optim.SGD([p], lr=0.0),
            deterministic=True,
            backward_passes_per_step=k,
            check_every=0,
        )
        assert type(opt._exact).__name__ == kind, (k, type(opt._exact).__name__)


def case_k_passes_the_window_the_alltoall_and_both_owner_passes_give_the_same_bits():
    """k = 2 with a bucket that takes several rounds of the window (the owner's blocks cut at
    the rounds' edges), each way and owner pass against the int64 path."""
    rank = fm.local_rank()
    shapes = [*SHAPES, BIG]
    ways = {
        "window": {},
        "alltoall": {"shared": False},
        "window, int64 only": {"float64": False},
    }
    runs = {way: build(True, shapes=shapes, passes=2) for way in ways}
    int64 = build(False, shapes=shapes, passes=2)
    for step, top in enumerate((3, 12, -2)):
        micro_batches(int64[0], rank, 2, step, top)
        int64[1].synchronize()
        for way, (params, opt) in runs.items():
            with sharded_way(**ways[way]):
                micro_batches(params, rank, 2, step, top)
                opt.synchronize()
            for i, (a, b) in enumerate(zip(params, int64[0])):
                assert (a.grad is None) == (b.grad is None), (way, step, i)
                if a.grad is not None:
                    assert torch.equal(a.grad, b.grad), (way, step, i, (a.grad != b.grad).sum())
        for _, opt in (*runs.values(), int64):
            with opt.skip_synchronize():
                opt.step()


def case_the_gradients_are_reduced_where_they_lie():
    """backward's own gradient tensors are the bucket's pieces: p.grad after synchronize() is
    the tensor backward made (outside the bucket's flat buffer), reduced in place; a gradient
    that is a view of a larger tensor is copied into the bucket instead."""
    rank = fm.local_rank()
    params, opt = build(True)
    made = {}  # where backward's gradients lie (holding them would make AccumulateGrad copy)
    for i, p in enumerate(params):
        p.register_hook(lambda g, i=i: made.__setitem__(i, g.data_ptr()))
    backward(params, rank, 1, 3)
    opt.synchronize()
    flats = opt._exact.flats
    inside = lambda t: any(  # noqa: E731
        f.data_ptr() <= t.data_ptr() < f.data_ptr() + f.numel() * f.element_size() for f in flats
    )
    for i, p in enumerate(params):
        if p.grad is None:
            continue
        if i not in made:  # none on this rank: the bucket's zeros, reduced there
            assert inside(p.grad) and rank == 0 and i == UNUSED_ON_ONE_RANK, i
            continue
        assert not inside(p.grad), i
        assert p.grad.data_ptr() == made[i], i
    with opt.skip_synchronize():
        opt.step()
    exact = opt._exact
    at = next(k for k, q in enumerate(exact.order) if q is params[0])  # p0, in backward order
    wide = torch.ones(2 * SHAPES[0][0])  # every other value of a larger tensor
    exact._take(at, wide[::2])
    assert exact.kept[0][at] is None and inside(exact._view(at))
    assert torch.equal(exact._view(at), wide[::2])
    exact._reset_step()


def case_nan_and_overflow_on_one_rank():
    rank, world = fm.local_rank(), fm.total_workers()
    last = world - 1
    ways = ((False, {}), (True, {}), (True, {"shared": False}), (True, {"float64": False}))
    for shards, way in ways:
        params, opt = build(shards)
        # a NaN on the first rank and on the last: a MAX reduction may drop a NaN
        poison = {7: math.nan} if rank == 0 else {}
        with sharded_way(**way):
            backward(params, rank, 1, 3, poison=poison | ({2: math.nan} if rank == last else {}))
            opt.synchronize()
        for i in (2, 7):
            assert bool(params[i].grad.isnan().all()), (shards, i, params[i].grad)
        assert not bool(params[0].grad.isnan().any())
        with opt.skip_synchronize():
            opt.step()
        top = opt.exact_grid()["p0"][0]
        with sharded_way(**way):
            backward(params, rank, 2, 3, poison={0: 1e6} if rank == last else None)
            raises(fm.GridOverflowError, opt.step, "p0", "|g| = 1e+06", f"2**{top}")
        backward(params, rank, 2, 3, poison={0: 1e6} if rank == last else None)
        opt.synchronize()  # the grid now covers it
        assert opt.exact_grid()["p0"][0] == 20 + 16 and float(params[0].grad.abs().max()) > 1e5
        with opt.skip_synchronize():
            opt.step()


def case_a_rank_in_another_collective_raises_on_every_rank():
    """The ranks agree on each bucket before its data moves: where the first rank calls
    another collective meanwhile, every rank raises, none waits."""
    if fm.total_workers() == 1:
        return
    p = torch.nn.Parameter(torch.zeros(5))
    opt = fm.DistributedOptimizer(torch.optim.SGD([p], lr=0.0), deterministic=True, check_every=0)
    if fm.local_rank() == 0:
        call = lambda: fm.allreduce_(torch.zeros(3))  # noqa: E731
    else:
        p.sum().backward()
        call = opt.step
    raises(RuntimeError, call, "different calls", "allreduce_()", "deterministic=True) (bucket 1")


if __name__ == "__main__":
    run_cases(globals())
