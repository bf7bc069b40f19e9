"""The wrapped optimizer's own step raising on one rank (a bad value in its param_groups),
after the gradient reduction: the others have applied theirs. Run by
tests/test_entry_points.py without mpiexec and at 2 and 3 ranks
(fluxmpi_py/training/_failed_step.py).

For the default path and ``deterministic=True``, at the first step (whose check of the
parameters follows on every rank) and at a later one: the last rank raises its own error, no
rank hangs, every rank's next step raises naming the last rank and its error and is applied on
no rank; after ``synchronize_`` of the model and the optimizer every rank steps again to the
same weights. In a world of one the next step just runs.

A closure (``step(closure)``) that raises on one rank, in its forward or in its backward
after some gradient hooks ran: every rank raises at that step (the others naming the rank and
the error), none applies it, and the next step runs.
"""

import torch
from harness import fm, run_cases

fm.Init()
W, RANK = fm.total_workers(), fm.local_rank()
LAST = W - 1


def make(deterministic):
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8)
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        named_parameters=m.named_parameters(),
        deterministic=deterministic,
    )
    return m, opt


def step(m, opt, i, spoil=False):
    opt.zero_grad()
    m(torch.full((2, 8), 0.1 * (RANK + 1) * (i + 1))).pow(2).sum().backward()
    if spoil:
        opt.param_groups[0]["lr"] = "bad"
    try:
        opt.step()
        return "returned"
    except Exception as e:  # noqa: BLE001 - the type and text are what the ranks compare
        return f"{type(e).__name__}: {e}"
    finally:
        opt.param_groups[0]["lr"] = 0.1


def weights(m):
    return [p.detach().clone() for p in m.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def one(deterministic, at):
    where = f"deterministic={deterministic}, the wrapped step raises at step {at}"
    m, opt = make(deterministic)
    for i in range(at):
        assert step(m, opt, i) == "returned", where
    seen = step(m, opt, at, spoil=RANK == LAST)
    if RANK == LAST and not seen.startswith("TypeError"):
        return f"{where}: rank {RANK} did not raise its own error: {seen}"
    before = weights(m)
    seen = step(m, opt, at + 1)
    if W > 1:
        told = f"rank {LAST}: its wrapped optimizer's step() raised at the previous step"
        if told not in seen or "TypeError" not in seen or "synchronize_" not in seen:
            return f"{where}: rank {RANK}'s next step did not raise naming rank {LAST}: {seen}"
        if not same(weights(m), before):
            return f"{where}: rank {RANK} applied the step that raised"
        fm.synchronize_(m)
        fm.synchronize_(opt)
        seen = step(m, opt, at + 2)
    if seen != "returned":
        return f"{where}: rank {RANK}'s step after it failed: {seen}"
    everyone = fm.allgather_object(weights(m))
    if not all(same(w, everyone[0]) for w in everyone):
        return f"{where}: the ranks' weights differ after synchronize_ and a step"
    return None


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise KeyError("boom in backward")


def closure_step(m, opt, i, fail=None):
    def closure():
        opt.zero_grad()
        h = m(torch.full((2, 8), 0.1 * (RANK + 1) * (i + 1)))
        if fail == "forward":
            raise KeyError("boom in forward")
        if fail == "backward":
            h = m(Boom.apply(h))  # m's hooks run, then Boom raises
        loss = h.pow(2).sum()
        loss.backward()
        return loss

    try:
        opt.step(closure)
        return "returned"
    except Exception as e:  # noqa: BLE001 - the type and text are what the ranks compare
        return f"{type(e).__name__}: {e}"


def case_a_closure_that_raises_on_one_rank_raises_on_every_rank():
    failures = []
    for where in ("forward", "backward"):
        m, opt = make(False)
        before = weights(m)
        seen = closure_step(m, opt, 0, where if RANK == LAST else None)
        if RANK == LAST:
            wrong = not seen.startswith(f"KeyError: 'boom in {where}")
        else:
            wrong = f"rank {LAST}: its closure raised KeyError: 'boom in {where}" not in seen
        if wrong:
            failures.append(f"{where}: rank {RANK} raised {seen}")
        if not same(weights(m), before):
            failures.append(f"{where}: rank {RANK} applied the step")
        seen = closure_step(m, opt, 1)
        if seen != "returned":
            failures.append(f"{where}: rank {RANK}'s next step: {seen}")
        everyone = fm.allgather_object(weights(m))
        if not all(same(w, everyone[0]) for w in everyone):
            failures.append(f"{where}: the ranks' weights differ after the next step")
    failures = [f for fs in fm.allgather_object(failures) for f in fs]
    assert not failures, "\n".join(failures)


def case_a_wrapped_step_that_raises_on_one_rank_raises_at_every_rank_s_next_step():
    failures = [one(d, at) for d in (False, True) for at in (0, 2)]
    failures = [f for fs in fm.allgather_object(failures) for f in fs if f]
    assert not failures, "\n".join(failures)


if __name__ == "__main__":
    run_cases(globals())
