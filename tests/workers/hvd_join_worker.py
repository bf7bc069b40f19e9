"""hvd.join() against closed forms: what a joined rank costs the others (nothing while no
rank has joined: one agreement per allreduce), who is the last rank to join, and what the
joined ranks do with the others' differentiable allreduces, bad calls and mismatched calls.

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


def case_bad_call_while_joined_raises_on_the_active_ranks_only():
    # A local error of the active ranks takes the agreement's slow path, which the joined
    # rank takes part in (it keeps waiting); the message names the active ranks only.
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        return
    if r == n - 1:
        assert hvd.join() == n - 2
        return
    bad = torch.ones(2, dtype=torch.complex64)
    msg = raises(TypeError, lambda: hvd.allreduce_(bad), "complex64", "rank 0")
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


if __name__ == "__main__":
    run_cases(globals())
