"""FLUXMPI_SUM_ORDER: read at a process's first sum. A bad value on one rank raises the same
ValueError on every rank, naming that rank and the value; "gloo" takes gloo's order. Its own
process, so that no earlier sum has read the variable.

Run by tests/test_c10d.py at 1 and 3 ranks.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import raises, run_cases  # noqa: E402

import fluxmpi_py as fm  # noqa: E402
from fluxmpi_py._core import C  # noqa: E402


def case_bad_environment_value_raises_on_every_rank_then_gloo_takes_effect():
    n, r = fm.total_workers(), fm.local_rank()
    os.environ["FLUXMPI_SUM_ORDER"] = "ring" if r == n - 1 else "gloo"
    raises(ValueError, lambda: fm.allreduce_(torch.ones(2)), f"rank {n - 1}",
           "FLUXMPI_SUM_ORDER must be 'fastest' or 'gloo', got 'ring'")  # fmt: skip
    os.environ["FLUXMPI_SUM_ORDER"] = "gloo"
    before = C.gloo_order_calls()
    t = fm.allreduce_(torch.ones(2))
    assert t.tolist() == [float(n)] * 2, t
    assert fm.sum_order() == "gloo"
    assert C.gloo_order_calls() - before == (1 if n >= 3 else 0)


if __name__ == "__main__":
    run_cases(globals())
