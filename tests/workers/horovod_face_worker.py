"""fluxmpi_py.horovod (Horovod's torch names) against closed forms: allreduce ops, averaging,
pre/post scaling, broadcast, allgather, alltoall, reducescatter, grouped forms, objects,
topology, and the clear errors of what it lacks (a Horovod-style training script against one
process on the whole data: horovod_training_worker.py; join and names of calls in flight:
horovod_join_names_worker.py).

Run by tests/test_horovod_face.py under mpiexec at 1, 2 and 3 ranks.
"""

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
import fluxmpi_py.horovod as hvd  # noqa: E402


def case_topology():
    hvd.init()
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < hvd.size()
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
    hvd.shutdown()  # as Horovod's: not initialized until the next init()
    assert not hvd.is_initialized()
    hvd.init()
    assert hvd.is_initialized() and hvd.allgather_object(1) == [1] * hvd.size()


def case_allreduce_ops_and_scaling():
    n, r = hvd.size(), hvd.rank()
    t = torch.tensor([float(r + 1), 2.0])
    total = n * (n + 1) / 2
    assert hvd.allreduce(t).tolist() == [total / n, 2.0]  # Horovod's default: average
    assert hvd.allreduce(t, average=False).tolist() == [total, 2.0 * n]
    assert hvd.allreduce(t, op=hvd.Sum).tolist() == [total, 2.0 * n]
    assert hvd.allreduce(t, op=hvd.Min).tolist() == [1.0, 2.0]
    assert hvd.allreduce(t, op=hvd.Max).tolist() == [float(n), 2.0]
    assert hvd.allreduce(t, op=hvd.Product).tolist() == [
        float(torch.arange(1, n + 1).prod()),
        2.0**n,
    ]
    assert t.tolist() == [float(r + 1), 2.0]  # allreduce leaves its input alone
    s = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert s.tolist() == [total, 2.0 * n]
    assert hvd.allreduce_(t, op=hvd.Sum) is t and t.tolist() == [total, 2.0 * n]


def case_async_handles():
    n, r = hvd.size(), hvd.rank()
    t = torch.full((3,), float(r + 1))
    h = hvd.allreduce_async(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    out = hvd.synchronize(h)
    assert hvd.poll(h) and t[0] == r + 1
    assert out.tolist() == [n * (n + 1) / 4] * 3
    assert hvd.synchronize(h).tolist() == [n * (n + 1) / 4] * 3  # not rescaled twice
    h = hvd.allreduce_async_(t)
    assert hvd.synchronize(h) is t and t.tolist() == [(n + 1) / 2] * 3


def case_broadcast_and_allgather():
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    t = torch.full((2,), float(r))
    assert hvd.broadcast(t, root).tolist() == [float(root)] * 2 and t[0] == r
    assert hvd.broadcast_(t, root) is t and t.tolist() == [float(root)] * 2
    g = hvd.allgather(torch.full((r + 1, 2), float(r)))
    assert g[:, 0].tolist() == [float(i) for i in range(n) for _ in range(i + 1)]
    assert hvd.broadcast_object({"r": r}, root_rank=root, name="o") == {"r": root}
    gps = hvd.global_process_set
    assert hvd.allgather_object(r, name="o", process_set=gps) == list(range(n))
    assert hvd.allreduce(t, op=hvd.Sum, process_set=gps).tolist() == [float(root * n)] * 2
    hvd.barrier(process_set=gps)


def case_unsupported_raise_naming_the_alternative():
    raises(NotImplementedError, lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum), "Average")
    raises(ValueError, lambda: hvd.ProcessSet(object()), "list of world ranks")
    raises(TypeError, lambda: hvd.alltoall(torch.ones(1), process_set=object()), "ProcessSet")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum), "not both")


