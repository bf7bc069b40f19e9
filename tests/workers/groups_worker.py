"""Sub-groups at 3 ranks: collectives on [0, 2] and [1] against closed forms while the other
rank does something else, DistributedOptimizer and synchronize_ on a group, the
DistributedDataContainer's group shards, a non-member's error, and a mismatch inside a group.

Run by tests/test_groups.py under mpiexec at 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

_GROUPS = {}


def groups():
    """[0, 2], [1] and [0, 1, 2], made once (by every rank, in the same order)."""
    if not _GROUPS:
        _GROUPS["pair"] = fm.new_group([2, 0])
        _GROUPS["one"] = fm.new_group([1])
        _GROUPS["all"] = fm.new_group(range(fm.total_workers()))
    return _GROUPS["pair"], _GROUPS["one"], _GROUPS["all"]


def rank():
    return fm.local_rank()


def case_group_properties():
    pair, one, everyone = groups()
    assert pair.ranks == (0, 2) and pair.size == 2, pair
    assert pair.rank == {0: 0, 1: None, 2: 1}[rank()], pair
    assert (0 in pair, 1 in pair, 2 in pair) == (True, False, True)
    assert one.ranks == (1,) and one.rank == (0 if rank() == 1 else None)
    assert everyone.size == 3 and everyone.rank == rank()


def case_collectives_on_a_group_against_closed_forms():
    pair, one, everyone = groups()
    r = rank()
    if r in pair:
        t = fm.allreduce_(torch.tensor([float(r), 1.0]), group=pair)
        assert t.tolist() == [2.0, 2.0], t  # ranks 0 and 2 only
        t = fm.bcast_(torch.full((3,), float(r)), root_rank=1, group=pair)  # group rank 1: 2
        assert t.tolist() == [2.0] * 3, t
        g = fm.allgather(torch.full((r + 1,), float(r)), group=pair)
        assert g.tolist() == [0.0, 2.0, 2.0, 2.0], g
        t = fm.Iallreduce(torch.ones(4), op="sum", group=pair).wait()
        assert t.tolist() == [2.0] * 4, t
        objs = fm.allgather_object({"r": r}, group=pair)
        assert objs == [{"r": 0}, {"r": 2}], objs
        x = torch.full((2,), float(r + 1), requires_grad=True)
        y = fm.allreduce(x, group=pair)
        y.sum().backward()
        assert y.tolist() == [4.0, 4.0] and x.grad.tolist() == [2.0, 2.0], (y, x.grad)
        fm.barrier(group=pair)
    else:
        # Meanwhile rank 1 works on its own group of one, and locally.
        t = fm.allreduce_(torch.tensor([5.0]), group=one)
        assert t.tolist() == [5.0], t
        assert fm.allgather(torch.ones(2), group=one).tolist() == [1.0, 1.0]
    t = fm.allreduce_(torch.tensor([float(r)]), group=everyone)
    assert t.tolist() == [3.0], t
    t = fm.allreduce_(torch.tensor([1.0]))  # the world, after groups
    assert t.tolist() == [3.0], t


def case_row_collectives_on_a_group_with_group_roots():
    # Roots, ranks and splits are the group's: on [2, 0], rank 2 is group rank 1.
    pair, _, _ = groups()
    r = rank()
    if r not in pair:
        return
    me = pair.rank
    g = fm.gather(torch.full((1,), float(r)), root_rank=1, group=pair)
    assert (g.tolist() == [0.0, 2.0]) if me == 1 else g is None, g
    s = fm.scatter(torch.arange(4.0) + 10 * r, root_rank=1, group=pair)
    assert s.tolist() == [20.0 + 2 * me, 21.0 + 2 * me], s  # rank 2's values
    rs = fm.reduce_scatter(torch.arange(4.0) * (r + 1), op="sum", group=pair)
    assert rs.tolist() == [4.0 * (2 * me), 4.0 * (2 * me + 1)], rs  # (1 + 3) * arange
    a = fm.alltoall(torch.tensor([10.0 * r, 10.0 * r + 1]), group=pair)
    assert a.tolist() == [0.0 + me, 20.0 + me], a
    t = fm.reduce_(torch.full((2,), float(r + 1)), root_rank=1, group=pair)
    assert t.tolist() == ([4.0, 4.0] if me == 1 else [1.0, 1.0]), t


def _data(r):
    g = torch.Generator().manual_seed(100 + r)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def case_distributed_optimizer_on_a_group_equals_one_process():
    pair, _, _ = groups()
    r = rank()
    if r not in pair:
        # A non-member may not build it; it raises here, before any communication.
        raises(ValueError, lambda: _optimizer(pair), "rank 1", "[0, 2]", "DistributedOptimizer")
        return
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), group=pair)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    both = [_data(m) for m in pair.ranks]
    xs, ys = torch.cat([x for x, _ in both]), torch.cat([y for _, y in both])
    x, y = _data(r)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(xs), ys).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _optimizer(group):
    model = torch.nn.Linear(4, 1)
    return fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), group=group)


def _state(seed):
    """A model with a parameter above direct_bytes (broadcast alone) and small ones (packed),
    an optimizer whose state only some ranks have, and plain values: all from `seed`."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 40000))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if seed % 3 == 2:  # these seeds have taken a step: Adam state exists only there
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    return {"model": model, "opt": opt, "step": seed, "w": torch.full((5,), float(seed))}


