"""A backward pass that raises on one rank (autograd's own error: a custom Function raises in
backward), which the library never sees; run by tests/test_entry_points.py without mpiexec
and at 2 and 3 ranks (fluxmpi_py/training/_abandoned_pass.py).

Generated, not listed: every optimizer (the default path with one bucket and with a bucket a
parameter, so that collectives are on their way when the pass raises, ``deterministic=True``
with either of its sums, and Horovod's face) times every way to run a step's passes (one pass;
``backward_passes_per_step=2``; two passes with the first inside ``no_sync()``) times the pass
that raises on the last rank (the first, the last) times what that rank does next (``drop``:
``zero_grad()`` and the next step; ``go on``: the step's other passes and ``step()``;
``next``: the next step's backward without ``zero_grad()``, after a last pass only;
``collective``: a collective of its own first, after a last pass only: ``fm.allreduce_``,
``hvd.allreduce`` with Horovod's face, a SyncBatchNorm's forward with a bucket a parameter). Every
rank other than the last must raise in ``step()``, naming the last rank; the last rank
raises backward's error, then ``step()``'s or warns with it; no rank applies the step; the
next step runs on every rank and leaves every rank the same weights. A pass that raises
before any gradient hook ran is invisible: that rank's retried step pairs with the others'.
An extra backward pass on one rank raises the reducer's own error in a hook ("the gradient of
parameter c.bias was produced twice", by its name): a pass that raised like the others.
"""

import contextlib
import itertools
import warnings

import torch
from harness import fm, run_cases

import fluxmpi_py.horovod as hvd
from fluxmpi_py.training import _exact_shards

fm.Init()
hvd.init()
W, RANK = fm.total_workers(), fm.local_rank()
LAST = W - 1
# (a world of one raises the error as it is, without the rank: as every noted error)
TOLD = f"rank {LAST}: its backward pass raised" if W > 1 else "its backward pass raised"


class BoomError(RuntimeError):
    """Backward's own error, on one rank."""


class Boom(torch.autograd.Function):
    failing = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if Boom.failing:
            raise BoomError("boom in backward")
        return g


class Net(torch.nn.Module):
    """Three layers; ``Boom`` after the first (the hooks of the later two have run when it
    raises) or, with ``first=True``, at the output (before any hook)."""

    def __init__(self, first=False):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = (torch.nn.Linear(16, 16) for _ in range(3))
        self.first = first

    def forward(self, x):
        h = self.c(self.b(Boom.apply(self.a(x))))
        return Boom.apply(h) if self.first else h


OPTIMIZERS = {
    "fm": {},
    "fm-bucket-a-parameter": {"bucket_cap_mb": 1e-4},
    "fm-deterministic": {"deterministic": True},
    "fm-deterministic-int64": {"deterministic": True},  # the int64 sums (uneven shares' path)
    "hvd": None,  # hvd.DistributedOptimizer
}
# name -> (backward_passes_per_step, passes a step, passes inside no_sync())
PASSES = {"one pass": (1, 1, 0), "2 passes a step": (2, 2, 0), "no_sync, then a pass": (1, 2, 1)}


def make(optimizer, passes, first=False):
    m = Net(first)
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    if OPTIMIZERS[optimizer] is None:
        face = hvd.DistributedOptimizer(
            sgd, named_parameters=m.named_parameters(), backward_passes_per_step=PASSES[passes][0]
        )
        return m, face
    _exact_shards.SHARDED = optimizer != "fm-deterministic-int64"
    try:
        opt = fm.DistributedOptimizer(
            sgd,
            named_parameters=m.named_parameters(),
            backward_passes_per_step=PASSES[passes][0],
            **OPTIMIZERS[optimizer],
        )
    finally:
        _exact_shards.SHARDED = True
    return m, opt


def batch(step, k):
    return torch.full((4, 16), 0.01 * (RANK + 1) * (step + 1) * (k + 1))


def run_pass(opt, m, step, k, passes, fail):
    Boom.failing = fail
    quiet = opt.no_sync() if k < PASSES[passes][2] else contextlib.nullcontext()
    try:
        with quiet:
            m(batch(step, k)).pow(2).sum().backward()
    finally:
        Boom.failing = False


def step_text(fn):
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - the type and text are what the ranks compare
        return f"{type(e).__name__}: {e}"