def case_sparse_allreduce_and_the_rest_of_horovods_names():
    n, r = hvd.size(), hvd.rank()
    # rank r holds r+1 at index r and 1 at index n: the sum is 1..n on the diagonal, n at n
    t = torch.sparse_coo_tensor([[r, n], [0, 1]], [float(r + 1), 1.0], (n + 1, 2))
    out = hvd.synchronize(hvd.sparse_allreduce_async(t, op=hvd.Sum))
    want = torch.zeros(n + 1, 2)
    want[:n, 0] = torch.arange(1.0, n + 1)
    want[n, 1] = float(n)
    assert out.is_sparse and torch.equal(out.to_dense(), want), out
    avg = hvd.synchronize(hvd.sparse_allreduce_async(t, op=hvd.Average))
    assert torch.allclose(avg.to_dense(), want / n)
    handle = hvd.sparse_allreduce_async(t, op=hvd.Average, name="s")  # Horovod's: a function
    assert torch.allclose(handle().to_dense(), want / n)
    raises(TypeError, lambda: hvd.sparse_allreduce_async(torch.ones(2)), "sparse COO")
    assert hvd.is_homogeneous() is True  # every rank on this one host
    raises(NotImplementedError, lambda: hvd.start_timeline("t.json"), "torch.profiler")
    raises(NotImplementedError, lambda: hvd.PartialDistributedOptimizer(None), "plain optimizer")
    raises(NotImplementedError, lambda: hvd.elastic.run, "save_checkpoint")
    assert issubclass(hvd.HostsUpdatedInterrupt, Exception)


