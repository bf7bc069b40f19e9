"""hvd.join() against closed forms: what a joined rank costs the others (nothing while no
rank has joined: one agreement per allreduce), who is the last rank to join, and what the
joined ranks do with the others' differentiable allreduces, bad calls and mismatched calls,
and on process sets: a joined member reduces zeros with the set's allreduces and shadows its
DistributedOptimizer steps while the others run world calls (3 ranks; a set of every rank at 2).

Run by tests/test_join.py under mpiexec at 1, 2 and 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py._C as C  # noqa: E402
import fluxmpi_py.horovod as hvd  # noqa: E402


def case_allreduce_is_one_agreement_while_nobody_joined():
    # Join support rides on the agreement every collective starts with: no extra collective.
    hvd.init()
    n = hvd.size()
    t = torch.ones(4)
    for call in (
        lambda: hvd.allreduce(t, op=hvd.Sum),
        lambda: hvd.allreduce_(t.clone()),
        lambda: hvd.synchronize(hvd.allreduce_async(t)),
        lambda: hvd.grouped_allreduce([t, t.double()]),
    ):
        before = C.world_agreements()
        call()
        assert C.world_agreements() - before == (1 if n > 1 else 0)
    assert hvd.allreduce(t, op=hvd.Sum).tolist() == [float(n)] * 4


def case_named_async_call_made_before_join_takes_part():
    # A named _async call waits to be matched by name; a rank that joins with it still waiting
    # starts it first, as Horovod's had already been submitted: the sum holds every rank's
    # value, and the synchronize after join returns it.
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    t = torch.full((3,), float(r + 1))
    h = hvd.allreduce_async(t, name="before_join", op=hvd.Sum)
    if r == 0:
        hvd.join()
        out = hvd.synchronize(h)
    else:
        out = hvd.synchronize(h)
        hvd.join()
    assert out.tolist() == [n * (n + 1) / 2] * 3, (r, out)


def case_last_to_join_is_the_latest_not_the_highest():
    # Rank 1 (or 0 alone) makes one allreduce more than the others: it joins last, also when
    # a higher rank exists.
    n, r = hvd.size(), hvd.rank()
    late = min(1, n - 1)
    for _ in range(2 if r == late else 1):
        got = hvd.allreduce(torch.ones(2), op=hvd.Sum)
    # the first allreduce had every rank; the second only `late` (the others shadowed it)
    assert got.tolist() == ([1.0] * 2 if r == late and n > 1 else [float(n)] * 2), got
    assert hvd.join() == late


def case_joined_rank_shadows_a_differentiable_allreduce():
    n, r = hvd.size(), hvd.rank()
    if r == 0 and n > 1:
        assert hvd.join() == n - 1
        return
    x = torch.full((3,), 2.0, requires_grad=True)
    out = hvd.allreduce(x, op=hvd.Sum)  # the joined rank 0 gives zeros
    active = n - 1 if n > 1 else 1
    assert out.tolist() == [2.0 * active] * 3
    out.sum().backward()  # the gradient is the same allreduce, shadowed again
    assert x.grad.tolist() == [float(active)] * 3
    assert hvd.join() == n - 1


def case_joined_rank_counts_in_an_integer_average_truncated():
    # Horovod's suite (join_allreduce): the joined rank gives zeros, the average divides by the
    # world size, and an integer average truncates toward zero (-75 / 2 is -37, not -38).
    n, r = hvd.size(), hvd.rank()
    if r == n - 1 and n > 1:
        assert hvd.join() == n - 2
        return
    t = torch.tensor([-75, 75, -1], dtype=torch.int32)
    out = hvd.synchronize(hvd.allreduce_async(t, name="a"))
    active = n - 1 if n > 1 else 1
    assert out.tolist() == [int(v * active * (1.0 / n)) for v in (-75, 75, -1)], out
    assert hvd.join() == (n - 2 if n > 1 else 0)


def case_joined_rank_shadows_a_grouped_allreduce_reduced_in_place():
    # A list of at least RingOptions.list_min_bytes (1 MiB) of float32 is reduced where it
    # lies (shared memory on one host), not packed: the joined rank's zeros must take that
    # path too, or the ranks meet in different collectives.
    n, r = hvd.size(), hvd.rank()
    if r == 0 and n > 1:
        before = C.ring_calls()
        assert hvd.join() == n - 1
        assert C.ring_calls() - before == 2  # both lists shadowed on the in-place path
        return
    active = n - 1 if n > 1 else 1
    for dtype in (torch.float32, torch.float64):
        ts = [torch.full((1000 + i,), float(r + 1), dtype=dtype) for i in range(300)]
        out = hvd.grouped_allreduce(ts, op=hvd.Sum)
        want = float(sum(range(2, n + 1)) if n > 1 else 1)
        assert all(torch.equal(o, torch.full_like(t, want)) for o, t in zip(out, ts)), (
            dtype,
            active,
        )
    assert hvd.join() == n - 1


def case_joined_rank_shadows_a_sum_in_gloo_order():
    # In gloo's order (fluxmpi_py.set_sum_order) a float sum over 3 ranks takes its own ring:
    # the joined rank's zeros must take it too, or the ranks meet in different collectives.
    import fluxmpi_py as fm

    n, r = hvd.size(), hvd.rank()
    fm.set_sum_order("gloo")
    try:
        if r == 0 and n > 1:
            before = C.gloo_order_calls()
            assert hvd.join() == n - 1
            assert C.gloo_order_calls() - before == (1 if n >= 3 else 0)
            return
        got = hvd.allreduce(torch.full((5,), float(r)), op=hvd.Sum)
        assert got.tolist() == [float(sum(range(n)))] * 5, got
        assert hvd.join() == n - 1
    finally:
        fm.set_sum_order("fastest")


def case_bad_call_while_joined_raises_on_the_active_ranks_only():
    # A local error of the active ranks takes the agreement's slow path, which the joined
    # rank takes part in (it keeps waiting); the message names the active ranks only.
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        return
    if r == n - 1:
        assert hvd.join() == n - 2
        return
    bad = torch.ones(2, dtype=torch.uint32)
    msg = raises(TypeError, lambda: hvd.allreduce_(bad), "uint32", "rank 0")
    assert f"rank {n - 1}" not in msg, msg
    if n > 2:  # the active ranks disagree on the shape: every one of them raises
        t = torch.ones(r + 1)
        raises(RuntimeError, lambda: hvd.allreduce(t), "disagree on numel")
    raises(RuntimeError, lambda: hvd.broadcast(torch.ones(1), 0), f"rank {n - 1} has joined")
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n - 1  # still waiting
    hvd.join()


def case_join_round_of_other_optimizers_while_joined():
    # An optimizer step on the active ranks is a round the joined rank shadows, between
    # plain allreduces it shadows too; the weights end equal on every rank.
    n, r = hvd.size(), hvd.rank()
    w = torch.nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))
    if r != 0 or n == 1:
        hvd.allreduce(torch.ones(1))
        (w * 2.0).sum().backward()
        opt.step()
        hvd.allreduce(torch.ones(1))
    last = hvd.join()
    assert last == n - 1
    active = max(n - 1, 1)
    assert torch.allclose(w.detach(), torch.full((2,), -2.0 * active / n)), w
    assert torch.equal(hvd.allgather(w.detach().unsqueeze(0)), w.detach().expand(n, 2))


def _set01():
    """The process set [0, 1]: the global set at 2 ranks (Horovod refuses a duplicate)."""
    return hvd.global_process_set if hvd.size() == 2 else hvd.add_process_set([0, 1])


def _sets_done(*sets):
    """Every rank drops the case's sets, so that later joins see the same registry."""
    for ps in sets:
        hvd.remove_process_set(ps)


