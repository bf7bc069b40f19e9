"""A bad argument on one rank only raises on every rank, and the ranks stay in step (issue 33);
run by tests/test_one_rank_args.py at 2 and 3 ranks.

Each case gives the bad argument on each rank in turn; every rank must raise the same
exception type, naming the bad rank and the bad value, and a collective right after must work.
"""

import torch
from harness import fm, raises, run_cases


def in_step():
    """A collective after the failure: it works and every rank took part."""
    t = torch.ones(3)
    fm.allreduce_(t, op="sum")
    assert torch.equal(t, torch.full((3,), float(fm.total_workers()))), t


def optimizer_raises(op, bad):
    model = torch.nn.Linear(3, 2)
    raises(
        ValueError,
        lambda: fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=op),
        "op='median'",
        f"on rank {bad}",
        "in DistributedOptimizer()",
    )


def case_optimizer_bad_op_on_one_rank():
    rank = fm.local_rank()
    for bad in range(fm.total_workers()):
        optimizer_raises("median" if rank == bad else "average", bad)
        in_step()
    # A good one right after: constructs and steps together.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    in_step()


def case_optimizer_bad_argument_types_on_one_rank():
    rank, last = fm.local_rank(), fm.total_workers() - 1
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    raises(
        TypeError,
        lambda: fm.DistributedOptimizer(opt if rank != last else "sgd"),
        "torch.optim.Optimizer",
        f"on rank {last}",
    )
    in_step()
    raises(
        ValueError,
        lambda: fm.DistributedOptimizer(opt, backward_passes_per_step=0 if rank == last else 1),
        "backward_passes_per_step",
        f"on rank {last}",
    )
    in_step()


def sync_raises(obj, bad):
    raises(ValueError, lambda: fm.synchronize_(obj, root_rank=0), "share memory", f"rank {bad}")
    in_step()


def case_synchronize_expanded_tensor_on_one_rank():
    rank = fm.local_rank()
    for bad in range(fm.total_workers()):
        x = torch.zeros(1).expand(4) if rank == bad else torch.arange(4.0)
        sync_raises(x, bad)
        sync_raises({"w": x, "step": 3}, bad)  # inside a structure
        m = torch.nn.Linear(4, 1)  # a module's buffer
        m.register_buffer("b", torch.zeros(1).expand(4) if rank == bad else torch.zeros(4))
        sync_raises(m, bad)
    y = fm.synchronize_(torch.arange(4.0) * (rank + 1), root_rank=0)
    assert torch.equal(y, torch.arange(4.0)), y


if __name__ == "__main__":
    run_cases(globals())