def case_allreduce_and_broadcast_are_differentiable():
    # Horovod's allreduce/broadcast carry gradients (its suite's *_grad tests)
    n, r = hvd.size(), hvd.rank()
    x = torch.full((2, 3), float(r), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert x.grad.tolist() == [[float(n)] * 3] * 2
    x.grad = None
    hvd.allreduce(x, prescale_factor=2.0, postscale_factor=3.0).sum().backward()  # average
    assert torch.allclose(x.grad, torch.full((2, 3), 6.0))
    y = torch.full((3,), float(r), requires_grad=True)
    b = hvd.broadcast(y, n - 1)
    assert b.tolist() == [n - 1.0] * 3
    b.sum().backward()
    # Horovod 0.21-0.28.1: the root gets the average of the output gradients (fluxmpi_py's
    # own broadcast gives their sum)
    assert y.grad.tolist() == [1.0 if r == n - 1 else 0.0] * 3

    a = torch.full((2,), float(r), requires_grad=True)
    b = torch.ones(1, 3, dtype=torch.float64, requires_grad=True)
    ga, gb = hvd.grouped_allreduce([a, b], op=hvd.Sum, postscale_factor=2.0)
    assert ga.tolist() == [float(n * (n - 1))] * 2
    (ga.sum() + 3 * gb.sum()).backward()
    assert a.grad.tolist() == [2.0 * n] * 2 and b.grad.tolist() == [[6.0 * n] * 3]


def case_gather_and_scatter_gradients_as_horovod_0_28():
    """Horovod's conventions since 0.21 (its last release's suite): allgather averages the
    output gradients over the ranks, then slices; reducescatter allgathers them, times the
    size for Sum, times the scale factors. Each also in its grouped form and on a process set."""
    n, r = hvd.size(), hvd.rank()
    rows = [3, 2, 7, 4][:n]
    for dim, dtype in ((1, torch.float32), (3, torch.float64)):
        tail = [5] * (dim - 1)
        # every rank's output gradient: rank s's rows hold s (different values by rank too)
        g = torch.cat([torch.full([rows[s]] + tail, float(s + r), dtype=dtype) for s in range(n)])
        mean_r = (n - 1) / 2  # the average over ranks of r
        x = torch.ones([rows[r]] + tail, dtype=dtype, requires_grad=True)
        hvd.allgather(x).backward(g)
        torch.testing.assert_close(x.grad, torch.full_like(x, r + mean_r))
        xs = [torch.ones([rows[r]] + tail, dtype=dtype, requires_grad=True) for _ in range(2)]
        for o in hvd.grouped_allgather(xs):
            o.backward(g)
        for x in xs:
            torch.testing.assert_close(x.grad, torch.full_like(x, r + mean_r))
        for op, scale in ((hvd.Sum, n), (hvd.Average, 1)):
            x = torch.randn([4 * n + 1] + tail, dtype=dtype, requires_grad=True)
            out = hvd.reducescatter(x, op=op, prescale_factor=0.5, postscale_factor=3.0)
            assert out.shape[0] == 4 + (r == 0)  # Horovod's parts: the first ranks get more
            out.backward(torch.full_like(out, float(r + 1)))
            # the allgathered output gradients: rank s's part holds s + 1
            want = torch.cat([torch.full([4 + (s == 0)] + tail, s + 1.0) for s in range(n)])
            torch.testing.assert_close(x.grad, (want * 1.5 * scale).to(dtype))
            xs = [torch.randn([2 * n] + tail, dtype=dtype, requires_grad=True) for _ in range(2)]
            for o in hvd.grouped_reducescatter(xs, op=op):
                o.sum().backward()
            for x in xs:
                torch.testing.assert_close(x.grad, torch.full_like(x, float(scale)))
    # a process set of the last two ranks (the world at 1-2 ranks)
    members = list(range(max(0, n - 2), n))
    ps = hvd.add_process_set(members) if n > 2 else hvd.global_process_set
    if r in members:
        k = len(members)
        x = torch.ones(2, requires_grad=True)
        hvd.allgather(x, process_set=ps).sum().backward()
        assert x.grad.tolist() == [1.0, 1.0], x.grad  # the average of ones
        x = torch.ones(2 * k, requires_grad=True)
        hvd.reducescatter(x, op=hvd.Sum, process_set=ps).sum().backward()
        assert x.grad.tolist() == [float(k)] * (2 * k), x.grad
        y = torch.ones(3, requires_grad=True)
        hvd.broadcast(y, members[0], process_set=ps).sum().backward()
        assert y.grad.tolist() == [1.0 if r == members[0] else 0.0] * 3, y.grad
    if n > 2:
        hvd.remove_process_set(ps)
    # the async forms record no gradient, as Horovod's
    x = torch.ones(n, requires_grad=True)
    assert hvd.synchronize(hvd.reducescatter_async(x)).grad_fn is None


def case_horovod_errors_and_warnings():
    n = hvd.size()
    # a splits tensor of floats: Horovod's ValueError (still a TypeError, as in fluxmpi_py)
    bad = torch.ones(n, dtype=torch.float32)
    raises(ValueError, lambda: hvd.alltoall(torch.ones(n), bad), "splits must be")
    raises(TypeError, lambda: hvd.alltoall(torch.ones(n), bad), "splits must be")
    w = torch.nn.Parameter(torch.ones(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0))
    w.sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        opt.step()  # after synchronize(), outside skip_synchronize(): Horovod warns
    assert [str(x.message) for x in ws if "skip_synchronize" in str(x.message)], ws
    assert w.tolist() == [0.0, 0.0]  # reduced once: the average of ones


def case_integer_allreduce_scales_in_float64():
    # Horovod scales integer tensors in float64 and casts back (truncating)
    n = hvd.size()
    t = torch.tensor([5, -7, 3], dtype=torch.int32)
    assert hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5).tolist() == [2 * n, -3 * n, n]
    post = hvd.allreduce(t, op=hvd.Sum, postscale_factor=0.5)
    assert post.dtype == torch.int32 and post.tolist() == [int(v * n * 0.5) for v in (5, -7, 3)]
    h = hvd.allreduce_async(t.long(), op=hvd.Sum, prescale_factor=1.5)
    assert hvd.synchronize(h).tolist() == [7 * n, -10 * n, 4 * n]
    g = hvd.grouped_allreduce([t, t.short()], op=hvd.Sum, postscale_factor=0.5)
    assert [o.tolist() for o in g] == [post.tolist()] * 2 and g[1].dtype == torch.int16


def case_topology_and_predicates():
    n = hvd.size()
    assert hvd.local_size() >= 1 and 0 <= hvd.local_rank() < hvd.local_size()
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    pairs = hvd.allgather_object((hvd.local_rank(), hvd.cross_rank()))
    assert len(set(pairs)) == n  # (local, cross) names each rank once
    assert hvd.cross_size() == sum(1 for lr, _ in pairs if lr == hvd.local_rank())
    assert hvd.mpi_built() and hvd.mpi_enabled()
    assert not (hvd.gloo_built() or hvd.gloo_enabled() or hvd.ddl_built() or hvd.ccl_built())
    assert not hvd.rocm_built()
    info = fm.build_info()
    assert hvd.cuda_built() == info["compiled_with_cuda"]
    assert bool(hvd.nccl_built()) == bool(info["nccl"])
    assert hvd.mpi_threads_supported() == info["thread_multiple"]