def weights(m):
    return [p.detach().clone() for p in m.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def in_step(face="fm"):
    """A collective on every rank: fm.allreduce_ (the hot call), hvd.allreduce with
    ``face="hvd"``, or with ``face="sbn"`` a SyncBatchNorm's forward (a public call through
    entry_point that calls the compiled core itself)."""
    x = torch.ones(2)
    if face == "sbn":
        bn = fm.SyncBatchNorm(2)
        y = bn(torch.full((3, 2), float(RANK)))
        mean = sum(range(W)) / W
        assert torch.allclose(bn.running_mean, torch.full((2,), 0.1 * mean)), bn.running_mean
        return y
    if face == "hvd":
        x = hvd.allreduce(x, op=hvd.Sum)
    else:
        fm.allreduce_(x)
    assert torch.equal(x, torch.full((2,), float(W))), x


def failed_step(opt, m, passes, fail_at, then, face="fm"):
    """Step 0, whose pass ``fail_at`` raises on the last rank; returns what this rank saw."""
    n = PASSES[passes][1]
    opt.zero_grad()
    for k in range(n):
        try:
            run_pass(opt, m, 0, k, passes, RANK == LAST and k == fail_at)
        except BoomError:
            if then == "drop":
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    opt.zero_grad()
                return "boom; zero_grad: " + "; ".join(str(w.message) for w in seen)
            if then == "next":
                return "boom"
            if then == "collective":  # a collective of its own first: the step goes first
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    in_step(face)
                return "boom; collective: " + "; ".join(str(w.message) for w in seen)
            for k2 in range(k + 1, n):  # go on: the step's other passes, then step()
                run_pass(opt, m, 0, k2, passes, False)
            return f"boom; step(): {step_text(opt.step)}"
    return f"step(): {step_text(opt.step)}"


def next_step(opt, m, passes, zero):
    """Step 1, on every rank; returns the warnings of the last rank's first backward."""
    if zero:
        opt.zero_grad()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for k in range(PASSES[passes][1]):
            run_pass(opt, m, 1, k, passes, False)
    opt.step()
    return "; ".join(str(w.message) for w in seen)


def one(optimizer, passes, fail_at, then):
    """Returns a failure's text, or None."""
    where = f"{optimizer}, {passes}: pass {fail_at} raises on rank {LAST}, then {then}"
    m, opt = make(optimizer, passes)
    before = weights(m)
    face = {"hvd": "hvd", "fm-bucket-a-parameter": "sbn"}.get(optimizer, "fm")
    seen = failed_step(opt, m, passes, fail_at, then, face)
    if then != "next" and (then != "collective" or RANK != LAST):
        in_step(face)  # ("next": the last rank's next call completes the step: no other first)
    if not same(weights(m), before):
        return f"{where}: rank {RANK} applied the step: {seen}"
    if RANK == LAST:
        if not seen.startswith("boom"):
            return f"{where}: rank {RANK} did not see backward's error: {seen}"
        if then != "next" and TOLD not in seen:
            return f"{where}: rank {RANK} was not told what the others were: {seen}"
    elif TOLD not in seen or "applied on no rank" not in seen:
        return f"{where}: rank {RANK}'s step() did not raise naming rank {LAST}: {seen}"
    warned = next_step(opt, m, passes, zero=not (then == "next" and RANK == LAST))
    if then == "next" and RANK == LAST and TOLD not in warned:
        return f"{where}: the next backward did not warn: {warned!r}"
    in_step()
    everyone = fm.allgather_object(weights(m))
    if not all(same(w, everyone[0]) for w in everyone):
        return f"{where}: the ranks' weights differ after the next step"
    if same(weights(m), before):
        return f"{where}: the next step was not applied"
    return None


def cases():
    for optimizer, passes in itertools.product(OPTIMIZERS, PASSES):
        if optimizer.startswith("fm-deterministic") and PASSES[passes][2]:
            continue  # the exact sums take no no_sync()
        n = PASSES[passes][1]
        for fail_at in sorted({0, n - 1}):
            for then in ("drop", "go on", "next", "collective"):
                if then not in ("next", "collective") or fail_at == n - 1:
                    yield optimizer, passes, fail_at, then


def case_a_backward_that_raises_on_one_rank_raises_at_every_rank_s_step():
    failures, tried = [], 0
    for args in cases():
        tried += 1
        failure = one(*args)
        if failure:
            failures.append(failure)
    assert tried >= 40, tried
    failures = fm.allgather_object(failures)
    assert not any(failures), "\n".join(f for fs in failures for f in fs)


def case_an_extra_backward_on_one_rank_names_the_parameter_and_raises_on_every_rank():
    # the reducer's own error in a hook ("produced twice"): a pass that raised like any other
    for optimizer in ("fm", "fm-bucket-a-parameter", "hvd"):
        m, opt = make(optimizer, "one pass")
        before = weights(m)
        opt.zero_grad()
        run_pass(opt, m, 0, 0, "one pass", False)
        if RANK == LAST:
            try:
                run_pass(opt, m, 0, 1, "one pass", False)
                raise AssertionError(f"{optimizer}: an extra backward pass did not raise")
            except RuntimeError as e:
                assert "produced twice" in str(e) and "parameter c." in str(e), e
        seen = step_text(opt.step)
        assert seen is not None and TOLD in seen, f"{optimizer}: rank {RANK}: {seen}"
        assert same(weights(m), before), f"{optimizer}: rank {RANK} applied the step"
        assert next_step(opt, m, "one pass", zero=True) == ""
        everyone = fm.allgather_object(weights(m))
        assert all(same(w, everyone[0]) for w in everyone), f"{optimizer}: weights differ"


def case_a_pass_that_raises_before_any_hook_loses_that_rank_s_batch_alone():
    # No hook ran: nothing tells; the rank's retried step pairs with the others' step.
    failures = []
    for optimizer, passes in itertools.product(OPTIMIZERS, ("one pass", "2 passes a step")):
        m, opt = make(optimizer, passes, first=True)
        opt.zero_grad()
        if RANK == LAST:
            try:
                run_pass(opt, m, 0, 0, passes, True)
            except BoomError:
                opt.zero_grad()
        for k in range(PASSES[passes][1]):
            run_pass(opt, m, 0, k, passes, False)
        opt.step()
        in_step()
        everyone = fm.allgather_object(weights(m))
        if not all(same(w, everyone[0]) for w in everyone):
            failures.append(f"{optimizer}, {passes}: the ranks' weights differ")
    assert not failures, failures


if __name__ == "__main__":
    run_cases(globals())
