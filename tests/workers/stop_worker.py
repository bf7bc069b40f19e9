"""The agreed stop at any world size (run by tests/test_stop.py): it rides on the agreements
the step already makes, and every rank learns it at the same one."""

import os
import signal
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402


def _steps(opt, model, n, ask):
    """n optimizer steps; the world agreements they took."""
    before = C.world_agreements()
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
        if ask:
            fm.stop_requested()
    return C.world_agreements() - before


def case_stop_rides_on_the_step_agreement():
    torch.manual_seed(0)
    model = fm.synchronize_(torch.nn.Linear(3, 2))
    opt = fm.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), check_every=0)
    try:
        without = _steps(opt, model, 4, ask=False)
        assert without == 4 or fm.total_workers() == 1, without  # one agreement per step
        assert _steps(opt, model, 4, ask=True) == without  # asking adds no collective
        assert not fm.stop_requested()
        last = fm.total_workers() - 1
        if fm.local_rank() == last:
            fm.request_stop()  # one rank alone
        alone = fm.total_workers() == 1
        assert alone or not fm.stop_requested()  # not agreed yet: no agreement since
        assert _steps(opt, model, 1, ask=True) == without // 4  # the step's own agreement
        assert fm.stop_requested()  # on every rank, after the same step
        at = torch.tensor([C.stop_agreed_at()], dtype=torch.int64)
        lo, hi = fm.allreduce_(at.clone(), op="min"), fm.allreduce_(at.clone(), op="max")
        assert lo.item() == hi.item() >= 0, (lo, hi)
    finally:
        C.clear_stop()
        C.arm_stop_signals(False)


def case_usr1_marks_a_stop_once_armed():
    try:
        fm.stop_requested()  # arms the handlers
        if fm.local_rank() == 0:
            os.kill(os.getpid(), signal.SIGUSR1)  # would end the process unarmed
            assert C.stop_requested_here()
        fm.barrier()
        assert fm.stop_requested()
    finally:
        C.clear_stop()
        C.arm_stop_signals(False)


if __name__ == "__main__":
    run_cases(globals())