def case_alltoall_and_reducescatter():
    n, r = hvd.size(), hvd.rank()
    out = hvd.alltoall(torch.full((n, 2), float(r)))
    assert out[:, 0].tolist() == [float(j) for j in range(n)]
    # rank r sends j+1 rows to rank j, valued 10*r + j
    splits = [j + 1 for j in range(n)]
    t = torch.cat([torch.full((j + 1,), 10.0 * r + j) for j in range(n)])
    out, received = hvd.alltoall(t, splits=splits)
    assert received.tolist() == [r + 1] * n and received.dtype == torch.int32
    assert out.tolist() == [10.0 * i + r for i in range(n) for _ in range(r + 1)]
    h = hvd.alltoall_async(t, splits=torch.tensor(splits, dtype=torch.int32))
    o2, rec2 = hvd.synchronize(h)
    assert torch.equal(o2, out) and torch.equal(rec2, received)
    # reducescatter: dim 0 of n+1 rows, rank 0 gets two rows; default op Average
    x = torch.arange(float(n + 1)).unsqueeze(1) * (r + 1)
    mine = [0, 1] if r == 0 else [r + 1]
    total = n * (n + 1) / 2
    assert hvd.reducescatter(x)[:, 0].tolist() == [i * total / n for i in mine]
    assert hvd.reducescatter(x, op=hvd.Sum)[:, 0].tolist() == [i * total for i in mine]
    s = hvd.synchronize(hvd.reducescatter_async(x, op=hvd.Sum, prescale_factor=2.0,
                                                postscale_factor=0.5))  # fmt: skip
    assert s[:, 0].tolist() == [i * total for i in mine] and x[1, 0] == r + 1
    a, b = hvd.grouped_reducescatter([x, torch.ones(n, dtype=torch.float64)], op=hvd.Sum)
    assert a[:, 0].tolist() == [i * total for i in mine] and b.tolist() == [float(n)]
    a, b = hvd.synchronize(hvd.grouped_reducescatter_async([x, x]))
    assert a.tolist() == b.tolist() == hvd.reducescatter(x).tolist()


def _trunc_mean(values, n, factor=1.0):
    """Horovod's integer average: the sum times factor/n in float64, truncated toward 0."""
    return [int(sum(v) * (factor / n)) for v in zip(*values)]


def case_integer_average_and_scaling_truncate_like_horovod():
    # Rank 0 holds -3, the others 0: the mean -3/n truncates to -1 at 2 ranks (its floor is
    # -2) and to -1 at 3 ranks (floor -1). Horovod multiplies the sum by 1/n in float64 and
    # casts back; its suite's join test reads the truncation.
    n, r = hvd.size(), hvd.rank()
    mine = [-3, 3, -7, 7] if r == 0 else [0, 0, 0, 0]
    rows = [[-3, 3, -7, 7]] + [[0, 0, 0, 0]] * (n - 1)
    for dtype in (torch.int32, torch.int64):
        t = torch.tensor(mine, dtype=dtype)
        assert hvd.allreduce(t).tolist() == _trunc_mean(rows, n), (dtype, hvd.allreduce(t))
        assert hvd.synchronize(hvd.allreduce_async(t)).tolist() == _trunc_mean(rows, n)
        got = hvd.allreduce(t, postscale_factor=3.0)
        assert got.tolist() == _trunc_mean(rows, n, 3.0) and got.dtype == dtype
        got = hvd.grouped_allreduce([t, t.double()])  # mixed dtypes: each as Horovod's
        assert got[0].tolist() == _trunc_mean(rows, n)
        assert torch.allclose(got[1], torch.tensor(rows, dtype=torch.float64).sum(0) / n)
        got = hvd.synchronize(hvd.grouped_allreduce_async_([t.clone()]))
        assert got[0].tolist() == _trunc_mean(rows, n)
    # Integer (grouped) reducescatter with float factors: scaled in float64, truncated
    x = torch.tensor([[7] * 2] * n, dtype=torch.int32) * (r + 1)  # each rank gets one row
    total = n * (n + 1) // 2
    got = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5)
    want = sum(int(7 * (q + 1) * 0.5) for q in range(n))  # each rank's part truncated first
    assert got.tolist() == [[want] * 2] and got.dtype == torch.int32, got
    got = hvd.reducescatter(x, op=hvd.Sum, postscale_factor=0.5)
    assert got.tolist() == [[int(7 * total * 0.5)] * 2], got
    got = hvd.reducescatter(x, op=hvd.Average)
    assert got.tolist() == [[int(7 * total * (1.0 / n))] * 2], got
    a, b = hvd.grouped_reducescatter([x, x.long()], op=hvd.Sum, prescale_factor=0.5,
                                     postscale_factor=3.0)  # fmt: skip
    assert a.tolist() == b.tolist() == [[want * 3] * 2], (a, b)
    h = hvd.grouped_reducescatter_async([x], op=hvd.Sum, postscale_factor=0.5)
    assert hvd.synchronize(h)[0].tolist() == [[int(7 * total * 0.5)] * 2]