def _values(state):
    return (
        [t.detach().clone() for t in state["model"].state_dict().values()],
        state["opt"].state_dict(),
        state["step"],
        state["w"].clone(),
    )


def _assert_same(got, want):
    for a, b in zip(got[0], want[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert got[1]["param_groups"] == want[1]["param_groups"]
    assert sorted(got[1]["state"]) == sorted(want[1]["state"]), (got[1]["state"], want[1])
    for k, st in want[1]["state"].items():
        for name, v in st.items():
            torch.testing.assert_close(got[1]["state"][k][name], v, rtol=0, atol=0)
    assert got[2] == want[2], (got[2], want[2])
    torch.testing.assert_close(got[3], want[3], rtol=0, atol=0)


def case_synchronize_on_a_group_takes_the_group_roots_values():
    """On [0, 2] with root_rank=1 (world rank 2) while rank 1 syncs alone on [1]; twice (the
    second call takes the cached fast path), then the same objects on the world."""
    pair, one, everyone = groups()
    r = rank()
    mine, root_world = (pair, 2) if r in pair else (one, 1)
    root = mine.ranks.index(root_world)
    for rnd in range(2):
        state = _state(10 * rnd + r)
        want = _values(_state(10 * rnd + root_world))
        state = fm.synchronize_(state, root_rank=root, group=mine)
        _assert_same(_values(state), want)
        # The objects keep their identity (updated in place), so a second sync is a fast path.
        state["w"].add_(r)
        state = fm.synchronize_(state, root_rank=root, group=mine)
        want[3].add_(root_world)
        _assert_same(_values(state), want)
    # The same objects, now on every rank through the group of all three, then on the world:
    # rank 1's values (it has Adam state, the others have none) reach everyone.
    for group in (everyone, None):
        before = _values(state) if r == 1 else None
        want = fm.broadcast_object(before, root_rank=1)
        state = fm.synchronize_(state, root_rank=1, group=group)
        _assert_same(_values(state), want)


def case_data_container_shards_over_the_group():
    pair, _, _ = groups()
    r = rank()
    if r in pair:
        shard = fm.DistributedDataContainer(list(range(10)), group=pair)
        assert shard.world_size == 2 and shard.rank == pair.rank, shard
        assert list(shard) == (list(range(5)) if r == 0 else list(range(5, 10))), list(shard)
    else:
        raises(ValueError, lambda: fm.DistributedDataContainer(range(10), group=pair), "rank 1")


def case_non_member_raises_its_own_error():
    pair, one, _ = groups()
    r = rank()
    other = one if r in pair else pair  # a group this rank is not in
    raises(
        ValueError,
        lambda: fm.allreduce_(torch.ones(2), group=other),
        f"allreduce_(): rank {r} is not a member of the group of ranks {list(other.ranks)}",
    )
    raises(ValueError, lambda: fm.bcast_(torch.ones(2), group=other), f"rank {r}")
    raises(ValueError, lambda: fm.synchronize_({"a": 1}, group=other), "synchronize_()")
    raises(ValueError, lambda: fm.allgather(torch.ones(2), group=other), "allgather()")
    raises(TypeError, lambda: fm.allreduce_(torch.ones(2), group=[0, 2]), "fluxmpi_py.Group")


def case_mismatch_inside_a_group_raises_on_every_member():
    pair, _, _ = groups()
    r = rank()
    if r not in pair:
        return
    n = 3 if r == 0 else 4
    msg = raises(RuntimeError, lambda: fm.allreduce_(torch.ones(n), group=pair), "allreduce_")
    assert "rank 0 has 3" in msg and "rank 2 has 4" in msg and "on group [0, 2]" in msg, msg
    # the group still works afterwards
    assert fm.allreduce_(torch.ones(1), group=pair).tolist() == [2.0]


def case_new_group_with_different_lists_raises_on_every_rank():
    r = rank()
    ranks = [0, 1] if r == 0 else [0, 2]
    msg = raises(RuntimeError, lambda: fm.new_group(ranks), "new_group")
    assert "[0, 1]" in msg and "[0, 2]" in msg, msg
    ranks = [0] if r == 0 else [0, 1]
    raises(RuntimeError, lambda: fm.new_group(ranks), "disagree on the number of ranks")
    raises(ValueError, lambda: fm.new_group([0, 7]), "[0, 7]", "outside")


if __name__ == "__main__":
    run_cases(globals())
