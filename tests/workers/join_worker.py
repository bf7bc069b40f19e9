"""fluxmpi_py.Join with DistributedOptimizer on uneven inputs, against closed forms: rank r has
r + 1 fewer batches than a full shard; no rank hangs, every rank ends with the same weights,
and the weights are the closed-form sum of the active ranks' averaged gradients.

Run by tests/test_join.py under mpiexec at 1, 2 and 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

BATCHES = 5


def _data():
    torch.manual_seed(7)
    return torch.randn(BATCHES, fm.total_workers(), 3)


def _train(data, opt_kwargs=None, **join_kwargs):
    """Linear loss (w * x).sum(): the gradient is x, so SGD(lr=1) ends at minus the sum of the
    applied gradients. Rank r trains on BATCHES - (r + 1) batches."""
    r = fm.local_rank()
    w = torch.nn.Parameter(torch.zeros(3))
    opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), **(opt_kwargs or {}))
    with fm.Join([opt], **join_kwargs) as j:
        for s in range(BATCHES - (r + 1)):
            (w * data[s, r]).sum().backward()
            opt.step()
            opt.zero_grad()
    return w.detach(), j.last_joined_rank


def _active(s, n):
    return [r for r in range(n) if s < BATCHES - (r + 1)]


def case_join_averages_over_initial_world_size():
    n = fm.total_workers()
    data = _data()
    w, last = _train(data)
    want = -sum(data[s, r] for s in range(BATCHES) for r in _active(s, n)) / n
    assert torch.allclose(w, want, atol=1e-6), (w, want)
    assert last == 0  # rank 0 has the most batches
    ws = fm.allgather(w.unsqueeze(0))
    assert torch.equal(ws, w.expand(n, 3))  # the joined ranks applied the same steps


def case_join_divides_by_active_ranks():
    n = fm.total_workers()
    data = _data()
    w, last = _train(data, divide_by_initial_world_size=False)
    want = torch.zeros(3)
    for s in range(BATCHES):
        act = _active(s, n)
        if act:
            want -= sum(data[s, r] for r in act) / len(act)
    assert torch.allclose(w, want, atol=1e-6), (w, want)
    assert last == 0


def case_join_with_accumulation_and_fused_buckets():
    n = fm.total_workers()
    data = _data()
    w, _ = _train(data, opt_kwargs={"direct_min_bytes": None, "compression": None})
    want = -sum(data[s, r] for s in range(BATCHES) for r in _active(s, n)) / n
    assert torch.allclose(w, want, atol=1e-6)


def case_join_then_normal_steps_pay_nothing():
    # After the block, the optimizer is out of the join: its steps are plain again and the
    # ranks may issue other collectives.
    n = fm.total_workers()
    w = torch.nn.Parameter(torch.zeros(1))
    opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))
    with fm.Join([opt]):
        pass
    assert opt._join is None
    (w * (fm.local_rank() + 1)).sum().backward()
    opt.step()
    assert torch.allclose(w, torch.tensor([-(n + 1) / 2]))
    assert fm.allreduce_(torch.ones(1)).item() == n


def case_other_collective_while_joined_raises_on_every_rank():
    n, r = fm.total_workers(), fm.local_rank()
    if n == 1:
        return
    w = torch.nn.Parameter(torch.zeros(2))
    opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))

    def run():
        with fm.Join([opt]):
            if r != n - 1:  # the last rank has no data and joins at once
                (w * 1.0).sum().backward()
                opt.step()
                fm.allreduce_(torch.ones(4), "sum")  # not a step: meets the joined rank's round

    if r == n - 1:
        raises(RuntimeError, run, "had joined", "only those steps")
    else:
        try:
            run()
        except (ValueError, RuntimeError) as e:
            assert any("fluxmpi_py.Join" in note for note in e.__notes__), e
        else:
            raise AssertionError("the collective against a joined rank did not raise")
    assert opt._join is None
    fm.barrier()  # the ranks are in step again


def case_join_rejects_what_it_cannot_shadow():
    raises(TypeError, lambda: fm.Join([torch.optim.SGD([torch.zeros(1, requires_grad=True)], 1)]),
           "joinables[0]")  # fmt: skip
    w = torch.nn.Parameter(torch.zeros(1))
    opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))
    with fm.Join([opt]):
        raises(ValueError, lambda: opt.step(lambda: w.sum()), "closure")
        raises(ValueError, lambda: fm.Join([opt]).__enter__(), "already in a join")


def case_join_on_a_group_runs_among_its_members():
    # Optimizers made on a group: only the members enter the Join (at 3 ranks, rank 1 trains
    # alone meanwhile), its rounds and waits run on the group, the average divides by the
    # group's size, and last_joined_rank is a world rank.
    n, r = fm.total_workers(), fm.local_rank()
    members = [0, n - 1] if n > 2 else list(range(n))
    pair = fm.new_group(members)
    data = _data()
    if r in members:
        m, me = len(members), members.index(r)
        for divide in (True, False):
            w = torch.nn.Parameter(torch.zeros(3))
            opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), group=pair)
            with fm.Join([opt], divide_by_initial_world_size=divide) as j:
                for s in range(BATCHES - (me + 1)):  # group rank k has k + 1 batches fewer
                    (w * data[s, r]).sum().backward()
                    opt.step()
                    opt.zero_grad()
            want = torch.zeros(3)
            for s in range(BATCHES):
                act = [members[k] for k in range(m) if s < BATCHES - (k + 1)]
                if act:
                    want -= sum(data[s, k] for k in act) / (m if divide else len(act))
            assert torch.allclose(w.detach(), want, atol=1e-6), (divide, w, want)
            assert j.last_joined_rank == members[0], j.last_joined_rank
    else:
        w = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([w], lr=1.0)
        for s in range(BATCHES):
            (w * data[s, r]).sum().backward()
            opt.step()
    assert fm.allreduce_(torch.ones(1)).item() == n  # the world is in step again


def case_join_refuses_optimizers_of_different_groups():
    n = fm.total_workers()
    pair = fm.new_group(range(n))
    a = fm.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    b = fm.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                                group=pair)  # fmt: skip
    raises(ValueError, lambda: fm.Join([a, b]), "different groups", "the world", "one Join")


def case_first_step_check_with_a_rank_that_has_no_data():
    # the last rank joins before any step: its shadow of the first step takes part in the
    # first-step parameter check, so a good start trains and a bad one raises on every rank
    n, r = fm.total_workers(), fm.local_rank()
    data = _data()

    def run(start):
        w = torch.nn.Parameter(start.clone())
        opt = fm.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))
        with fm.Join([opt]):
            for s in range(0 if r == n - 1 and n > 1 else 2):
                (w * data[s, r]).sum().backward()
                opt.step()
                opt.zero_grad()
        return w.detach()

    w = run(torch.zeros(3))
    assert fm.allgather_object(w.tolist()) == [w.tolist()] * n
    if n > 1:
        raises(ValueError, lambda: run(torch.full((3,), float(r))), "the same parameters")
    assert fm.allreduce_(torch.ones(1)).item() == n  # in step again


if __name__ == "__main__":
    run_cases(globals())