class _SgdSeeingSparse(torch.optim.SGD):
    """SGD that records whether its gradients were sparse at each step."""

    def step(self, closure=None):
        self.__dict__.setdefault("seen", []).append(
            all(p.grad.is_sparse for g in self.param_groups for p in g["params"])
        )
        return super().step(closure)


def case_sparse_gradients_in_distributed_optimizer():
    # nn.Embedding(sparse=True) under hvd.DistributedOptimizer: the step applies the average
    # of every rank's gradient, and the wrapped optimizer sees sparse gradients again.
    n, r = hvd.size(), hvd.rank()
    for sparse_as_dense in (False, True):
        emb = torch.nn.Embedding(5, 2, sparse=True)
        hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
        start = emb.weight.detach().clone()
        inner = _SgdSeeingSparse(emb.parameters(), lr=1.0)
        opt = hvd.DistributedOptimizer(inner, sparse_as_dense=sparse_as_dense)
        emb(torch.tensor([r % 4, 4])).sum().backward()  # rows r % 4 and 4, once each
        opt.step()
        want = torch.zeros(5, 2)
        for q in range(n):
            want[q % 4] += 1.0 / n
        want[4] += 1.0
        assert inner.seen == [True], inner.seen
        assert torch.allclose(emb.weight.detach(), start - want), (emb.weight, start - want)
        opt.zero_grad()


def case_grouped_allreduce_and_allgather():
    n, r = hvd.size(), hvd.rank()
    total = n * (n + 1) / 2
    ts = [torch.full((2,), float(r + 1)), torch.full((3,), r + 1, dtype=torch.float64)]
    out = hvd.grouped_allreduce(ts, op=hvd.Sum, postscale_factor=2.0)
    assert [o.tolist() for o in out] == [[2 * total] * 2, [2 * total] * 3]
    assert ts[0][0] == r + 1  # inputs left alone
    out = hvd.synchronize(hvd.grouped_allreduce_async(ts))
    assert [o.tolist() for o in out] == [[total / n] * 2, [total / n] * 3]
    assert hvd.grouped_allreduce_(ts, op=hvd.Max) is not None and ts[1].tolist() == [float(n)] * 3
    h = hvd.grouped_allreduce_async_([torch.ones(1)], average=False)
    assert [o.tolist() for o in hvd.synchronize(h)] == [[float(n)]]
    g = hvd.grouped_allgather([torch.full((r + 1,), float(r)), torch.ones(1, 2)])
    assert g[0].tolist() == [float(i) for i in range(n) for _ in range(i + 1)]
    assert g[1].shape == (n, 2)
    g2 = hvd.synchronize(hvd.grouped_allgather_async([torch.full((r + 1,), float(r))]))
    assert torch.equal(g2[0], g[0])
    assert hvd.synchronize(hvd.allgather_async(torch.ones(1))).shape == (n,)
    t = torch.full((2,), float(r))
    assert hvd.synchronize(hvd.broadcast_async(t, n - 1)).tolist() == [n - 1.0] * 2
    assert hvd.synchronize(hvd.broadcast_async_(t, n - 1)) is t and t[0] == n - 1
    assert hvd.Compression.fp16.decompress(*hvd.Compression.fp16.compress(t)).dtype == t.dtype
    assert hvd.SyncBatchNorm is fm.SyncBatchNorm


if __name__ == "__main__":
    run_cases(globals())