def case_set_allreduces_with_a_joined_member():
    # Rank 1 joins; rank 0 reduces on the set [0, 1] in every form (rank 1 adds zeros),
    # rank 2 on the world (ranks 0 and 1 add zeros once rank 0 has joined too).
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        return
    ps = _set01()
    last = 2 if n > 2 else 0  # rank 2 reduces after rank 0 has joined
    if r == 1:
        assert hvd.join() == last
    elif r == 0:
        t = torch.full((3,), 2.0)
        assert hvd.allreduce(t, op=hvd.Sum, process_set=ps).tolist() == [2.0] * 3
        assert hvd.allreduce(t, process_set=ps).tolist() == [1.0] * 3  # average: / set size
        u = t.clone()
        hvd.allreduce_(u, op=hvd.Sum, process_set=ps)
        assert u.tolist() == [2.0] * 3
        h = hvd.allreduce_async(t.double(), op=hvd.Sum, process_set=ps)
        assert hvd.synchronize(h).tolist() == [2.0] * 3
        got = hvd.grouped_allreduce([t, t.double(), torch.ones(5)], op=hvd.Sum, process_set=ps)
        assert [g.tolist() for g in got] == [[2.0] * 3, [2.0] * 3, [1.0] * 5], got
        big = [torch.full((1000 + i,), 2.0) for i in range(300)]  # 1.4 MB: reduced in place
        got = hvd.grouped_allreduce(big, op=hvd.Sum, process_set=ps)
        assert all(torch.equal(g, b) for g, b in zip(got, big)), "in-place list on the set"
        assert hvd.join() == last
    else:
        for _ in range(2):
            assert hvd.allreduce(torch.full((2,), 3.0), op=hvd.Sum).tolist() == [3.0] * 2
        assert hvd.join() == 2
    _sets_done(ps)


