"""The Horovod face: join with uneven data, and Horovod's names for calls in flight (duplicate
names, async calls that pair by name, a forgotten broadcast_parameters) (the rest:
horovod_face_worker.py, horovod_training_worker.py).
"""

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py.horovod as hvd  # noqa: E402


def case_join_uneven_data_returns_last_rank():
    n, r = hvd.size(), hvd.rank()
    batches = 4
    torch.manual_seed(3)
    data = torch.randn(batches, n, 3)
    w = torch.nn.Parameter(torch.zeros(3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), backward_passes_per_step=1)
    for s in range(batches - (r + 1)):  # rank r has r + 1 batches fewer
        (w * data[s, r]).sum().backward()  # gradient: data[s, r]
        opt.step()
        opt.zero_grad()
    assert hvd.join() == 0  # rank 0 has the most batches: it joins last
    want = -sum(data[s, q] for s in range(batches) for q in range(n) if s < batches - (q + 1)) / n
    assert torch.allclose(w.detach(), want, atol=1e-6), (w, want)
    assert torch.equal(hvd.allgather(w.detach().unsqueeze(0)), w.detach().expand(n, 3))
    assert hvd.join() == n - 1  # every rank joins at once: the highest rank


def case_join_takes_part_in_plain_allreduce():
    # Horovod: a joined rank reduces zeros with the others' allreduce; other collectives
    # raise on the active ranks while the joined rank keeps waiting
    n, r = hvd.size(), hvd.rank()
    if r == 0:  # rank 0 ran out of data first
        last = hvd.join()
    else:
        t = torch.full((3,), float(r))
        rest = float(sum(range(1, n)))
        assert hvd.allreduce(t, op=hvd.Sum).tolist() == [rest] * 3
        a = hvd.allreduce(torch.full((2,), 4, dtype=torch.int64))  # divides by the world size
        assert a.tolist() == [4 * (n - 1) // n] * 2
        g = hvd.grouped_allreduce([t, t.double().reshape(1, 3)], op=hvd.Sum)
        assert g[0].tolist() == [rest] * 3 and g[1].tolist() == [[rest] * 3]
        assert hvd.synchronize(hvd.allreduce_async(t, op=hvd.Sum)).tolist() == [rest] * 3
        assert hvd.allreduce_(t, average=False) is t and t.tolist() == [rest] * 3
        raises(Exception, lambda: hvd.allgather(t))  # not an allreduce: raises here
        last = hvd.join()
    assert last == n - 1  # ranks 1.. were active equally long: the highest
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n  # in step again


def case_a_name_in_flight_is_horovods_duplicate_name_error():
    n, r = hvd.size(), hvd.rank()
    t = torch.ones(3)
    h = hvd.allreduce_async(t, name="grad.w", op=hvd.Sum)
    taken = "name 'grad.w' is taken"
    # Horovod keeps one table of names per process set, across ops and sync calls
    # an async call raises on its own rank only (it starts later, when every rank made one)
    raises(ValueError, lambda: hvd.allreduce_async(t, name="grad.w"), taken, f"rank {r}")
    raises(ValueError, lambda: hvd.allgather_async(t, name="grad.w"), taken)
    raises(ValueError, lambda: hvd.broadcast(t, 0, name="grad.w"), taken)
    raises(ValueError, lambda: hvd.grouped_allreduce([t], name="grad.w"), taken)
    assert hvd.allreduce(t, name="grad.b", op=hvd.Sum).tolist() == [n] * 3  # other names run
    assert hvd.synchronize(h).tolist() == [n] * 3  # the first call was not disturbed
    h = hvd.allgather_async(t, name="grad.w")  # free again after synchronize
    while not hvd.poll(h):
        pass
    # poll() may say done on one rank and not on another: the name waits for synchronize
    raises(ValueError, lambda: hvd.broadcast_async(t, 0, name="grad.w"), taken)
    assert hvd.synchronize(h).shape[0] == 3 * n
    assert hvd.synchronize(hvd.broadcast_async(t, 0, name="grad.w")).tolist() == [1.0] * 3
    hvd.allreduce_async(t, name="dropped")  # a dropped handle: taken until a blocking call
    raises(ValueError, lambda: hvd.allreduce_async(t, name="dropped"), "'dropped' is taken")
    hvd.barrier()  # collectives finish in call order: the dropped one is done after this
    assert hvd.allreduce(t, name="dropped", op=hvd.Sum).tolist() == [n] * 3
    raises(ValueError, lambda: hvd.reducescatter(torch.ones(n), name="x", op=hvd.Max))
    assert hvd.reducescatter(torch.ones(n), name="x", op=hvd.Sum).tolist() == [n]  # freed
    if n > 1:
        # only rank 0 reuses a name: every rank raises, naming rank 0, and none hangs. Rank 0
        # raises Horovod's ValueError; the others the TypeError of another rank's local error
        h = hvd.allreduce_async(t, name="a")
        try:
            hvd.allreduce(t, name="b" if r else "a")
            raise AssertionError("no rank may finish this call")
        except TypeError as e:
            assert "rank 0" in str(e) and "name 'a' is taken" in str(e), e
            assert isinstance(e, ValueError) == (r == 0), type(e)
        hvd.synchronize(h)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n  # in step again


def case_named_async_calls_pair_by_name_as_horovods():
    n, r = hvd.size(), hvd.rank()
    # Each rank makes the named calls in another order, with values of its own, and waits on
    # them in yet another: Horovod pairs them by name (by call order, a would meet b: the
    # same shape, so only the sums would tell)
    names = ["a", "b", "c"]
    order = names[r % 3 :] + names[: r % 3]
    scale = {"a": 1.0, "b": 10.0, "c": 100.0}
    handles = {
        k: hvd.allreduce_async(torch.full((2,), scale[k] * (r + 1)), name=k, op=hvd.Sum)
        for k in order
    }
    for k in sorted(order, reverse=r % 2 == 1):
        assert hvd.synchronize(handles[k]).tolist() == [scale[k] * n * (n + 1) / 2] * 2, k
    # Horovod's duplicate-name tests: rank 0 makes its call before a barrier, the others
    # after it; a name reused while in flight raises on the rank that reused it only
    t = torch.ones(3)
    h = None
    if r == 0:
        h = hvd.allgather_async(t, name="dup")
        raises(ValueError, lambda: hvd.allgather_async(t, name="dup"), "name 'dup' is taken")
    hvd.barrier()
    if r > 0:
        h = hvd.allgather_async(t, name="dup")
        raises(ValueError, lambda: hvd.allgather_async(t, name="dup"), "'dup' is taken")
    while not hvd.poll(h):  # poll starts it too, once every rank has made it
        pass
    assert hvd.synchronize(h).shape == (3 * n,)
    # grouped and broadcast calls pair by name as well; a name only some ranks made waits
    late = hvd.broadcast_async(torch.full((1,), float(r)), n - 1, name="late") if r else None
    g = hvd.grouped_allreduce_async([torch.ones(2), torch.ones(1)], name="g", op=hvd.Sum)
    assert [o.tolist() for o in hvd.synchronize(g)] == [[n] * 2, [n]]
    if r == 0:
        late = hvd.broadcast_async(torch.full((1,), float(r)), n - 1, name="late")
    assert hvd.synchronize(late).tolist() == [n - 1.0]
    if n > 1:
        # every rank waits on a name no other rank made: all raise, naming what waits where
        h = hvd.allreduce_async(torch.ones(1), name=f"only{r}")
        msg = raises(RuntimeError, lambda: hvd.synchronize(h), "every rank waits")
        assert all(f"rank {q}: ['only{q}']" in msg for q in range(n)), msg
        raises(RuntimeError, lambda: hvd.synchronize(h), "every rank waits")  # kept
        assert hvd.allreduce(torch.ones(1), name="only0", op=hvd.Sum).item() == n  # freed
    # blocking calls start at once and pair by call order, beside the waiting ones
    assert hvd.allreduce(torch.ones(1), name="now", op=hvd.Sum).item() == n


def case_forgotten_broadcast_parameters_warns_at_the_first_step():
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(100 + r)  # each rank its own start
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    model(torch.ones(2, 3)).sum().backward()
    with warnings.catch_warnings(record=True) as ws:  # Horovod runs the step: a warning
        warnings.simplefilter("always")
        opt.step()
    said = [str(w.message) for w in ws if issubclass(w.category, RuntimeWarning)]
    if n > 1:
        assert any("the same parameters" in m and "broadcast_parameters" in m for m in said), ws
        assert "weight" in said[0]
    else:
        assert not said, said
    model = torch.nn.Linear(3, 1)  # a new start, broadcast this time
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    assert hvd.allgather_object(model.weight.tolist()) == [model.weight.tolist()] * n


if __name__ == "__main__":
    run_cases(globals())
