"""``hvd.join()``: Horovod's joined ranks take part in the others' world ``hvd.allreduce``
(and its in-place, async and grouped forms, and every other world ``allreduce_`` of
fluxmpi_py) with zeros, and in their ``hvd.DistributedOptimizer`` steps.

A joined rank waits in the others' agreements, the one small allreduce every collective
starts with (``csrc/ops/consensus.h``), with a mark instead of a signature
(``csrc/ops/join.h``). While no rank has joined the mark is four int64 lanes more in that
allreduce, so a world ``hvd.allreduce`` costs what it cost without join support: measured
23 us against 20 us for ``allreduce_`` of a clone at 1 KiB, where the join round each
allreduce took before cost 69 us against 20 us with the round switched off; 1.55 ms against
1.87 ms at 1 MiB, before 1.73 ms against 1.53 ms (2 ranks on 2 shared cores,
``benchmarks/bench_hvd_join.py``, one launch each, before and after; docs/measurements.md).
Once a rank has joined, the active ranks' allreduce sends what it moves (dtypes, element
counts: one more 272-byte allreduce) and the joined ranks reduce zeros of that with them.
Averages divide by the world size (a joined rank counts as zeros). Other collectives issued
while a rank has joined raise on the active ranks (Horovod's semantics); the joined ranks keep
waiting. The last rank to join is the one that joined at the latest agreement (the highest on
a tie).
"""

from __future__ import annotations

from ..join import wait_for_all
from ._optimizer import JOIN

JOIN.shadows_allreduces = True


def join() -> int:
    """Wait as a joined rank until every rank has joined; return the last one to join."""
    return wait_for_all(JOIN, "hvd.join")
