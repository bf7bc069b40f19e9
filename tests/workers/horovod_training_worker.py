"""The Horovod face, training: a Horovod-style training script against one process (also with
fp16 compression), broadcast_parameters and broadcast_optimizer_state, and the
DistributedOptimizer's checks, sum, synchronize and skip (the rest: horovod_face_worker.py,
horovod_join_names_worker.py).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py.horovod as hvd  # noqa: E402


def _net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _train_like_horovod(compression, steps=3, passes=2, micro=3):
    """A Horovod training script with only its import changed; returns the final weights and
    the weights of one process that trained on every rank's data."""
    n, r = hvd.size(), hvd.rank()
    torch.manual_seed(1234)
    data = torch.randn(steps, passes, n, micro, 4)
    target = torch.randn(steps, passes, n, micro, 2)

    model = _net(seed=100 + r)  # ranks start apart: broadcast_parameters must fix that
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    opt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=passes,
    )
    for s in range(steps):
        opt.zero_grad()
        for k in range(passes):
            loss = torch.nn.functional.mse_loss(model(data[s, k, r]), target[s, k, r])
            loss.backward()
        opt.step()

    ref = _net(seed=100)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for s in range(steps):
        ref_opt.zero_grad()
        for k in range(passes):  # one process: each pass sees every rank's micro-batch
            x, y = data[s, k].reshape(-1, 4), target[s, k].reshape(-1, 2)
            torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    return model, ref


def case_training_script_matches_one_process():
    model, ref = _train_like_horovod(hvd.Compression.none)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), (name, (p - q).abs().max())


def case_training_script_fp16_compression():
    model, ref = _train_like_horovod(hvd.Compression.fp16)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        # fp16 on the wire: gradients rounded to 11 bits, weights still fp32
        assert torch.allclose(p, q, rtol=1e-3, atol=1e-3), (name, (p - q).abs().max())
        assert p.dtype == torch.float32
    # and the rounding did happen (the gradients travelled in fp16)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def case_broadcast_parameters_forms():
    n, r = hvd.size(), hvd.rank()
    model = _net(seed=r)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=n - 1)
    want = _net(seed=n - 1)
    for p, q in zip(model.parameters(), want.parameters()):
        assert torch.equal(p, q)
    model = _net(seed=r)
    hvd.broadcast_parameters(model.parameters(), root_rank=0)
    assert torch.equal(model[0].weight, _net(seed=0)[0].weight)
    raises(ValueError, lambda: hvd.broadcast_parameters(torch.ones(1), 0), "invalid params")
    raises(TypeError, lambda: hvd.broadcast_parameters({"a": 3}, 0), "a is a int")


def case_broadcast_optimizer_state_without_a_step():
    n, r = hvd.size(), hvd.rank()
    model = _net(seed=0)
    # lr as a tensor on the root, a float elsewhere; state only on the root
    lr = torch.tensor(0.01) if r == 0 else 0.5
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.99 - 0.01 * r))
    if r == 0:
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert torch.is_tensor(opt.param_groups[0]["lr"]) and torch.equal(
        opt.param_groups[0]["lr"], torch.tensor(0.01)
    )
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    states = hvd.allgather_object({k: v for k, v in opt.state_dict()["state"][0].items()})
    for st in states:
        assert float(st["step"]) == 1.0
        assert torch.equal(st["exp_avg"], states[0]["exp_avg"])
    # the wrapped optimizer of hvd.DistributedOptimizer is reached too
    dopt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1)))
    hvd.broadcast_optimizer_state(dopt, root_rank=n - 1)
    assert dopt.param_groups[0]["lr"] == 0.1 * n
    # As after Horovod's dummy step, a fresh optimizer's parameters that require grad get zero
    # gradients (Horovod's suite broadcasts them next); frozen ones and the weights stay as
    # they were, even with weight decay
    net = _net(seed=1)
    frozen, trained = list(net.parameters())[:1], list(net.parameters())[1:]
    frozen[0].requires_grad_(False)
    before = [p.detach().clone() for p in net.parameters()]
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    hvd.broadcast_optimizer_state(sgd, root_rank=0)
    assert frozen[0].grad is None
    for p in trained:
        assert p.grad is not None and torch.equal(p.grad, torch.zeros_like(p)), p.grad
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
    # an optimizer with state keeps its gradients as they are
    net(torch.ones(2, 4)).sum().backward()
    sgd.step()
    grads = [p.grad.clone() for p in trained]
    hvd.broadcast_optimizer_state(sgd, root_rank=0)
    assert all(torch.equal(p.grad, g) for p, g in zip(trained, grads))


def case_distributed_optimizer_checks_like_horovod():
    model = _net(seed=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    dup = [("w", p) for _, p in named]
    raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, named_parameters=dup), "duplicates: w")
    raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, named_parameters=named[:2]),
           "not named", "param_groups[0][2]")  # fmt: skip
    raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, named_parameters=[1, 2]), "tuples")
    raises(NotImplementedError, lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum), "Average")
    raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, op=hvd.Sum,
           gradient_predivide_factor=2.0), "op != Average")  # fmt: skip
    raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, compression=object()), "fp16")
    # Horovod's _parameter_names (its suite reads it): the names given, else its default ones
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=named)  # fmt: skip
    assert {id(p): n for p, n in opt._parameter_names.items()} == {id(p): n for n, p in named}
    two = torch.optim.SGD([{"params": [named[0][1]]}, {"params": [named[1][1]]}], lr=0.1)
    names = hvd.DistributedOptimizer(two)._parameter_names
    assert sorted(names.values()) == ["allreduce.noname.0.0", "allreduce.noname.1.0"], names


def case_distributed_optimizer_sum_synchronize_and_skip():
    n, r = hvd.size(), hvd.rank()
    w = torch.nn.Parameter(torch.zeros(3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), op=hvd.Sum,
                                   named_parameters=[("w", w)])  # fmt: skip
    (w * (r + 1)).sum().backward()
    opt.synchronize()
    assert w.grad.tolist() == [n * (n + 1) / 2] * 3  # summed over ranks, before step
    with opt.skip_synchronize():
        opt.step()
    assert w.tolist() == [-n * (n + 1) / 2] * 3
    # gradient_predivide_factor: the same average
    v = torch.nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([v], lr=1.0), gradient_predivide_factor=2.0)
    (v * (r + 1)).sum().backward()
    opt.step()
    assert torch.allclose(v, torch.full((2,), -(n + 1) / 2))


if __name__ == "__main__":
    from harness import run_cases

    run_cases(globals())
