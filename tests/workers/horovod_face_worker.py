"""fluxmpi_py.horovod (Horovod's torch names) against closed forms: allreduce ops, averaging,
pre/post scaling, broadcast, allgather, objects, and the clear errors of what it lacks.

Run by tests/test_horovod_face.py under mpiexec at 1, 2 and 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py.horovod as hvd  # noqa: E402


def case_topology():
    hvd.init()
    assert hvd.is_initialized()
    assert 0 <= hvd.rank() < hvd.size()
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))


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
    assert hvd.broadcast_object({"r": r}, root_rank=root) == {"r": root}


def case_unsupported_raise_naming_the_alternative():
    raises(NotImplementedError, lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum), "Average")
    raises(NotImplementedError, hvd.join, "same number of batches")
    raises(NotImplementedError, lambda: hvd.add_process_set([0]), "comm=")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum), "not both")


if __name__ == "__main__":
    run_cases(globals())
