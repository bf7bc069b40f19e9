"""A gradient that one rank alone cannot reduce, found in backward's hooks while the buckets'
collectives overlap backward (issue 46's rule, in the hooks); run by
tests/test_entry_points.py at 2 and 3 ranks.

Generated, not listed: every optimizer that reduces in backward's hooks (OPTIMIZERS) times
every way to spoil one parameter on the last rank only after the optimizer planned its
reduction (SPOIL: resized, cast, a sparse gradient) times every kind of parameter (a fused
bucket's member, a direct bucket of its own, a 2-D embedding). Every rank must end the step
alike: all raise the same type, naming the last rank and the parameter, or all return (a
gradient the face makes good, as Horovod's sparse_as_dense); never a hang (the launch's
timeout). Then one more collective works, and so does the next step once the parameter is
put back.
"""

import torch
from harness import fm, run_cases

import fluxmpi_py.horovod as hvd

fm.Init()
hvd.init()
W, RANK = fm.total_workers(), fm.local_rank()
LAST = W - 1


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(10, 4)
        self.small = torch.nn.Parameter(torch.ones(4))  # fused into a bucket with others
        self.big = torch.nn.Parameter(torch.ones(300_000))  # large enough for a direct bucket

    def forward(self):
        return self.emb(torch.tensor([1, 2])).sum() + self.small.sum() + self.big.sum()


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.1)


def named(m):
    return {"named_parameters": m.named_parameters()}


OPTIMIZERS = {
    "fm": lambda m: fm.DistributedOptimizer(sgd(m), **named(m)),
    "fm-deterministic": lambda m: fm.DistributedOptimizer(sgd(m), deterministic=True, **named(m)),
    "hvd": lambda m: hvd.DistributedOptimizer(sgd(m), **named(m)),
}


def resized(m, name):
    p = getattr(m, name).weight if name == "emb" else getattr(m, name)
    was = p.data
    p.data = torch.zeros(p.shape[0] + 1, *p.shape[1:])
    return lambda: setattr(p, "data", was)


def cast(m, name):
    p = getattr(m, name).weight if name == "emb" else getattr(m, name)
    was = p.data
    p.data = p.data.double()
    return lambda: setattr(p, "data", was)


def sparse_gradient(m, name):
    if name != "emb":
        return None  # only an embedding makes one
    m.emb.sparse = True
    return lambda: setattr(m.emb, "sparse", False)


SPOIL = {"resized": resized, "cast to float64": cast, "a sparse gradient": sparse_gradient}
PARAMETERS = ("small", "big", "emb")


def step(opt, m):
    try:
        opt.zero_grad()
        m().backward()
        opt.step()
        return "returned"
    except Exception as e:  # noqa: BLE001 - the type and text are what every rank must share
        return (type(e).__name__, str(e))


def in_step():
    x = torch.ones(2)
    fm.allreduce_(x)
    assert torch.equal(x, torch.full((2,), float(W))), x


def one(optimizer, spoil, name):
    """Returns a failure's text, or None."""
    m = Net()
    opt = OPTIMIZERS[optimizer](m)
    undo = SPOIL[spoil](m, name) if RANK == LAST else None
    if fm.allgather_object(RANK == LAST and undo is None)[LAST]:
        return None  # this spoil does not apply to this parameter
    where = f"{optimizer}: {name} {spoil} on rank {LAST}"
    outcome = step(opt, m)
    in_step()
    outcomes = fm.allgather_object(outcome)
    if "returned" in outcomes:
        if any(o != "returned" for o in outcomes):
            return f"{where}: the ranks ended the step differently: {outcomes}"
    else:
        if len({o[0] for o in outcomes}) != 1:
            return f"{where}: the ranks raised different types: {outcomes}"
        for r, (_, text) in enumerate(outcomes):
            if f"rank {LAST}" not in text or name not in text:
                return f"{where}: rank {r}'s message names not rank {LAST} and {name}: {text}"
    if undo is not None:
        undo()
    again = fm.allgather_object(step(opt, m))
    if any(o != "returned" for o in again):
        return f"{where}: the next step, with the parameter put back, failed: {again}"
    in_step()
    return None


def case_a_gradient_one_rank_cannot_reduce_raises_on_every_rank():
    failures, tried = [], 0
    for optimizer in OPTIMIZERS:
        for spoil in SPOIL:
            for name in PARAMETERS:
                failure = one(optimizer, spoil, name)
                tried += 1
                if failure:
                    failures.append(failure)
    assert tried == len(OPTIMIZERS) * len(SPOIL) * len(PARAMETERS)
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    run_cases(globals())
