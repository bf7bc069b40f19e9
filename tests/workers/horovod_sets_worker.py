"""fluxmpi_py.horovod process sets (hvd.ProcessSet, add/remove_process_set, process_set=)
against closed forms: a set of the first and last rank (two ranks at 3), the others outside.

Run by tests/test_horovod_face.py under mpiexec at 1, 2 and 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py.horovod as hvd  # noqa: E402


def _edge_set():
    """The registered set {0, n-1} (the global set where that is every rank), its ranks, and
    whether this rank is in it."""
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    ranks = sorted({0, n - 1})
    if ranks == list(range(n)):
        return hvd.global_process_set, ranks, True
    ps = _EDGE.get("set")
    if ps is None or ps.process_set_id is None:  # not yet made, or removed by a case
        ps = _EDGE["set"] = hvd.add_process_set(hvd.ProcessSet(list(reversed(ranks))))
    return ps, ranks, r in ranks


_EDGE: dict = {}  # the edge set, made once: Horovod refuses a second set of the same ranks


def case_registration_and_queries():
    hvd.init()
    n, r = hvd.size(), hvd.rank()
    gps = hvd.global_process_set
    assert gps.process_set_id == 0 and gps.ranks == list(range(n)) and gps.size() == n
    loose = hvd.ProcessSet(sorted({n - 1, 0}, reverse=True))
    assert loose.ranks == sorted({0, n - 1}) and loose.size() is None and loose.rank() is None
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=loose), "not registered")
    ps, ranks, member = _edge_set()
    assert (ps.process_set_id != 0) == (ranks != list(range(n)))
    assert ps.size() == len(ranks) and ps.included() == member
    assert ps.rank() == (ranks.index(r) if member else None)
    assert hvd.get_process_sets()[ps.process_set_id] == ranks
    raises(ValueError, lambda: hvd.add_process_set(ps), "already registered")
    # Horovod refuses a second set of the same ranks, on every rank, the world's included
    # (its global set); the rank order does not make it another set.
    dup = f"duplicate process set: ranks {ranks} are already process set {ps.process_set_id}"
    raises(ValueError, lambda: hvd.add_process_set(list(reversed(ranks))), dup)
    world = f"ranks {list(range(n))} are already process set 0"
    raises(ValueError, lambda: hvd.add_process_set(list(range(n))), world)
    assert hvd.get_process_sets()[ps.process_set_id] == ranks  # the refusals left it alone
    sub = ranks != list(range(n))  # a set of all ranks is the global set (id 0)
    assert hvd.remove_process_set(ps) is sub
    assert hvd.remove_process_set(gps) is False
    if sub:
        assert ps.process_set_id is None and ps.size() is None  # removed with its id
        raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=ps), "not registered")
        again = hvd.add_process_set(ranks)  # once removed, the ranks may come back
        assert again.process_set_id not in (None, 0) and again.size() == len(ranks)
        if member:
            got = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again).item()
            assert got == len(ranks), got
        hvd.remove_process_set(again)
    hvd.init(process_sets=[[0], [0], list(range(n))])  # init registers sets; drops duplicates
    sets = hvd.get_process_sets()
    assert list(sets.values()).count([0]) == 1 and sets[0] == list(range(n)), sets


def case_collectives_on_a_set():
    n, r = hvd.size(), hvd.rank()
    ps, ranks, member = _edge_set()
    if not member:
        raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=ps), f"rank {r}")
        raises(ValueError, lambda: hvd.allgather_object(r, process_set=ps), f"rank {r}")
        hvd.barrier()
        return
    k, root = len(ranks), ranks[-1]  # root_rank is a world rank, as in Horovod
    t = torch.full((2,), float(r + 1))
    total = sum(q + 1.0 for q in ranks)
    assert hvd.allreduce(t, op=hvd.Sum, process_set=ps).tolist() == [total] * 2
    assert hvd.allreduce(t, process_set=ps).tolist() == [total / k] * 2  # average over the set
    assert hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum, process_set=ps))[0] == total
    g = hvd.grouped_allreduce([t, t.double()], op=hvd.Max, process_set=ps)
    assert [o[0].item() for o in g] == [root + 1.0] * 2
    g = hvd.grouped_allreduce_([t.clone(), t.clone()], op=hvd.Sum, process_set=ps)
    assert [o.tolist() for o in g] == [[total] * 2] * 2
    assert hvd.broadcast(t, root, process_set=ps).tolist() == [root + 1.0] * 2
    assert hvd.synchronize(hvd.broadcast_async(t, root, process_set=ps))[0] == root + 1
    gathered = hvd.allgather(torch.full((r + 1, 1), float(r)), process_set=ps)
    assert gathered[:, 0].tolist() == [float(q) for q in ranks for _ in range(q + 1)]
    assert hvd.allgather_object(r, process_set=ps) == ranks
    assert hvd.broadcast_object({"r": r}, root_rank=root, process_set=ps) == {"r": root}
    out = hvd.alltoall(torch.full((k, 1), float(r)), process_set=ps)
    assert out[:, 0].tolist() == [float(q) for q in ranks]
    # alltoall's gradient runs on the set too (the others are in the barrier below)
    x = torch.full((k * (r + 1), 2), float(r), requires_grad=True)
    out, got = hvd.alltoall(x, torch.tensor([r + 1] * k, dtype=torch.int32), process_set=ps)
    assert got.tolist() == [q + 1 for q in ranks]
    (out * 2).sum().backward()
    assert x.grad.tolist() == [[2.0, 2.0]] * (k * (r + 1))
    part = hvd.reducescatter(torch.ones(k, 2), op=hvd.Sum, process_set=ps)
    assert part.tolist() == [[float(k)] * 2]
    hvd.barrier(process_set=ps)
    if n > 2:  # a root outside the set raises on every member, before data moves
        raises(Exception, lambda: hvd.broadcast(t, 1, process_set=ps), "not in the process set")
    hvd.barrier()  # the others wait here


def case_distributed_optimizer_on_a_set():
    r = hvd.rank()
    ps, ranks, member = _edge_set()
    w = torch.nn.Parameter(torch.zeros(2))
    if not member:  # as Horovod's: the wrapped optimizer alone, no communication
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), process_set=ps)
        (w * (r + 1)).sum().backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        assert w.tolist() == [-(r + 1.0)] * 2 and opt.param_groups[0]["lr"] == 1.0
        opt.zero_grad()
        assert w.grad is None and isinstance(opt, torch.optim.Optimizer)
        return
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), process_set=ps)
    (w * (r + 1)).sum().backward()
    opt.step()
    mean = sum(q + 1.0 for q in ranks) / len(ranks)  # averaged over the set's ranks only
    assert w.tolist() == [-mean] * 2


def case_names_are_per_process_set():
    n = hvd.size()
    ps, ranks, member = _edge_set()
    h = hvd.allreduce_async(torch.ones(2), name="g", op=hvd.Sum)  # the world holds "g"
    if ranks == list(range(n)):  # the set of every rank is the global set: "g" is taken
        raises(ValueError, lambda: hvd.allgather_async(torch.ones(1), name="g", process_set=ps),
               "name 'g' is taken")  # fmt: skip
    elif member:  # Horovod keeps a table of names per set: "g" is free on this one
        hs = hvd.allreduce_async(torch.ones(2), name="g", op=hvd.Sum, process_set=ps)
        raises(ValueError, lambda: hvd.allgather_async(torch.ones(1), name="g", process_set=ps),
               "name 'g' is taken")  # fmt: skip
        assert hvd.synchronize(hs).tolist() == [float(len(ranks))] * 2
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), name="g"), "name 'g' is taken")
    assert hvd.synchronize(h).tolist() == [float(n)] * 2
    hvd.remove_process_set(ps)


def case_named_async_calls_pair_by_name_on_a_set():
    # each set has a lane of its own: the set's members pair its names in any order, while a
    # world call made before them waits for the world's other ranks
    n, r = hvd.size(), hvd.rank()
    ps, ranks, member = _edge_set()
    world = hvd.allreduce_async(torch.ones(1), name="w", op=hvd.Sum)
    if member:
        scale = {"x": 1.0, "y": 10.0}
        order = ["x", "y"] if r == 0 else ["y", "x"]
        hs = {
            k: hvd.allreduce_async(
                torch.full((1,), (r + 1.0) * scale[k]), name=k, op=hvd.Sum, process_set=ps
            )
            for k in order
        }
        total = sum(q + 1.0 for q in ranks)
        assert [hvd.synchronize(hs[k]).item() for k in "xy"] == [total, 10 * total]
    assert hvd.synchronize(world).tolist() == [float(n)]
    hvd.remove_process_set(ps)  # as found: a later worker of the launch may add these ranks


if __name__ == "__main__":
    run_cases(globals())
