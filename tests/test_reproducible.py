"""The same bits at any world size (issue 34): DistributedOptimizer(deterministic=True) with
the global-batch data mode. One launch of 4 ranks trains at 4, 3, 1 and 2 (twice) ranks
(tests/workers/repro_worker.py); here a real world of one, trained in this process, must match
the 4 ranks' per-step digests and final state bit for bit."""

import json
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))
from mpi_util import WorkerCase, worker_params  # noqa: E402

import fluxmpi_py as fm  # noqa: E402

WORKER = "repro_worker.py"
TIMEOUT = 400


@pytest.fixture(scope="module")
def out_env(tmp_path_factory):
    # one env for every item: the 4-rank launch runs once for the module
    return {"REPRO_OUT": str(tmp_path_factory.mktemp("repro"))}


@pytest.mark.parametrize("case", worker_params(WORKER, [4], timeout=TIMEOUT, bundle=False))
def test_repro_multirank(case, out_env):
    case.check_passed(env=out_env)


def _one_thread(fn, *args):
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as on the ranks: a kernel's bits may depend on its threads
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


def test_world_of_one_matches_four_ranks(out_env):
    import repro_worker

    # the launch (shared with test_repro_multirank's items) writes the 4 ranks' results
    case = WorkerCase(WORKER, 4, "case_deterministic_is_the_same_at_any_world_size", TIMEOUT, False)
    case.check_passed(env=out_env)
    out = out_env["REPRO_OUT"]
    with open(os.path.join(out, "digests-np4.json")) as f:
        digests = json.load(f)
    finals = torch.load(os.path.join(out, "final-np4.pt"))
    fm.Init()
    for kind in ("cnn", "mlp"):
        mine, final = _one_thread(repro_worker.train, kind, True, None, 0, 1)
        theirs = digests[f"{kind} world of 4"]
        diff = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
        assert not diff, f"{kind}: 1 rank and 4 ranks differ from step {diff[0] + 1}"
        assert all(torch.equal(a, b) for a, b in zip(final, finals[f"{kind} world of 4"]))


def test_error_bound_against_a_float64_sum():
    # M micro-batches of one rank: the reduced mean is within q/2 (+ the final rounding) of
    # the exact mean, computed in float64 from the same float32 gradients.
    fm.Init()
    torch.manual_seed(0)
    model = torch.nn.Linear(50, 40)
    k = 7
    opt = fm.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        named_parameters=model.named_parameters(),
        deterministic=True,
        backward_passes_per_step=k,
        check_every=0,
    )
    for step in range(3):  # the grid adapts after the first step
        xs = [torch.randn(4, 50) * 10**step for _ in range(k)]
        refs = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
        for x in xs:  # the float32 gradient of each micro-batch, summed in float64
            grads = torch.autograd.grad(model(x).pow(2).mean(), list(model.parameters()))
            for (n, _), g in zip(model.named_parameters(), grads):
                refs[n] += g.double()
        grid = opt.exact_grid()
        for x in xs:
            model(x).pow(2).mean().backward()
        opt.synchronize()
        for n, p in model.named_parameters():
            exact = refs[n] / k
            q = grid[n][1]
            err = (p.grad.double() - exact).abs()
            ulp = torch.finfo(torch.float32).eps * exact.abs()  # half an ulp of float32, doubled
            bound = q / 2 + ulp + 2**-50 * exact.abs()
            assert bool((err <= bound).all()), (step, n, float((err - bound).max()), q)
            assert q == math.ldexp(1.0, grid[n][0] - (62 - (k - 1).bit_length()))
        with opt.skip_synchronize():
            opt.step()
        assert all(p.grad is None for p in model.parameters())
    assert opt.exact_grid()["weight"][0] < 16 + 16  # adapted from the first step's 2**16