def case_set_optimizer_step_with_a_joined_member():
    # A DistributedOptimizer on the set [0, 1]: rank 1 has joined and shadows rank 0's step
    # (zeros, averaged over the set's 2 ranks), so the weights end equal on both.
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        return
    ps = _set01()
    w = torch.nn.Parameter(torch.zeros(2))
    if r in (0, 1):
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), process_set=ps)
    if r == 0:
        for _ in range(2):
            (w * 2.0).sum().backward()
            opt.step()
            opt.zero_grad()
    if r == 2:
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 1.0
    assert hvd.join() == (2 if n > 2 else 0)
    if r in (0, 1):
        assert w.detach().tolist() == [-2.0, -2.0], w  # two steps of -(2 + 0) / 2
        both = hvd.allgather(w.detach().unsqueeze(0), process_set=ps)
        assert torch.equal(both, w.detach().expand(2, 2)), both
    _sets_done(ps)


def case_refused_set_collective_raises_on_the_active_members_only():
    # Rank 2 joins; an allgather on the set [0, 2] raises on rank 0 (naming the joined world
    # rank, the set and the call) while rank 2 keeps waiting; then an allreduce on the set
    # works, and rank 1 (on the world) joins last.
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        return
    ps = hvd.add_process_set([0, 2])
    if r == 2:
        assert hvd.join() == 1
    elif r == 0:
        msg = raises(
            RuntimeError,
            lambda: hvd.allgather(torch.ones(1), process_set=ps),
            "rank 2 has joined",
            "allgather",
            "[0, 2]",
        )
        assert "rank 1" not in msg, msg
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=ps).tolist() == [1.0] * 2
        assert hvd.join() == 1
    else:
        assert hvd.allreduce(torch.full((1,), 5.0), op=hvd.Sum).item() == 5.0
        assert hvd.join() == 1
    _sets_done(ps)


def case_joined_rank_in_two_sets():
    # Rank 1 is in [0, 1] and [1, 2] and joins: ranks 0 and 2 reduce on their sets at the
    # same time (rank 1 waits in both), then on the world together.
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        return
    a, b = hvd.add_process_set([0, 1]), hvd.add_process_set([1, 2])
    if r == 1:
        assert hvd.join() == 2  # ranks 0 and 2 join at the same agreement: the highest
    else:
        mine = a if r == 0 else b
        for _ in range(3):
            got = hvd.allreduce(torch.full((4,), r + 1.0), op=hvd.Sum, process_set=mine)
            assert got.tolist() == [r + 1.0] * 4, got
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [2.0] * 2
        assert hvd.join() == 2
    _sets_done(a, b)


def case_set_step_error_reaches_the_joined_rank():
    # Rank 0 freezes a parameter of the set's optimizer alone: its step raises on both
    # members, the shadowing rank 1 included (on its set's thread). Rank 1 keeps waiting (a
    # set allreduce still works) and its hvd.join() raises that error once all have joined.
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        return
    ps = hvd.add_process_set([0, 1])
    w, v = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    if r < 2:
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w, v], lr=1.0), process_set=ps)
    if r == 1:
        raises(ValueError, hvd.join, "parameters differ across ranks", "requires_grad")
    elif r == 0:
        v.requires_grad_(False)
        w.sum().backward()
        raises(ValueError, opt.step, "parameters differ across ranks")
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item() == 1.0
        assert hvd.join() == 2
    else:
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 1.0
        assert hvd.join() == 2
    _sets_done(ps)


if __name__ == "__main__":
    run_cases(globals())
